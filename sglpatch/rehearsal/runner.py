"""A dress rehearsal of the ROCm job's in-image checks against the pin's real sglang server on CPU.

For one pin: the patched tree ``apply`` makes, the pin's server Python (``server_env``), a tiny
Llama checkpoint and a GSM8K-format file written here, one server (``held_server``: serve_check's
serve mode with the load cell's launch as a CPU can run it, ``launch``), and against it the job's
own check scripts (``sglpatch/rocm/checks``), unchanged, called with the configs the job gives them
and their output parsed and judged by the job's own functions:

- load: ``serve_check.py`` load mode -> ``rocm_judge.judge_figures`` (generate, flags read back
  from /server_info, the log scanners' shape-mismatch and compile-failure counts);
- bench: ``bench_run.py`` for both workloads at tiny sizes, attached to the held server ->
  ``bench.collect.collect`` (per-request p95, achieved RPS, cache hit rate, knee; power);
- accuracy: ``accuracy_check.py`` attach mode on the local file -> ``bench.accuracy.judge``;
- scanners: ``bench.scan`` and ``serve_check.log_findings`` on the real server log.

Every line of the table says whether it ran for real or could not run on CPU and why; a line that
ran against a server that imported stand-ins says so. Nothing here writes a matrix or bench record:
a rehearsal is never a verdict on a pin. Its own failures are the checks' plumbing: a check that did
not run, printed nothing parseable, or read a field the real server does not have.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.apply.pin_under_test import prepare_pin
from sglpatch.bench import accuracy, scan
from sglpatch.bench.client import bench_client
from sglpatch.bench.collect import collect
from sglpatch.bench.records import BenchRecord
from sglpatch.bench.workloads import Serving, SingleStream
from sglpatch.matrix.cells import Cell
from sglpatch.matrix.records import FAILED, SKIPPED, CellRecord, last_json
from sglpatch.matrix.rocm_judge import COMPILE_PART, judge_figures
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.project import Project
from sglpatch.rehearsal import gsm8k
from sglpatch.rehearsal.held_server import CHECKS, HeldServer
from sglpatch.rehearsal.launch import cpu_launch
from sglpatch.rehearsal.server_env import server_python
from sglpatch.rocm.checks import serve_check
from sglpatch.rocm.profiles import PROFILES
from sglpatch.serving.profile import load_profile
from sglpatch.witnesses import probe_children

PROBES = Path(__file__).parent.parent / "witnesses" / "probes"
SERVER_SITE = PROBES / "server_site"


def _probe_module(name: str):
    """A module of the probes folder (they import nothing of sglpatch), loaded by path."""
    spec = importlib.util.spec_from_file_location(f"sglpatch_probe_{name}", PROBES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


server_standins = _probe_module("server_standins")

SERVER_TIMEOUT_S = 600
CHECK_TIMEOUT_S = 900
# The workloads at tiny sizes: the same generated-shared-prefix and random-ids datasets, flags and
# per-request output as on the node; two request rates, no upward extension.
SERVING = Serving(system_prompt_len=48, question_len=32, output_len=8, prompts_per_group=4,
                  seconds_per_rate=1.0, min_requests=8, rates=(2.0, 4.0), extend_max=0)
SINGLE_STREAM = SingleStream(input_len=64, output_len=16, requests=3)
GSM8K_QUESTIONS, GSM8K_SHOTS = 4, 2
HIT_RATE_TOLERANCE = 0.1

RAN, NOT_ON_CPU, DID_NOT_RUN = "ran for real", "could not run on CPU", "did not run"
# The job's judgements that cannot fail on CPU, and why: each is said "could not run on CPU" with
# what the judge found, never "passed".
CANNOT_FAIL_ON_CPU = {
    COMPILE_PART: "the fused metadata-copy kernel is never compiled on CPU: it is the multi-step draft path's "
                  "(no speculative decoding here) and a HIP build's (no ROCm toolchain in the server), so no "
                  "failed compile can appear in the log",
}


@dataclass
class Line:
    check: str
    status: str  # RAN, NOT_ON_CPU or DID_NOT_RUN
    detail: str
    seconds: float | None = None
    problems: list[str] = field(default_factory=list)  # the checks' plumbing that failed here


@dataclass
class Rehearsal:
    pin: str
    lines: list[Line] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    standins: list[str] = field(default_factory=list)
    launch_changes: list[str] = field(default_factory=list)
    folder: Path | None = None

    @property
    def ok(self) -> bool:
        return bool(self.lines) and not any(line.problems or line.status == DID_NOT_RUN for line in self.lines)


def _timed(rehearsal: Rehearsal, name: str):
    class _Timer:
        def __enter__(self):
            self.started = time.monotonic()

        def __exit__(self, *exc):
            rehearsal.timings[name] = round(time.monotonic() - self.started, 1)

    return _Timer()


def child_env(tree: Path, home: Path, bytecode_cache: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The declared environment of the server and the check scripts: the patched tree's package and
    the server's stand-ins importable, no hub, caches under the rehearsal's folder. The tree and the
    environment's packages load through the probes' content-keyed bytecode cache, as in the
    witnesses' probes: the server environment is installed without bytecode, and each rehearsal's
    home is new in a fresh checkout, so every start compiled torch and sglang from source (the
    first of its processes 33 s before its first log line)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "PYTHONPATH": os.pathsep.join([str(tree / "python"), str(SERVER_SITE)]),
        "PYTHONPYCACHEPREFIX": str(home / "pycache"),  # the patched tree stays as apply left it
        "SGLPATCH_BYTECODE_CACHE": str(bytecode_cache),
        "SGLPATCH_BYTECODE_ROOTS": str(tree / "python"),
        server_standins.ENV: "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        **(extra or {}),
    }


def _run_check(python: Path, script: str, config: dict, env: dict, log: Path, cwd: Path) -> tuple[dict | None, str, int | None]:
    """One check script as the job runs it (``python3 CHECKS/script CONFIG_JSON``): its last JSON
    line, its output, its exit status (None: timed out, killed with its process group)."""
    process = subprocess.Popen([str(python), str(CHECKS / script), json.dumps(config)], env=env, cwd=cwd,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=CHECK_TIMEOUT_S)
        code = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        code = None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    log.write_text(output)
    return last_json(output), output, code


def rehearse(project: Project, version: str, on_log=print) -> Rehearsal:
    rehearsal = Rehearsal(version)
    folder = project.build_dir / "rehearsal" / version
    rehearsal.folder = folder
    for name in ("state", "logs", "bench", "home"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    with _timed(rehearsal, "apply"):
        put = prepare_pin(project, version)
    with _timed(rehearsal, "server_env"):
        python = server_python(put.pin)
    env = child_env(put.tree_path, folder / "home", probe_children.bytecode_cache_dir(python))
    checkpoint = folder / "checkpoint"
    with _timed(rehearsal, "checkpoint"):
        done = subprocess.run([str(python), str(Path(__file__).parent / "llama_checkpoint.py"), str(checkpoint)],
                              env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SglpatchError(f"the rehearsal's checkpoint was not written: {done.stderr.strip()[-600:]}")
    data_path = gsm8k.write(folder / "state" / "gsm8k-local.jsonl")
    launch = cpu_launch(str(checkpoint))
    rehearsal.launch_changes = launch.changes
    on_log(f"# {version}: the load cell's launch on CPU: {' '.join(launch.argv)}")
    log = folder / "logs" / "server.log"
    server_lines = (folder / "logs" / "serve-mode.log").open("w")

    def server_line(line: str) -> None:
        server_lines.write(line + "\n")
        server_lines.flush()

    server = None
    try:
        with _timed(rehearsal, "server_start"):
            server = HeldServer(python, launch.argv, launch.env, env, log, timeout=SERVER_TIMEOUT_S, on_line=server_line)
            report = server.wait(SERVER_TIMEOUT_S + serve_check.GPU_PROBE_TIMEOUT_S + 60)
        on_log(f"# {version}: server report: {json.dumps({k: report.get(k) for k in ('serving', 'healthy_s', 'gpu', 'error')})}")
        if not report.get("serving"):
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            rehearsal.lines.append(Line("server (serve_check.py serve mode)", DID_NOT_RUN,
                                        f"{report.get('error')}; log tail: {tail}", rehearsal.timings["server_start"],
                                        ["the real server did not become healthy on CPU"]))
            return rehearsal
        rehearsal.lines.append(Line("server (serve_check.py serve mode)", RAN,
                                    f"healthy after {report['healthy_s']} s; gpu: {report.get('gpu')!r}",
                                    rehearsal.timings["server_start"]))
        server_info = {"url": server.url, "argv": launch.argv,
                       "server": {key: report.get(key) for key in ("healthy_s", "gpu", "log")}}
        _load(rehearsal, python, env, folder, server_info, launch, on_log)
        _bench(rehearsal, project, put, python, env, folder, server, report, launch, on_log)
        _accuracy(rehearsal, python, env, folder, server_info, data_path, on_log)
    finally:
        if server is not None:
            with _timed(rehearsal, "server_stop"):
                server.stop()
        server_lines.close()
    _scanners(rehearsal, log)
    _not_on_cpu(rehearsal, launch)
    _standins(rehearsal, log)
    (folder / "rehearsal.json").write_text(json.dumps(dataclasses.asdict(rehearsal), indent=1, default=str) + "\n")
    return rehearsal


def _load(rehearsal, python, env, folder, server_info, launch, on_log) -> None:
    started = time.monotonic()
    figures, output, code = _run_check(python, "serve_check.py", {"mode": "load", **server_info}, env,
                                       folder / "logs" / "load.log", folder / "state")
    seconds = round(time.monotonic() - started, 1)
    rehearsal.timings["load"] = seconds
    if figures is None:
        rehearsal.lines.append(Line("load: serve_check.py load", DID_NOT_RUN, f"exit {code}, no figures: {output[-400:]}",
                                    seconds, ["the load check printed no figures"]))
        return
    record = CellRecord("rocm", "load", rehearsal.pin, None, "", "", SKIPPED)
    judge_figures(Cell("rocm", "load", rehearsal.pin), dict(figures), record, synthetic=False)
    problems = [f"{part.name}: {part.detail}" for part in record.parts if part.outcome == FAILED]
    asked, resolved = figures.get("flags_asked") or {}, figures.get("flags_resolved") or {}
    if figures.get("log_error"):
        problems.append(figures["log_error"])
    missing = sorted(set(asked) - set(resolved))
    if missing:
        problems.append(f"/server_info does not report {', '.join(missing)}")
    parts, not_on_cpu = judged_on_cpu(record.parts)
    rehearsal.lines.append(Line("load: one generate, flags read back from /server_info", RAN,
                                f"asked {asked}, /server_info says {resolved}; generate {figures.get('generate')!r:.40}; "
                                f"the job's judge: {parts}", seconds, problems))
    rehearsal.lines += not_on_cpu
    # A checked flag the CPU launch cannot ask for is still looked up where the check looks, with
    # the check's own lookup: a field renamed or gone from /server_info would show here.
    fields = serve_check.find_fields(_server_info(server_info["url"]), set(serve_check.CHECKED_FLAGS.values()))
    for flag, why in launch.not_asked.items():
        found = f"/server_info has {flag} (= {fields[flag]!r})" if flag in fields else f"/server_info has no {flag}"
        rehearsal.lines.append(Line(f"load: {flag} asked and read back", NOT_ON_CPU, f"{why}; {found}", None,
                                    [] if flag in fields else [f"/server_info does not report {flag}"]))


def judged_on_cpu(parts) -> tuple[str, list[Line]]:
    """The job's judgement of a CPU run: the parts that can fail here, as the judge said them, and
    a "could not run on CPU" line for each part that cannot (``CANNOT_FAIL_ON_CPU``)."""
    shown = "; ".join(f"{part.name}: {part.outcome}" for part in parts if part.name not in CANNOT_FAIL_ON_CPU)
    lines = [Line(f"load: {part.name}", NOT_ON_CPU, f"{CANNOT_FAIL_ON_CPU[part.name]} (the job's judge read the log: "
                                                     f"{part.detail or part.outcome})")
             for part in parts if part.name in CANNOT_FAIL_ON_CPU]
    return shown, lines


def _server_info(url: str) -> dict:
    for path in ("/server_info", "/get_server_info"):  # as serve_check.resolved_flags asks
        try:
            with urllib.request.urlopen(f"{url}{path}", timeout=60) as response:
                return json.loads(response.read())
        except (OSError, ValueError):
            continue
    return {}


def _bench(rehearsal, project, put, python, env, folder, server, report, launch, on_log) -> None:
    client = bench_client(put.tree_path)
    for name, plan in (("serving", SERVING), ("single-stream", SINGLE_STREAM)):
        profile = load_profile(PROFILES[name])
        listed, extend = plan.runs(client)
        out = folder / "bench" / name
        config = {
            "out": str(out), "timeout": SERVER_TIMEOUT_S, "run_timeout": CHECK_TIMEOUT_S, "power_interval_s": 1.0,
            "ttft_p95_s": getattr(plan, "ttft_p95_s", 5.0),
            # The job's client is `python3 -m MODULE` in the image; here the pin's server Python.
            "client": {"prefix": [str(python), "-m"], "module": client.module},
            "variants": [{"name": "as-shipped", "argv": launch.argv, "env": launch.env,
                          "attach": {"port": server.port, "log": str(server.log), "healthy_s": report.get("healthy_s")}}],
            "runs": listed, "extend": extend,
        }
        started = time.monotonic()
        measured, output, code = _run_check(python, "bench_run.py", config, env, folder / "logs" / f"bench-{name}.log",
                                            folder / "state")
        seconds = round(time.monotonic() - started, 1)
        rehearsal.timings[f"bench {name}"] = seconds
        check = f"bench {name}: bench_run.py, {client.module}"
        if measured is None:
            rehearsal.lines.append(Line(check, DID_NOT_RUN, f"exit {code}, no figures: {output[-400:]}", seconds,
                                        ["bench_run printed no figures"]))
            continue
        template = BenchRecord(workload=name, pin=rehearsal.pin, variant="as-shipped", series_version="", series_hash="",
                               profile=profile.name, profile_version=profile.version, quantization="none (rehearsal)")
        record = collect(template, "as-shipped", measured["variants"]["as-shipped"], ttft_p95_s=config["ttft_p95_s"])
        problems = [f"{part.name}: {part.detail}" for part in record.parts if part.outcome == FAILED]
        figures = [run.get("figures") or {} for run in record.runs]
        for run, figure in zip(record.runs, figures):
            for key in ("ttft_p95_s", "achieved_rps", "output_tok_s"):
                if figure.get(key) is None:
                    problems.append(f"rate {run.get('rate')}: no {key} from the client's per-request output")
            # Our percentiles against the client's own summary of the same requests: the median on
            # every pin, p95 where the client has it (0.5.14 on).
            for ours, theirs in (("ttft_p50_s", "client_median_ttft_ms"), ("ttft_p95_s", "client_p95_ttft_ms")):
                if figure.get(ours) is not None and figure.get(theirs) is not None:
                    if abs(figure[ours] * 1000 - figure[theirs]) > 1e-3:
                        problems.append(f"rate {run.get('rate')}: {ours} {figure[ours] * 1000:.3f} ms, the client's "
                                        f"{theirs} {figure[theirs]:.3f} ms")
            if name == "serving":
                # The dataset's shared prefix makes the rate known in advance: our computation from
                # the client's (or the server log's) cached tokens must find it.
                hit, expected = figure.get("cache_hit_rate"), plan.expected_hit_rate()
                if hit is None or abs(hit - expected) > HIT_RATE_TOLERANCE:
                    problems.append(f"rate {run.get('rate')}: prefix-cache hit rate {hit}, the dataset makes {expected:.2f}")
        wanted_runs = len(listed)
        if len(record.runs) != wanted_runs:
            problems.append(f"{len(record.runs)} runs, {wanted_runs} asked")
        shown = "; ".join(
            f"rate {run.get('rate')}: {f.get('completed')}/{f.get('requests')} ok, p95 TTFT {_s(f.get('ttft_p95_s'))}, "
            f"achieved {_n(f.get('achieved_rps'))} RPS, {_n(f.get('output_tok_s'))} tok/s"
            + (f", cache hit {_n(f.get('cache_hit_rate'))} ({f.get('cache_hit_source', '')[:28]})" if name == "serving" else "")
            for run, f in zip(record.runs, figures))
        agreed = [key for key in ("client_median_ttft_ms", "client_p95_ttft_ms") if all(f.get(key) is not None for f in figures)]
        shown += f"; our TTFT percentiles checked against the client's own {' and '.join(agreed)}" if agreed else ""
        rehearsal.lines.append(Line(check, RAN, shown + f"; knee at {_n(record.knee_achieved_rps)} achieved RPS"
                                    if name == "serving" else shown, seconds, problems))
        powers = [(run.get("power") or {}) for run in record.runs]
        why = next((p.get("error") for p in powers if p.get("error")), "no GPU")
        rehearsal.lines.append(Line(f"power during bench {name} (power.py)", NOT_ON_CPU,
                                    f"the sampler ran and found no source: {why}"[:300]))


def _accuracy(rehearsal, python, env, folder, server_info, data_path, on_log) -> None:
    config = {"mode": "attach", **server_info, "state": str(folder / "state"), "questions": GSM8K_QUESTIONS,
              "shots": GSM8K_SHOTS, "data_path": str(data_path), "eval_timeout": CHECK_TIMEOUT_S}
    started = time.monotonic()
    figures, output, code = _run_check(python, "accuracy_check.py", config, env, folder / "logs" / "accuracy.log",
                                       folder / "state")
    seconds = round(time.monotonic() - started, 1)
    rehearsal.timings["accuracy"] = seconds
    check = "accuracy: accuracy_check.py, few_shot_gsm8k"
    if figures is None:
        rehearsal.lines.append(Line(check, DID_NOT_RUN, f"exit {code}, no figures: {output[-400:]}", seconds,
                                    ["accuracy_check printed no figures"]))
        return
    problems = [f"{part.name}: {part.detail}" for part in accuracy.judge(figures)[:1] if part.outcome == FAILED]
    if figures.get("accuracy") is None:
        problems.append(f"no score computed (few_shot_gsm8k exit {figures.get('exit')}): {figures.get('error', '')}")
    if "--data-path" not in (figures.get("command") or ""):
        problems.append("the GSM8K file was not handed to few_shot_gsm8k")
    rehearsal.lines.append(Line(check, RAN, f"{GSM8K_QUESTIONS} questions, {GSM8K_SHOTS}-shot from {data_path.name} "
                                f"(written here): score {figures.get('accuracy')} computed, invalid {figures.get('invalid')}; "
                                f"the floor ({accuracy.GSM8K_FLOOR}) is not judged on a random checkpoint",
                                seconds, problems))
    rehearsal.lines.append(Line("accuracy: accept length (avg_spec_accept_length)", NOT_ON_CPU,
                                f"no speculative decoding on CPU (/server_info's internal_states read: "
                                f"{figures.get('accept_length')}); judged only on the node"))


def _scanners(rehearsal, log: Path) -> None:
    text = log.read_text(errors="replace") if log.exists() else ""
    if not text:
        rehearsal.lines.append(Line("scanners on the server log", DID_NOT_RUN, f"no server log at {log}", None,
                                    ["no server log"]))
        return
    findings, bench_findings = serve_check.log_findings(text), scan.scan(text)
    problems = []
    # The fusion warning is patch 0003's; where the log has it, both scanners must find it.
    raw = len(re.findall(r"--enable-aiter-allreduce-fusion has no effect", text))
    if raw and not (findings["flag_findings"] and bench_findings["inert_fusion"]):
        problems.append(f"the log says the fusion has no effect {raw}x, the scanners found "
                        f"{findings['flag_findings']} / {bench_findings['inert_fusion']}")
    rehearsal.lines.append(Line("scanners on the real server log (serve_check.log_findings, bench.scan)", RAN,
                                f"{len(text.splitlines())} lines: shape mismatches {len(findings['mismatch_lines'])}, "
                                f"fused metadata-copy compile failures {findings['compile_failures']} (none can occur "
                                "on CPU: the kernel is never compiled here), "
                                f"inert fusion {bench_findings['inert_fusion'] or 'none'}, untuned MoE shapes "
                                f"{len(bench_findings['untuned_moe_shapes'])} (no aiter MoE on CPU)", None, problems))


def _not_on_cpu(rehearsal, launch) -> None:
    rehearsal.lines += [
        Line("build: build_check.py", NOT_ON_CPU, "JIT-compiles the touched HIP kernels with the image's ROCm "
             "toolchain (its CPU counterpart is the matrix's build(cpu, PIN) cell)"),
        Line("spec(rocm, PIN, D): serve_check.py spec, greedy, speed", NOT_ON_CPU,
             launch.not_asked.get("speculative_num_steps", "speculative decoding")),
        Line("tune-moe: tune_moe.py", NOT_ON_CPU, "aiter's MoE tuner runs GPU kernels"),
    ]


def _standins(rehearsal, log: Path) -> None:
    text = log.read_text(errors="replace") if log.exists() else ""
    stood = sorted({line.split(server_standins.STANDIN_LINE, 1)[1].rsplit("(pid", 1)[0].strip()
                    for line in text.splitlines() if server_standins.STANDIN_LINE in line})
    called = sorted({line.strip() for line in text.splitlines() if line.startswith(server_standins.CALLED)})
    rehearsal.standins = stood
    for line in rehearsal.lines:
        if line.status == RAN and stood:
            line.detail += f" [leaned on stand-ins: {'; '.join(stood)}]"
    if called:
        rehearsal.lines.append(Line("stand-ins", DID_NOT_RUN, "; ".join(called)[:400], None,
                                    ["the server called an import-only stand-in"]))


def _s(value) -> str:
    return "-" if value is None else f"{value:.3f} s"


def _n(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def render(rehearsal: Rehearsal) -> str:
    rows = [f"# rehearsal of the ROCm job's checks on sglang {rehearsal.pin} (real server, CPU)",
            "| check | rehearsal | seconds | what ran, or why not |", "|---|---|---|---|"]
    for line in rehearsal.lines:
        status = line.status + (" - PROBLEM: " + "; ".join(line.problems) if line.problems else "")
        seconds = "" if line.seconds is None else f"{line.seconds:g}"
        rows.append(f"| {line.check} | {status} | {seconds} | {line.detail.replace('|', '/')} |")
    rows.append("")
    rows.append("timings (s): " + ", ".join(f"{k} {v:g}" for k, v in rehearsal.timings.items()))
    rows.append("stand-ins the server leaned on: " + ("; ".join(rehearsal.standins) or "none"))
    rows.append("launch changed for CPU: " + " | ".join(rehearsal.launch_changes))
    rows.append("not a verdict on the pin: no matrix or bench record is written; "
                + ("every check that can run on CPU ran" if rehearsal.ok else "SOME CHECKS' PLUMBING FAILED (see PROBLEM)"))
    return "\n".join(rows)
