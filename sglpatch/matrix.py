"""The test matrix: which cells exist, what each check proves, and the CPU tier that runs them here.

A cell is (tier, check, pin[, depth]). The checks are defined once (``CHECKS``); a tier only decides
where they run:

- ``cpu`` (this module): on the real code of the patched pin, on this machine -- compile witnesses,
  the pin's own Python imported under HIP emulation, its ``ServerArgs`` and quantization resolution.
- ``rocm`` (``sglpatch.rocm_tier``): the same checks in a patched ROCm image on AMD GPUs.

CPU cells are cached by the patched and pristine tree hashes and the code that checks them, so a
warm re-run of the whole CPU tier costs seconds.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch import cache, diffs, pyenv, witnesses
from sglpatch.apply import NOT_APPLICABLE, NOT_NEEDED, PinResult, checkout_commit
from sglpatch.errors import SglpatchError
from sglpatch.gitcmd import git_out
from sglpatch.pins import Pin
from sglpatch.profile import Profile, load_profile
from sglpatch.project import Project, apply_series
from sglpatch.results import FAILED, PASSED, SKIPPED, CellRecord, Part, cell_id, combine, write_atomically, write_record
from sglpatch.witnesses import BUG, CLEAN, UNAVAILABLE
from sglpatch.witnesses import mtp_exclude, rocm_flags, rocm_guard

TIERS = ("cpu", "rocm")
DEPTHS = tuple(range(1, 7))
PROFILE = "glm-5.2-mxfp4-mi355x"
# Bump when what a CPU cell checks changes in a way the hashed sources below do not show.
CPU_TIER_VERSION = "1"


@dataclass(frozen=True)
class Check:
    name: str
    description: str  # one line: what passing proves
    per_depth: bool = False


CHECKS = {
    check.name: check
    for check in (
        Check("build", "HIP compile of every JIT kernel the series touches, and an import smoke of the patched pin"),
        Check("load", "the MTP draft layer loads: its quantization resolves per module on the patched pin"),
        Check(
            "spec",
            "the launch profile at EAGLE depth d is accepted and normalised; the depth's kernels build",
            per_depth=True,
        ),
    )
}


@dataclass(frozen=True)
class Cell:
    tier: str
    check: str
    pin: str
    depth: int | None = None

    @property
    def label(self) -> str:
        depth = f", depth {self.depth}" if self.depth is not None else ""
        return f"{self.check} ({self.tier}) on sglang {self.pin}{depth}"


def cells(pins: list[str], tiers: tuple[str, ...] = TIERS) -> list[Cell]:
    """Every cell of the matrix: build and load per pin, spec per pin and depth 1..6, per tier."""
    out = []
    for tier in tiers:
        for pin in pins:
            for check in CHECKS.values():
                for depth in DEPTHS if check.per_depth else (None,):
                    out.append(Cell(tier, check.name, pin, depth))
    return out


def validate_cell(cell: Cell) -> None:
    if cell.tier not in TIERS:
        raise SglpatchError(f"unknown tier {cell.tier!r}; tiers: {', '.join(TIERS)}")
    check = CHECKS.get(cell.check)
    if check is None:
        raise SglpatchError(f"unknown check {cell.check!r}; checks: {', '.join(CHECKS)}")
    if check.per_depth and cell.depth not in DEPTHS:
        raise SglpatchError(f"{cell.check} needs a depth in {DEPTHS[0]}..{DEPTHS[-1]}, got {cell.depth}")
    if not check.per_depth and cell.depth is not None:
        raise SglpatchError(f"{cell.check} takes no depth")


def depth_argv(profile: Profile, depth: int, model: str | None = None) -> list[str]:
    """The ``sglang.launch_server`` arguments of the profile at EAGLE depth d (d steps, top-k 1,
    d + 1 draft tokens)."""
    return profile.with_depth(depth).server_args(model)


def matrix_dir(project: Project) -> Path:
    return project.build_dir / "matrix"


# -- the pin under test -------------------------------------------------------------------------


@dataclass
class PinUnderTest:
    """A pin with the series applied: its patched tree on disk and what apply decided per patch."""

    pin: Pin
    tree_path: Path  # build/trees/<version>, the sglpatch branch checked out
    patched_commit: str
    patched_tree: str
    pristine_commit: str
    pristine_tree: str
    series_version: str
    series_hash: str
    result: PinResult
    # JIT kernel source (tree path) -> (patch, applied because its witness found the bug) per patch
    kernel_patches: dict[str, list[tuple[str, bool]]] = field(default_factory=dict)
    touched_python: list[str] = field(default_factory=list)  # Python files the applied patches change

    @property
    def touched_kernels(self) -> list[str]:
        return sorted(self.kernel_patches)

    def applied(self):
        return [o for o in self.result.patches if o.commit and o.status not in (NOT_NEEDED, NOT_APPLICABLE)]


def prepare_pin(project: Project, version: str) -> PinUnderTest:
    """Apply the series to one pin (warm: a lookup) and describe the result for the cells."""
    pin = project.pins().select([version])[0]
    report = apply_series(project, [version], report_path=matrix_dir(project) / "apply" / f"{version}.json")
    result = report.results[0]
    if not result.ok:
        raise SglpatchError(f"applying the series to {version} failed: {result.error}")
    tree_path = Path(result.tree_path)
    pristine_tree = git_out(["rev-parse", f"{result.pristine}^{{tree}}"], tree_path)
    series = project.series()
    # Kernels each patch's rendition for this pin touches, whether apply applied it or found it
    # fixed upstream: a kernel fixed upstream must build too, and the pristine build of a kernel
    # must fail exactly where a patch for it was needed.
    kernel_patches: dict[str, list[tuple[str, bool]]] = {}
    touched_python: set[str] = set()
    for patch in series.patches:
        rendition = patch.for_version(version)
        outcome = next((o for o in result.patches if o.name == patch.name), None)
        if rendition is None or outcome is None or outcome.status == NOT_APPLICABLE:
            continue
        existing, created = diffs.touched_paths(diffs.parse_diff(rendition))
        for path in existing + created:
            if is_jit_kernel_source(path):
                kernel_patches.setdefault(path, []).append((patch.name, bool(outcome.commit) and outcome.needed is True))
            elif path.startswith("python/sglang/") and path.endswith(".py") and outcome.commit:
                touched_python.add(path)
    return PinUnderTest(
        pin=pin,
        tree_path=tree_path,
        patched_commit=result.commit,
        patched_tree=result.tree,
        pristine_commit=result.pristine,
        pristine_tree=pristine_tree,
        series_version=report.series_version,
        series_hash=report.series_digest,
        result=result,
        kernel_patches=kernel_patches,
        touched_python=sorted(touched_python),
    )


def is_jit_kernel_source(path: str) -> bool:
    """A source the pin's JIT loader compiles at run time (the folder moved between releases)."""
    jit_roots = ("python/sglang/jit_kernel/", "python/sglang/kernels/jit/")
    return path.startswith(jit_roots) and path.endswith((".cuh", ".cu", ".h", ".hpp", ".cpp"))


# -- compile witnesses of JIT kernels ------------------------------------------------------------

# The HIP compile witness of each JIT kernel source, by file name. A kernel the series touches
# without an entry here fails the build cell: every touched kernel must be compiled for ROCm.
COMPILE_WITNESSES = {Path(rocm_guard.HEADER).name: rocm_guard.RocmGuardWitness}


def compile_witness(tree_hash: str, commit: str, put: PinUnderTest, kernel: str):
    """The kernel's compile witness on one commit of the pin (cached by tree hash); None if the
    kernel has none."""
    witness_class = COMPILE_WITNESSES.get(Path(kernel).name)
    if witness_class is None:
        return None
    witness = witness_class()
    return witnesses.run_cached(witness, tree_hash, put.pin, lambda: _checkout(put, commit))


def kernel_parts(put: PinUnderTest, kernels: list[str], *, pristine_too: bool) -> list[Part]:
    """The HIP build of each kernel on the patched tree (must pass) and, with ``pristine_too``, on
    the pristine tree: it must fail there exactly where the series carries a patch for it."""
    parts = []
    for kernel in kernels:
        name = Path(kernel).name
        patched = compile_witness(put.patched_tree, put.patched_commit, put, kernel)
        if patched is None:
            parts.append(Part(f"HIP build of {name}", FAILED, f"no compile witness knows {kernel}"))
            continue
        parts.append(_witness_part(f"HIP build of {name} (patched)", patched, expect=CLEAN))
        if pristine_too:
            pristine = compile_witness(put.pristine_tree, put.pristine_commit, put, kernel)
            needed = [patch for patch, applied in put.kernel_patches.get(kernel, []) if applied]
            part = _witness_part(f"HIP build of {name} (pristine)", pristine, expect=BUG if needed else CLEAN)
            why = f"{', '.join(needed)} was needed here" if needed else "no patch for it was needed here"
            part.detail = f"{part.detail} ({why})"
            parts.append(part)
    return parts


def _witness_part(name: str, result, *, expect: str) -> Part:
    detail = f"{result.state} [{result.level}] {result.detail}".strip()
    if result.state == UNAVAILABLE:
        return Part(name, SKIPPED, result.detail)
    return Part(name, PASSED if result.state == expect else FAILED, f"expected {expect}, got {detail}")


def kernel_sources(tree: Path) -> list[str]:
    """Tree paths of every compile-witnessed kernel the pin ships."""
    found = []
    for name in COMPILE_WITNESSES:
        for root in ("python/sglang/jit_kernel", "python/sglang/kernels/jit"):
            found += [str(p.relative_to(tree)) for p in (tree / root).rglob(name)]
    return sorted(found)


# -- where the pin compiles the multi-step metadata kernel ---------------------------------------

_MULTI_STEP_RE = re.compile(r"if self\.speculative_num_steps\s*(>=|>)\s*(\d+)\s*:")


def multi_step_kernel_threshold(tree: Path) -> tuple[int, str]:
    """The smallest ``speculative_num_steps`` at which the pin's sparse-attention backend compiles
    ``fused_metadata_copy_multi``, read from the pin's own source, with the file as evidence."""
    package = tree / "python" / "sglang" / "srt" / "layers" / "attention"
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(errors="replace")
        if "fused_metadata_copy_multi" not in text:
            continue
        for match in _MULTI_STEP_RE.finditer(text):
            # The condition must guard the multi-step kernel: its import follows within a few lines.
            if "fused_metadata_copy_multi" in text[match.end() : match.end() + 400]:
                op, number = match.group(1), int(match.group(2))
                line = text[: match.start()].count("\n") + 1
                where = f"{path.relative_to(tree)}:{line} ({match.group(0).strip()})"
                return (number + 1 if op == ">" else number), where
    raise SglpatchError(f"{tree}: no sparse-attention backend compiles fused_metadata_copy_multi")


# -- the CPU tier --------------------------------------------------------------------------------


def _code_digest() -> str:
    """What checks a CPU cell: this module and the child-side probes. A change re-runs the cells."""
    digest = hashlib.sha256(CPU_TIER_VERSION.encode())
    paths = [Path(__file__)]
    if pyenv.PROBES.is_dir():
        paths += sorted(pyenv.PROBES.rglob("*.py"))
    for name in ("mtp_exclude.py", "rocm_flags.py", "rocm_guard.py"):
        paths.append(Path(__file__).parent / "witnesses" / name)
    for path in paths:
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _cache_entry(put: PinUnderTest, cell: Cell) -> Path:
    key = f"{cell.check}-{cell.pin}-{cell.depth}-{put.patched_tree}-{put.pristine_tree}-{_code_digest()}"
    name = hashlib.sha256(key.encode()).hexdigest()[:32]
    return cache.cache_root() / "matrix" / "cpu" / f"{cell.check}-{cell.pin}-{cell.depth or 0}-{name}.json"


def run_cpu_cell(project: Project, cell: Cell, *, use_cache: bool = True) -> CellRecord:
    """Run one CPU cell (spec runs every depth of the pin at once and caches each) and write its
    record and log under ``build/matrix``."""
    validate_cell(cell)
    started = time.monotonic()
    out = matrix_dir(project)
    log_path = out / "logs" / f"{cell_id(cell.tier, cell.check, cell.pin, cell.depth)}.log"
    try:
        put = prepare_pin(project, cell.pin)
    except SglpatchError as exc:
        series = project.series()
        record = CellRecord(cell.tier, cell.check, cell.pin, cell.depth, series.version, series.digest(),
                            FAILED, reason=str(exc), parts=[Part("apply the series", FAILED, str(exc))])
        return _finish(record, out, log_path, started, [str(exc)])
    entry = _cache_entry(put, cell)
    if use_cache and entry.is_file():
        try:
            record = CellRecord.from_dict(json.loads(entry.read_text()))
            record.cached = True
            return _finish(record, out, log_path, started, None)
        except (ValueError, TypeError):
            entry.unlink(missing_ok=True)
    try:
        record, log = _run_fresh(put, cell, entry)
    finally:
        while _CHECKOUTS:
            cache.remove(_CHECKOUTS.pop())
    return _finish(record, out, log_path, started, log)


def _run_fresh(put: PinUnderTest, cell: Cell, entry: Path) -> tuple[CellRecord, list[str]]:
    if cell.check == "spec":
        records = {depth: _new_record(Cell(cell.tier, "spec", cell.pin, depth), put) for depth in DEPTHS}
        logs = spec_cells(put, records)
        for depth, record in records.items():
            if depth != cell.depth:
                _remember(_cache_entry(put, Cell(cell.tier, "spec", cell.pin, depth)), record)
        record, log = records[cell.depth], logs[cell.depth]
    else:
        record = _new_record(cell, put)
        log = (build_cell if cell.check == "build" else load_cell)(put, record)
    _remember(entry, record)
    return record, log


def _new_record(cell: Cell, put: PinUnderTest) -> CellRecord:
    return CellRecord(
        tier=cell.tier, check=cell.check, pin=cell.pin, depth=cell.depth,
        series_version=put.series_version, series_hash=put.series_hash, outcome=SKIPPED,
        gpu="none: HIP emulation of 8x MI355X (gfx950) on CPU", tree=put.patched_tree,
    )


def _remember(entry: Path, record: CellRecord) -> None:
    """Only settled answers are cached: a skipped part may run next time (a toolchain, a witness)."""
    record.outcome, record.reason = combine(record.parts)
    if record.outcome not in (PASSED, FAILED):
        return
    write_atomically(entry, record.to_json())


def _finish(record: CellRecord, out: Path, log_path: Path, started: float, log: list[str] | None) -> CellRecord:
    record.outcome, record.reason = combine(record.parts) if record.parts else (record.outcome, record.reason)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if log is not None or not log_path.exists():
        lines = [f"{record.cell_id}: {record.outcome} {record.reason}".rstrip()]
        lines += [f"  {part.outcome:<8} {part.name}: {part.detail}" for part in record.parts]
        log_path.write_text("\n".join(lines + ["", *(log or [])]) + "\n")
    record.log = str(log_path)
    record.seconds = round(time.monotonic() - started, 2)
    write_record(record, out / "records")
    return record


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
        python = _cpu_python(put.pin)
    except _Unavailable as exc:
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


class _Unavailable(Exception):
    pass


def _cpu_python(pin: Pin):
    """The CPU Python of the pin (shared torch venv + the pin's own pinned dependencies)."""
    try:
        return pyenv.cpu_python(pin)
    except pyenv.EnvUnavailable as exc:
        raise _Unavailable(f"no CPU Python for {pin.version}: {exc}") from None


def last_json(stdout: str) -> dict | None:
    """The last line of a probe's or check script's output that is a JSON object."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


# -- load ---------------------------------------------------------------------------------------------


def load_cell(put: PinUnderTest, record: CellRecord) -> list[str]:
    """The MTP load witness on the patched tree, then a synthetic checkpoint of the pin's GlmMoeDsa
    shape through the pin's config and quantization resolution for every MTP module."""
    witness = mtp_exclude.MtpQuarkExcludeWitness()
    result = witnesses.run_cached(witness, put.patched_tree, put.pin, lambda: _checkout(put, put.patched_commit))
    record.parts.append(_witness_part(f"MTP load witness ({witness.name}) on the patched pin", result, expect=CLEAN))
    part, log = synthetic_checkpoint_part(put)
    record.parts.append(part)
    return log


_CHECKOUTS: list[Path] = []  # checkouts made for witnesses during one cell; removed when it ends


def _checkout(put: PinUnderTest, commit: str) -> Path:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="sglpatch-matrix-"))
    _CHECKOUTS.append(folder)
    return checkout_commit(put.tree_path, commit, folder)


def synthetic_checkpoint_part(put: PinUnderTest) -> tuple[Part, list[str]]:
    """A GLM-5-shaped Quark checkpoint written by the pin's own transformers, resolved by the
    patched pin: every excluded MTP module unquantized and loaded exactly, the rest quantized."""
    import tempfile

    name = "synthetic GlmMoeDsa checkpoint through the pin's config and quantization"
    try:
        python = _cpu_python(put.pin)
    except _Unavailable as exc:
        return Part(name, SKIPPED, str(exc)), []
    with tempfile.TemporaryDirectory(prefix="sglpatch-glm-ckpt-") as folder:
        made = python.run([str(pyenv.PROBES / "glm_checkpoint.py"), folder], tree=put.tree_path, timeout=300)
        written = last_json(made.stdout)
        log = [f"$ glm_checkpoint.py: exit {made.returncode}", made.stdout[-4000:], made.stderr[-4000:]]
        if written is None:
            return Part(name, FAILED, f"the checkpoint was not written: {made.stderr.strip()[-400:]}"), log
        try:
            answer = mtp_exclude.resolve_mtp_modules(put.tree_path, put.pin, checkpoint=Path(folder))
        except pyenv.EnvUnavailable as exc:
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


def depth_flags(depth: int) -> list[str]:
    """Depth d: EAGLE, d steps, top-k 1, d + 1 draft tokens."""
    return ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(depth),
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(depth + 1)]


def spec_cells(put: PinUnderTest, records: dict[int, CellRecord]) -> dict[int, list[str]]:
    """All depths of one pin: one child resolves every scenario; the kernel build is per depth."""
    profile = load_profile(PROFILE)
    logs: dict[int, list[str]] = {depth: [] for depth in records}
    resolved = None
    name = "profile accepted by the pin's ServerArgs (HIP emulation)"
    try:
        resolved = rocm_flags.resolve_server_args(put.tree_path, put.pin, spec_scenarios(profile, list(records)), profile=profile)
    except Exception as exc:  # WitnessUnavailable: no CPU Python here; anything else is a failure
        state = SKIPPED if isinstance(exc, rocm_flags.WitnessUnavailable) else FAILED
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
