"""The three checks of the CPU tier, on the real code of the patched pin: build, load and spec.

Each takes the pin under test and the cell's record, appends its parts (and figures) to the record
and returns the log lines worth keeping.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
import time
from pathlib import Path

from sglpatch.apply.pin_under_test import PinUnderTest, checkout
from sglpatch.matrix.cells import DEPTHS, PROFILE, depth_argv, depth_flags
from sglpatch.matrix.kernels import kernel_parts, kernel_sources, multi_step_kernel_threshold, witness_part
from sglpatch.matrix.records import FAILED, PASSED, SKIPPED, CellRecord, Part
from sglpatch.plumbing import cache
from sglpatch.plumbing.errors import SglpatchError, Unavailable
from sglpatch.plumbing.gitcmd import git_out
from sglpatch.serving.profile import Profile, load_profile
from sglpatch.sources.pins import Pin
from sglpatch.witnesses import answer_cache, mtp_exclude, rocm_flags
from sglpatch.witnesses import cpu_envs, probe_children, probe_runs
from sglpatch.witnesses.results import CLEAN


# Bump when what a CPU cell checks changes in a way the hashed sources below do not show.
CPU_TIER_VERSION = "1"
# The checking code, from the package root.
_CHECKING_CODE = ("matrix/cells.py", "apply/pin_under_test.py", "matrix/kernels.py", "matrix/cpu.py", "matrix/cpu_checks.py")


def code_digest() -> str:
    """What checks a CPU cell: the matrix modules that run it, the child-side probes and the
    witnesses. A change re-runs the cells."""
    digest = hashlib.sha256(CPU_TIER_VERSION.encode())
    here = Path(__file__).parent
    paths = [here.parent / name for name in _CHECKING_CODE]
    if probe_children.PROBES.is_dir():
        paths += sorted(probe_children.PROBES.rglob("*.py"))
    for name in ("mtp_exclude.py", "rocm_flags.py", "probing.py", "rocm_guard.py", "guard_kernel.py", "hip_toolchain.py"):
        paths.append(here.parent / "witnesses" / name)
    for path in paths:
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cpu_python(pin: Pin):
    """The CPU Python of the pin (shared torch venv + the pin's own pinned dependencies)."""
    try:
        return probe_runs.cpu_python(pin)
    except cpu_envs.EnvUnavailable as exc:
        raise Unavailable(f"no CPU Python for {pin.version}: {exc}") from None


# -- one child per pin -------------------------------------------------------------------------

GLM_CHECKPOINT, MTP_CHECKPOINT, FLAGS_SPEC, IMPORT_SMOKE = "glm-checkpoint", "mtp-checkpoint", "flags-spec", "import-smoke"


def pin_probes(put: PinUnderTest, commit: str | None = None) -> dict:
    """The CPU tier's probes of the patched pin, all in one child that imports its sglang once (on
    the witnesses' emulated MI355X box): the synthetic GlmMoeDsa checkpoint written and resolved
    by the MTP probe, the profile at every depth resolved by the flags probe, and the import smoke.
    ``{"answers": {name: answer}, "failures": {name: why}, "runner": {...}}``, kept in the cache
    by the patched tree, the checking code and the CPU environment, so the build, load and spec
    cells of a pin (separate processes) share one run. ``commit``: another commit of the pin's
    tree repository to probe instead of the patched one (the pristine, to see the bug)."""
    commit = commit or put.patched_commit
    tree_hash = put.patched_tree if commit == put.patched_commit else git_out(["rev-parse", f"{commit}^{{tree}}"], put.tree_path)
    key = _probes_key(put, tree_hash)
    with PIN_PROBES.lock(key):
        here = key in _PROBED_HERE
        reuse = cpu_envs.env_built(put.pin) and (here or not answer_cache.rerunning())
        found = PIN_PROBES.get(key) if reuse else None
        if found is not None:
            if not here:
                answer_cache.note_replay(f"the CPU tier's probes of {put.pin.version}: kept {found.get('stored', '?')} "
                                         f"({PIN_PROBES.kind}/{key})")
            return found
        python = cpu_python(put.pin)  # Unavailable when the CPU Python cannot be had here
        profile = load_profile(PROFILE)
        with tempfile.TemporaryDirectory(prefix="sglpatch-matrix-probes-") as work:
            folder = Path(work) / "glm5-synthetic"
            requests = [
                probe_runs.ProbeRequest(GLM_CHECKPOINT, "glm_checkpoint", {"folder": str(folder)}, 120),
                mtp_exclude.probe_request(put.pin, {"checkpoint": folder}),
                rocm_flags.probe_request(profile, spec_scenarios(profile), Path(work)),
                probe_runs.ProbeRequest(IMPORT_SMOKE, "import_smoke", {"modules": import_smoke_modules(put)}, 300),
            ]
            environment = requests[1].environment()
            requests = [dataclasses.replace(r, import_env=environment[0], arch=environment[1]) for r in requests]
            names = {mtp_exclude.PROBE: MTP_CHECKPOINT, rocm_flags.PROBE: FLAGS_SPEC}
            requests = [dataclasses.replace(r, name=names.get(r.name, r.name)) for r in requests]
            run = python.run_probes(checkout(put, commit), requests)
        found = json.loads(json.dumps({
            "answers": run.answers, "runner": run.runner,
            "failures": {r.name: run.failure(r.name) for r in requests if run.failure(r.name)},
            "transient": [r.name for r in requests if run.failure(r.name) and run.transient(r.name)],
        }, default=str))
        if not found["failures"]:
            kept = _probes_key(put, tree_hash)  # the environment is built now
            PIN_PROBES.put(kept, {**found, "stored": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())})
            _PROBED_HERE.add(kept)
    return found


PIN_PROBES = cache.Memo("matrix-cpu-probes")
_PROBED_HERE: set[str] = set()  # read back in this process: no replay


def _probes_key(put: PinUnderTest, tree_hash: str) -> str:
    key = hashlib.sha256(f"{put.pin.version}\0{tree_hash}\0{code_digest()}\0{cpu_envs.env_fingerprint(put.pin)}\0"
                         f"{load_profile(PROFILE).content_digest()}".encode())
    return f"{put.pin.version}-{key.hexdigest()[:24]}"


def _answer(put: PinUnderTest, name: str, commit: str | None = None) -> tuple[dict | None, str]:
    """One probe's answer from the pin's run, or (None, why there is none); a reason that is no
    verdict on the tree (no CPU Python, a hung or killed child, a probe past its limit) starts
    with "unavailable: " and becomes a skipped part, never a failed one."""
    try:
        found = pin_probes(put, commit)
    except Unavailable as exc:
        return None, f"unavailable: {exc}"
    failure = found["failures"].get(name)
    if failure:
        return None, f"unavailable: {failure}" if name in found.get("transient", []) else failure
    return found["answers"].get(name), ""


# -- build ------------------------------------------------------------------------------------------


def build_cell(put: PinUnderTest, record: CellRecord) -> list[str]:
    kernels = put.touched_kernels
    record.figures["kernels"] = [Path(k).name for k in kernels]
    record.parts += kernel_parts(put, kernels, pristine_too=False)
    smoke, log = import_smoke(put)
    record.parts.append(smoke)
    return log


def import_smoke_modules(put: PinUnderTest) -> list[str]:
    """The modules the import smoke loads: the server's arguments, the GLM and MTP models, every
    Python module the applied patches change, and every module that loads a kernel they touch."""
    package = put.tree_path / "python"
    modules = ["sglang", "sglang.srt.server_args", "sglang.srt.models.glm4_moe", "sglang.srt.models.deepseek_nextn"]
    paths = [package.parent / path for path in put.touched_python]
    kernel_names = {Path(k).name for k in put.touched_kernels}
    if kernel_names:
        paths += [path for path in sorted((package / "sglang").rglob("*.py"))
                  if any(name in path.read_text(errors="replace") for name in kernel_names)]
    for path in paths:
        module = ".".join(path.relative_to(package).with_suffix("").parts)
        modules.append(module.removesuffix(".__init__"))
    return [m for m in dict.fromkeys(modules) if _module_exists(package, m)]


def _module_exists(package: Path, module: str) -> bool:
    base = package.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def import_smoke(put: PinUnderTest) -> tuple[Part, list[str]]:
    name = "import smoke of the patched pin on CPU"
    modules = import_smoke_modules(put)
    report, why = _answer(put, IMPORT_SMOKE)
    if report is None:
        return Part(name, SKIPPED if why.startswith("unavailable: ") else FAILED, why[:600]), [why]
    log = [f"import smoke of {' '.join(modules)}: {json.dumps(report, default=str)[:20000]}"]
    failed = {m: e for m, e in report.get("modules", {}).items() if e}
    if failed:
        first = next(iter(failed.items()))
        return Part(name, FAILED, f"{len(failed)} of {len(modules)} modules failed; {first[0]}: {first[1]}"), log
    return Part(name, PASSED, f"imported {len(modules)} modules: {', '.join(modules)}"), log


# -- load ---------------------------------------------------------------------------------------------


def load_cell(put: PinUnderTest, record: CellRecord) -> list[str]:
    """The MTP load witness on the patched tree, then a synthetic checkpoint of the pin's GlmMoeDsa
    shape through the pin's config and quantization resolution for every MTP module."""
    witness = mtp_exclude.MtpQuarkExcludeWitness()
    result = answer_cache.run_cached(witness, put.patched_tree, put.pin, lambda: checkout(put, put.patched_commit))
    record.parts.append(witness_part(f"MTP load witness ({witness.name}) on the patched pin", result, expect=CLEAN))
    part, log = synthetic_checkpoint_part(put)
    record.parts.append(part)
    return log


def synthetic_checkpoint_part(put: PinUnderTest, commit: str | None = None) -> tuple[Part, list[str]]:
    """A GLM-5-shaped Quark checkpoint written by the pin's own transformers, resolved by the
    patched pin (or ``commit``): every excluded MTP module unquantized and loaded exactly, the rest
    quantized."""
    name = "synthetic GlmMoeDsa checkpoint through the pin's config and quantization"
    written, why = _answer(put, GLM_CHECKPOINT, commit)
    if written is None:
        return Part(name, SKIPPED if why.startswith("unavailable: ") else FAILED, f"the checkpoint was not written: {why}"[:600]), [why]
    answer, why = _answer(put, MTP_CHECKPOINT, commit)
    if answer is None:
        return Part(name, SKIPPED if why.startswith("unavailable: ") else FAILED, why[:600]), [why]
    log = [json.dumps(answer, indent=1, default=str)[:20000]]
    return judge_checkpoint(name, answer, written), log


def judge_checkpoint(name: str, answer: dict, written: dict) -> Part:
    case = (answer.get("cases") or {}).get("checkpoint")
    if case is None:
        return Part(name, FAILED, "the probe answered nothing for the checkpoint")
    if case.get("error"):
        return Part(name, FAILED, f"the draft could not be built: {case['error']}")
    # The modules this part exists to check: without one of them it proves nothing.
    gone = [m for m in mtp_exclude.CHECKED_MODULES if m not in (case.get("modules") or {})]
    gone += list(case.get("missing") or [])
    if gone:
        return Part(name, SKIPPED, f"unavailable: the probe found no such module in the built draft: "
                                   f"{', '.join(dict.fromkeys(gone))}")
    leaned = mtp_exclude.standins_leaned_on({"checkpoint": case})
    if leaned:
        return Part(name, SKIPPED, f"unavailable: the judged modules rest on a stand-in: {leaned}"[:600])
    excluded = set(written["excluded"])
    problems, seen = [], []
    for module, got in case.get("modules", {}).items():
        names = {n.removesuffix(".weight") for n in got.get("checkpoint_names", [])}
        keep_bf16 = bool(names) and names <= excluded
        seen.append(f"{module}: {got.get('quant_method')}/{got.get('load')}")
        if keep_bf16 and not (got.get("unquantized") and got.get("load") == "ok"):
            problems.append(f"{module} is excluded but got {got.get('quant_method')}/{got.get('load')}: {got.get('load_detail')}")
        if not keep_bf16 and got.get("unquantized"):
            problems.append(f"{module} is not excluded but was built unquantized")
    if not seen:
        return Part(name, FAILED, "no MTP module was resolved")
    shape = written.get("shape", {})
    where = f"layer {written.get('mtp_layer')} as {case.get('draft_prefix')}.*, {shape}"
    if problems:
        return Part(name, FAILED, "; ".join(problems) + f" ({where})")
    return Part(name, PASSED, f"{'; '.join(seen)} ({where})")


# -- spec ---------------------------------------------------------------------------------------------


def spec_scenarios(profile: Profile, depths=DEPTHS) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Per depth, two scenarios for the flags witness, which appends a scenario's argv to the
    profile's own flags (the last value of a repeated flag wins): depth d as users launch it, and
    the same with a stale draft-token count that sglang must normalise to d + 1 (top-k 1)."""
    scenarios = {}
    for depth in depths:
        argv = depth_flags(depth)
        scenarios[f"d{depth}"] = (argv, {})
        wrong = list(argv)
        wrong[wrong.index("--speculative-num-draft-tokens") + 1] = str(2 * depth + 3)
        scenarios[f"d{depth}-unnormalised"] = (wrong, {})
    return scenarios


def spec_cells(put: PinUnderTest, records: dict[int, CellRecord]) -> dict[int, list[str]]:
    """All depths of one pin: one child resolves every scenario; the kernel build is per depth."""
    profile = load_profile(PROFILE)
    logs: dict[int, list[str]] = {depth: [] for depth in records}
    resolved = None
    name = "profile accepted by the pin's ServerArgs (HIP emulation)"
    answer, why = _answer(put, FLAGS_SPEC)
    if answer is None:
        for record in records.values():
            record.parts.append(Part(name, SKIPPED if why.startswith("unavailable: ") else FAILED, why[:600]))
    else:
        resolved = answer.get("scenarios") or {}
    try:
        threshold, evidence = multi_step_kernel_threshold(put.tree_path)
    except SglpatchError as exc:
        threshold, evidence = None, str(exc)
    kernels = kernel_sources(put.tree_path)
    for depth, record in records.items():
        record.figures["argv"] = depth_argv(profile, depth)
        if resolved is not None:
            fields = resolved.get(f"d{depth}") or {}
            for key in ("kv_cache_dtype", "enable_aiter_allreduce_fusion"):
                if key in fields:
                    record.figures[key] = fields[key]
            # sglang's own warnings, once each (library deprecation noise left out).
            record.figures["warnings"] = list(dict.fromkeys(
                w for w in fields.get("warnings") or [] if not w.startswith(("DeprecationWarning", "UserWarning"))))
            parts, log = server_args_parts(depth, resolved)
            record.parts += parts
            logs[depth] += log
        if threshold is None:
            record.parts.append(Part("multi-step metadata kernel", FAILED, evidence))
            continue
        compiles = depth >= threshold
        record.figures["multi_step_kernel"] = compiles
        record.figures["multi_step_kernel_from"] = evidence
        if compiles:
            record.parts += kernel_parts(put, kernels, pristine_too=True)
        else:
            record.parts.append(Part(
                "multi-step metadata kernel not used at this depth", PASSED,
                f"the pin compiles it from depth {threshold} on ({evidence}); nothing to build at depth {depth}",
            ))
    return logs


def server_args_parts(depth: int, resolved: dict[str, dict]) -> tuple[list[Part], list[str]]:
    parts = []
    log = [f"d{depth}: {json.dumps(resolved.get(f'd{depth}'), default=str)}"]
    want = {
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": depth,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": depth + 1,
    }
    for scenario, label in ((f"d{depth}", "profile accepted by the pin's ServerArgs (HIP emulation)"),
                            (f"d{depth}-unnormalised", f"draft tokens normalised to {depth + 1} with top-k 1")):
        fields = resolved.get(scenario)
        if fields is None:
            parts.append(Part(label, FAILED, f"the flags witness returned no answer for {scenario}"))
            continue
        if fields.get("error"):
            parts.append(Part(label, FAILED, str(fields["error"])[:400]))
            continue
        wrong = {key: fields.get(key) for key, value in want.items() if str(fields.get(key)) != str(value)}
        if wrong:
            parts.append(Part(label, FAILED, f"resolved {wrong}, expected {want}"))
        else:
            warnings = fields.get("warnings") or []
            parts.append(Part(label, PASSED, f"resolved {want}" + (f"; {len(warnings)} warning(s)" if warnings else "")))
    return parts, log
