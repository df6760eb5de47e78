"""The three checks of the CPU tier, on the real code of the patched pin: build, load and spec.

Each takes the pin under test and the cell's record, appends its parts (and figures) to the record
and returns the log lines worth keeping.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from sglpatch import pyenv, witnesses
from sglpatch.errors import SglpatchError, Unavailable
from sglpatch.matrix.cells import DEPTHS, PROFILE, depth_argv, depth_flags
from sglpatch.matrix.kernels import kernel_parts, kernel_sources, multi_step_kernel_threshold, witness_part
from sglpatch.matrix.pin import PinUnderTest, checkout
from sglpatch.matrix.records import FAILED, PASSED, SKIPPED, CellRecord, Part, last_json
from sglpatch.pins import Pin
from sglpatch.profile import Profile, load_profile
from sglpatch.witnesses import CLEAN, mtp_exclude, rocm_flags


def cpu_python(pin: Pin):
    """The CPU Python of the pin (shared torch venv + the pin's own pinned dependencies)."""
    try:
        return pyenv.cpu_python(pin)
    except pyenv.EnvUnavailable as exc:
        raise Unavailable(f"no CPU Python for {pin.version}: {exc}") from None


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
    try:
        python = cpu_python(put.pin)
    except Unavailable as exc:
        return Part(name, SKIPPED, str(exc)), []
    run = python.run([str(pyenv.PROBES / "import_smoke.py"), *modules], tree=put.tree_path, timeout=900)
    log = [f"$ import_smoke.py {' '.join(modules)}", run.stdout[-20000:], run.stderr[-20000:]]
    report = last_json(run.stdout)
    if report is None:
        return Part(name, FAILED, f"the probe printed no report (exit {run.returncode}): {run.stderr.strip()[-400:]}"), log
    failed = {m: e for m, e in report.get("modules", {}).items() if e}
    if failed or run.returncode != 0:
        first = next(iter(failed.items()), ("?", run.stderr.strip()[-300:]))
        return Part(name, FAILED, f"{len(failed)} of {len(modules)} modules failed; {first[0]}: {first[1]}"), log
    return Part(name, PASSED, f"imported {len(modules)} modules: {', '.join(modules)}"), log


# -- load ---------------------------------------------------------------------------------------------


def load_cell(put: PinUnderTest, record: CellRecord) -> list[str]:
    """The MTP load witness on the patched tree, then a synthetic checkpoint of the pin's GlmMoeDsa
    shape through the pin's config and quantization resolution for every MTP module."""
    witness = mtp_exclude.MtpQuarkExcludeWitness()
    result = witnesses.run_cached(witness, put.patched_tree, put.pin, lambda: checkout(put, put.patched_commit))
    record.parts.append(witness_part(f"MTP load witness ({witness.name}) on the patched pin", result, expect=CLEAN))
    part, log = synthetic_checkpoint_part(put)
    record.parts.append(part)
    return log


def synthetic_checkpoint_part(put: PinUnderTest) -> tuple[Part, list[str]]:
    """A GLM-5-shaped Quark checkpoint written by the pin's own transformers, resolved by the
    patched pin: every excluded MTP module unquantized and loaded exactly, the rest quantized."""
    name = "synthetic GlmMoeDsa checkpoint through the pin's config and quantization"
    try:
        python = cpu_python(put.pin)
    except Unavailable as exc:
        return Part(name, SKIPPED, str(exc)), []
    with tempfile.TemporaryDirectory(prefix="sglpatch-glm-ckpt-") as folder:
        made = python.run([str(pyenv.PROBES / "glm_checkpoint.py"), folder], tree=put.tree_path, timeout=300)
        written = last_json(made.stdout)
        log = [f"$ glm_checkpoint.py: exit {made.returncode}", made.stdout[-4000:], made.stderr[-4000:]]
        if written is None:
            return Part(name, FAILED, f"the checkpoint was not written: {made.stderr.strip()[-400:]}"), log
        try:
            answer = mtp_exclude.resolve_mtp_modules(put.tree_path, put.pin, checkpoint=Path(folder))
        except (Unavailable, pyenv.EnvUnavailable) as exc:
            return Part(name, SKIPPED, str(exc)[:600]), log
        except Exception as exc:  # ProbeFailed and anything else: the probe's own words
            return Part(name, FAILED, str(exc)[:600]), log
    log.append(json.dumps(answer, indent=1, default=str)[:20000])
    return judge_checkpoint(name, answer, written), log


def judge_checkpoint(name: str, answer: dict, written: dict) -> Part:
    case = (answer.get("cases") or {}).get("checkpoint")
    if case is None:
        return Part(name, FAILED, "the probe answered nothing for the checkpoint")
    if case.get("error"):
        return Part(name, FAILED, f"the draft could not be built: {case['error']}")
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
    try:
        resolved = rocm_flags.resolve_server_args(put.tree_path, put.pin, spec_scenarios(profile, list(records)), profile=profile)
    except Exception as exc:  # WitnessUnavailable: no CPU Python here; anything else is a failure
        state = SKIPPED if isinstance(exc, (Unavailable, rocm_flags.WitnessUnavailable)) else FAILED
        for record in records.values():
            record.parts.append(Part(name, state, str(exc)[:600]))
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
