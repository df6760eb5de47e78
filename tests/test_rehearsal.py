"""The rehearsal's own pieces (sglpatch/rehearsal): the server's stand-ins, the CPU launch, the
table, and the fixes the real servers of 0.5.10 and 0.5.23 forced on the ROCm checks. The rehearsal
itself runs real servers and is CI's `nox -s rehearse -- 0.5.10 0.5.23`, not a test here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from sglpatch.rehearsal import gsm8k
from sglpatch.rehearsal.launch import cpu_launch
from sglpatch.rehearsal.runner import DID_NOT_RUN, NOT_ON_CPU, RAN, Line, Rehearsal, render

PROBES = REPO_ROOT / "sglpatch" / "witnesses" / "probes"
CHECKS = REPO_ROOT / "sglpatch" / "rocm" / "checks"


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, text=True, timeout=60)


def test_the_import_only_standin_satisfies_imports_and_refuses_every_call():
    code = """
import standins
assert standins.install_import_only("sglpatch_absent_kernels")
from sglpatch_absent_kernels.scalar_type import scalar_types
from sglpatch_absent_kernels import fused_op
constants = [scalar_types.uint4b8, scalar_types.uint8b128]  # read at import time in sglang
try:
    fused_op(1, 2)
except standins.StandinCalled as exc:
    print("refused:", exc)
else:
    raise SystemExit("the stand-in ran a call")
"""
    done = _python(code, {"PYTHONPATH": str(PROBES)})
    assert done.returncode == 0, done.stderr
    assert "refused: sglpatch stand-in: sglpatch_absent_kernels.fused_op was called" in done.stdout
    assert "sglpatch stand-in: sglpatch_absent_kernels.fused_op was called" in done.stderr  # lands in the server log


def test_the_server_site_installs_the_standins_only_when_asked_and_says_so():
    site = {"PYTHONPATH": str(PROBES / "server_site")}
    without = _python("import sgl_kernel", site)
    assert without.returncode != 0 and "No module named 'sgl_kernel'" in without.stderr
    asked = _python("import sgl_kernel, torchvision.transforms; print(sgl_kernel.__version__)",
                    {**site, "SGLPATCH_SERVER_STANDINS": "1"})
    assert asked.returncode == 0, asked.stderr
    assert "0.0.0+standin" in asked.stdout
    assert re.search(r"sglpatch stand-ins in this sglang process \(not sglang's own code\): "
                     r"sgl_kernel \(import-only\), torchvision \(catch-all\)", asked.stderr)


def test_every_server_process_loads_the_tree_through_the_content_keyed_bytecode_cache(tmp_path):
    # Each process of the server (and each check script) is a new interpreter: the second one
    # started on the same content compiles nothing, and the tree gets no __pycache__ of its own.
    tree = tmp_path / "tree" / "python"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("import inspect\n\ndef where():\n    return inspect.getsourcefile(where)\n")
    site = {"PYTHONPATH": os.pathsep.join([str(tree), str(PROBES / "server_site")]),
            "SGLPATCH_BYTECODE_CACHE": str(tmp_path / "pyc"), "SGLPATCH_BYTECODE_ROOTS": str(tree)}
    code = "import bytecode, pkg, json; print(json.dumps([dict(bytecode.ContentKeyedLoader.stats), pkg.where()]))"
    first, second = (_python(code, site) for _ in range(2))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    (first_stats, _), (second_stats, where) = json.loads(first.stdout), json.loads(second.stdout)
    assert first_stats["miss"] >= 1 and second_stats == {"hit": first_stats["miss"], "miss": 0}
    assert where == str(tree / "pkg" / "__init__.py")
    assert not list(tree.rglob("__pycache__")), "the tree got a __pycache__"
    unasked = _python("import sys, pkg; print('bytecode' in sys.modules)", {"PYTHONPATH": site["PYTHONPATH"]})
    assert unasked.returncode == 0 and unasked.stdout.strip() == "False", unasked.stderr


def test_the_cpu_launch_is_the_load_cells_launch_changed_only_where_a_cpu_cannot_follow():
    launch = cpu_launch("/tmp/tiny")
    argv = launch.argv
    assert argv[argv.index("--model-path") + 1] == "/tmp/tiny"
    assert argv[argv.index("--tp-size") + 1] == "1"
    assert argv[argv.index("--kv-cache-dtype") + 1] == "bf16"  # asked explicitly, read back by the load check
    assert "--enable-aiter-allreduce-fusion" in argv and "--disable-custom-all-reduce" in argv
    assert not [arg for arg in argv if arg.startswith("--speculative-")]
    assert argv[argv.index("--device") + 1] == "cpu" and argv[argv.index("--attention-backend") + 1] == "torch_native"
    assert launch.env == {"SGLANG_USE_CPU_ENGINE": "1"}
    assert "speculative_num_steps" in launch.not_asked
    said = " ".join(launch.changes)
    for change in ("--tp-size", "--kv-cache-dtype fp8_e4m3 -> bf16", "--speculative-num-steps", "SGLANG_USE_AITER=1 dropped"):
        assert change in said


def test_the_table_never_says_pass_and_a_check_that_did_not_run_fails_the_rehearsal():
    rehearsal = Rehearsal("0.5.23", lines=[
        Line("load", RAN, "asked {...}"),
        Line("spec", NOT_ON_CPU, "speculative decoding needs a CPU op no registry ships"),
    ])
    assert rehearsal.ok
    table = render(rehearsal)
    assert "could not run on CPU" in table and "speculative decoding" in table
    assert not re.search(r"\bpass(ed)?\b", table.lower())
    rehearsal.lines.append(Line("accuracy", DID_NOT_RUN, "exit 1, no figures", problems=["no figures"]))
    assert not rehearsal.ok
    assert "PROBLEM: no figures" in render(rehearsal)


def test_the_load_judges_part_that_cannot_fail_on_cpu_is_said_could_not_run_never_passed():
    """On CPU the fused metadata-copy kernel is never compiled (no speculative decoding, no HIP),
    so the job's "did not fail to compile" part cannot fail there: the rehearsal says so."""
    from sglpatch.matrix.cells import Cell
    from sglpatch.matrix.records import SKIPPED, CellRecord
    from sglpatch.matrix.rocm_judge import COMPILE_PART, judge_figures
    from sglpatch.rehearsal.runner import judged_on_cpu

    record = CellRecord("rocm", "load", "0.5.23", None, "", "", SKIPPED)
    judge_figures(Cell("rocm", "load", "0.5.23"), {"healthy_s": 12.0, "generate": "hi", "compile_failures": 0,
                                                   "flags_asked": {}, "flags_resolved": {}}, record)
    assert COMPILE_PART in [part.name for part in record.parts]  # the job's judge has the part
    shown, lines = judged_on_cpu(record.parts)
    assert COMPILE_PART not in shown and "server healthy: passed" in shown
    [line] = lines
    assert line.status == NOT_ON_CPU and line.check == f"load: {COMPILE_PART}"
    assert "never compiled on CPU" in line.detail
    table = render(Rehearsal("0.5.23", lines=[Line("load: one generate", RAN, f"the job's judge: {shown}"), line]))
    assert not re.search(rf"{re.escape(COMPILE_PART)}: passed", table)


def test_the_accuracy_check_hands_few_shot_gsm8k_a_bare_host_and_the_local_file(monkeypatch, tmp_path):
    """0.5.23's few_shot_gsm8k prefixes the scheme itself (a host of "http://..." became
    http://http://...), and without --data-path every release downloads GSM8K from GitHub."""
    monkeypatch.syspath_prepend(str(CHECKS))
    import accuracy_check
    import serve_check

    ran = []

    def fake_run(command, **kwargs):
        ran.append(command)
        return subprocess.CompletedProcess(command, 0, "Accuracy: 0.250\nInvalid: 0.500\n", "")

    monkeypatch.setattr(accuracy_check.subprocess, "run", fake_run)
    monkeypatch.setattr(accuracy_check, "server_accept_length", lambda: None)
    monkeypatch.setattr(serve_check, "URL", "http://127.0.0.1:40123")
    figures = accuracy_check.evaluate({"state": str(tmp_path), "questions": 4, "shots": 2, "data_path": "/data/gsm8k.jsonl"})
    command = ran[0]
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--port") + 1] == "40123"
    assert command[command.index("--data-path") + 1] == "/data/gsm8k.jsonl"
    assert figures["accuracy"] == 0.25 and figures["invalid"] == 0.5


def test_the_local_gsm8k_file_has_the_shape_few_shot_gsm8k_reads(tmp_path):
    path = gsm8k.write(tmp_path / "gsm8k.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) >= 6
    for row in rows:
        assert set(row) == {"question", "answer"}
        # few_shot_gsm8k's labels: the number after the last "####"
        assert re.fullmatch(r"-?\d+", row["answer"].split("####")[-1].strip())


FAKE_CLIENT = """\
import json, sys
with open(sys.argv[1], "a") as log:  # what the held server logs while the client runs
    log.write("Cache flushed successfully\\nPrefill batch, #new-token: 4, #cached-token: 6, x\\n")
out = sys.argv[sys.argv.index("--output-file") + 1]
port = sys.argv[sys.argv.index("--port") + 1]
with open(out, "a") as f:
    f.write(json.dumps({"request_rate": 1.0, "duration": 0.5, "ttfts": [0.1, 0.2], "itls": [[0.01], [0.01]],
                        "input_lens": [10, 10], "output_lens": [2, 2], "errors": ["", ""], "port": port}) + "\\n")
"""


def test_bench_run_measures_an_attached_server_without_starting_one(tmp_path, monkeypatch, capsys):
    """The rehearsal shares one server per pin: a variant that names a held server (a stand-in
    client here, writing the per-request shape bench_serving writes) is measured on its port and
    its log, and bench_run starts and stops nothing."""
    monkeypatch.syspath_prepend(str(CHECKS))
    import bench_run
    import serve_check

    def no_server(*args, **kwargs):
        raise AssertionError("an attached variant started a server")

    monkeypatch.setattr(serve_check, "Server", no_server)
    client = tmp_path / "client.py"
    client.write_text(FAKE_CLIENT)
    log = tmp_path / "server.log"
    log.write_text("Prefill batch, #new-token: 9, #cached-token: 0, before the run\n")
    config = {"out": str(tmp_path / "out"), "timeout": 1, "client": {"prefix": [sys.executable], "module": str(client)},
              "variants": [{"name": "as-shipped", "argv": ["--device", "cpu"], "env": {},
                            "attach": {"port": 40999, "log": str(log), "healthy_s": 12.5}}],
              "runs": [{"rate": 1.0, "args": [str(log)]}], "power_interval_s": 0.05}
    assert bench_run.main(config) == 0
    entry = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["variants"]["as-shipped"]
    assert entry["healthy_s"] == 12.5 and entry["server_log"] == str(log)
    run = entry["runs"][0]
    assert run["exit"] == 0 and "--port 40999" in run["command"]
    assert run["figures"]["ttft_p95_s"] is not None and run["figures"]["cache_hit_rate"] == 0.6


STANDIN_LAUNCH_SERVER = """\
# A stand-in for sglang.launch_server (test double): answers /health, and starts a child of its
# own as sglang starts its scheduler, so stopping must reach a whole process group.
import http.server, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(f"standin-child {child.pid}", flush=True)

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("hold_dies_first", [False, True], ids=["stopped", "hold-killed-first"])
def test_the_held_standin_server_is_stopped_with_every_process_it_started(tmp_path, hold_dies_first):
    """serve_check's serve mode holding a stand-in launch_server (no real sglang: the stopping is
    what is tested): stop() leaves none of its processes, also when the hold itself was killed
    first and sglang's group was orphaned."""
    from sglpatch.rehearsal.held_server import HeldServer

    package = tmp_path / "standin" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "launch_server.py").write_text(STANDIN_LAUNCH_SERVER)
    log = tmp_path / "server.log"
    server = HeldServer(Path(sys.executable), ["--model-path", "x"], {}, {"PATH": os.environ["PATH"],
                        "PYTHONPATH": str(tmp_path / "standin")}, log, timeout=60, on_line=lambda line: None)
    try:
        report = server.wait(120)
        assert report["serving"], report
        child = int(re.search(r"standin-child (\d+)", log.read_text()).group(1))
        launcher = os.getpgid(child)
        assert _alive(child) and launcher != os.getpgid(server.process.pid)
        if hold_dies_first:
            os.kill(server.process.pid, 9)
            server.process.wait(timeout=30)
            assert _alive(child)  # orphaned: out of the hold's process tree
    finally:
        server.stop()
    for _ in range(50):
        if not _alive(child) and not _alive(launcher):
            break
        time.sleep(0.1)
    assert not _alive(child) and not _alive(launcher)
