"""The ROCm tier: the matrix's checks run in a patched ROCm image on AMD GPUs, through docker.

What a tier needs: the pin's patched image (built ``FROM`` its released ROCm image, with the series
applied inside), the options of a run, and the judgement of the figures the in-image check scripts
(``sglpatch/rocm_checks/``) print, against the same check definitions the CPU tier uses
(``sglpatch.matrix.cells.CHECKS``). Running the checks is ``sglpatch.matrix.rocm_job``'s: one job
per pin, one server per launch configuration, shared by the checks that launch the same one; a
cell alone (``run_rocm_cell``) is a job of one cell. Without a docker engine or without
``/dev/kfd`` a cell is recorded as skipped, with the reason -- never as a failure of a machine that
cannot run it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.errors import SglpatchError, Unavailable
from sglpatch.matrix import containers
from sglpatch.matrix.cells import Cell, validate_cell
from sglpatch.matrix.pin import PinUnderTest
from sglpatch.matrix.records import FAILED, PASSED, SKIPPED, CellRecord, Part, last_json
from sglpatch.project import Project

CHECK_SCRIPTS = Path(__file__).parent.parent / "rocm_checks"
# The CPU probes' checkpoint generator, run in the image to write the bug-level cells' checkpoint.
CHECKPOINT_SCRIPTS = tuple(Path(__file__).parent.parent / "witnesses" / "probes" / name
                           for name in ("glm_checkpoint.py", "quark_checkpoint.py"))
KFD = Path("/dev/kfd")
IMAGE_ENV = "SGLPATCH_ROCM_IMAGE"  # a base image for every pin; "{version}" is replaced by the pin
STATE_INSIDE = "/sglpatch-state"
HF_INSIDE = "/root/.cache/huggingface"
CHECKPOINT_INSIDE = "/sglpatch-checkpoint"
MATRIX_MODEL_ENV = "SGLPATCH_MATRIX_MODEL"  # a model folder for the matrix cells instead of the synthetic checkpoint
NODE_GPUS = 8

# Accept length (tokens per verify step, at most d + 1). The one published floor: sglang's own AMD
# CI asserts >= 5.0 for GLM-5.2 MXFP4 with MTP 5/1/6 (--kv-cache-dtype fp8_e4m3, SGLANG_USE_AITER=1).
# The other depths take the same per-token acceptance a: a chain of d drafts accepts
# 1 + a + ... + a^d tokens per step, and a is the one that gives 5.0 at depth 5.
SGLANG_CI_DEPTH, SGLANG_CI_ACCEPT_LENGTH = 5, 5.0


def _chain_accept_length(acceptance: float, depth: int) -> float:
    return sum(acceptance**k for k in range(depth + 1))


def _acceptance_for(depth: int, length: float) -> float:
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if _chain_accept_length(middle, depth) < length else (low, middle)
    return low


ACCEPTANCE = _acceptance_for(SGLANG_CI_DEPTH, SGLANG_CI_ACCEPT_LENGTH)
ACCEPT_LENGTH_FLOORS = {d: round(_chain_accept_length(ACCEPTANCE, d), 2) for d in range(1, 7)}
ACCEPT_LENGTH_FLOORS[SGLANG_CI_DEPTH] = SGLANG_CI_ACCEPT_LENGTH
# Greedy decoding with EAGLE verification emits the target model's own tokens, so the text must
# match the non-speculative run's; bf16/fp8 kernels with other batch shapes may diverge late, so the
# floor is on the mean share of each output that matches as a prefix, not on exact equality.
PREFIX_MATCH_FLOOR = 0.8
# Decode speed at depth d against the same profile without speculative decoding, below which it
# has collapsed. Working speculation decodes faster than none; the missing ROCm guard shows as a
# ~30x drop (the kernel's compile is retried on every step), far below this. Not against depth 3:
# depth 3 is a speculative launch itself, and its own cell would be compared with itself.
COLLAPSE_RATIO = 0.5
COLLAPSE_PART = "decode speed not collapsed against the non-speculative decode"
BURST = 32


@dataclass
class RocmOptions:
    base_image: str | None = None  # default: $SGLPATCH_ROCM_IMAGE, else the pin's rocm_image
    model: str | None = None  # default: $SGLPATCH_MODEL, else the profile's model folder
    hf_cache: Path = field(default_factory=lambda: Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"))
    docker_url: str | None = None  # default: $DOCKER_HOST or the local socket
    gpu: bool = True  # the AMD CI device flags, and /dev/kfd required
    server_timeout: int = 2400  # seconds for a server to become healthy
    health_poll_s: float = 5.0  # seconds between a starting server's health probes
    cell_timeout: int = 4 * 3600  # seconds for one check's container
    network: str = "host"
    # The build, load and spec cells' model: None, the synthetic checkpoint the job writes
    # (glm_checkpoint.py --size rocm: random weights, served at its own TP, several servers on the
    # node at once); a folder (or $SGLPATCH_MATRIX_MODEL), that model with the profile as shipped,
    # one server at a time, its accept length and greedy outputs judged too. The accuracy gate and
    # the bench always serve ``model``.
    matrix_model: str | None = field(default_factory=lambda: os.environ.get(MATRIX_MODEL_ENV) or None)
    gpus: int = NODE_GPUS  # a runner's GPUs, shared out between synthetic-checkpoint servers

    @property
    def synthetic(self) -> bool:
        return self.matrix_model is None

    def image_for(self, version: str, pinned_image: str) -> str:
        template = self.base_image or os.environ.get(IMAGE_ENV)
        return template.replace("{version}", version) if template else pinned_image


def unavailable_reason(options: RocmOptions):
    """(None, client) where the tier can run; (the reason, None) where it cannot."""
    if options.gpu and not KFD.exists():
        return f"no AMD GPU here: {KFD} does not exist (the ROCm tier needs a ROCm runner)", None
    try:
        return None, containers.connect(options.docker_url)
    except Unavailable as exc:
        return str(exc), None


def run_rocm_cell(project: Project, cell: Cell, options: RocmOptions | None = None, on_log=print) -> CellRecord:
    """One cell alone, for a person debugging it: a ROCm job of that one cell
    (``sglpatch.matrix.rocm_job``), reusing the pin's non-speculative baseline measured before on
    the same image where there is one."""
    from sglpatch.matrix import rocm_job

    validate_cell(cell)
    if cell.tier != "rocm":
        raise SglpatchError(f"{cell.label}: the ROCm tier runs rocm cells only")
    item = rocm_job.Item(cell.check, cell.depth)
    return rocm_job.run_job(project, cell.pin, [item], options, on_log=on_log, reuse_baselines=True).records[0]


def build_patched_image(client, put: PinUnderTest, options: RocmOptions, on_log=print) -> tuple[containers.PatchedImage, str]:
    """The pin's patched image, built FROM its released image (the engine's layer cache makes a
    rebuild cheap): what a matrix cell runs in, and what ``sglpatch image`` gives users."""
    spec = patched_image(put, options)
    on_log(f"# building {spec.tag} FROM {spec.base_image}")
    return spec, containers.build_image(client, spec, on_log)


def patched_image(put: PinUnderTest, options: RocmOptions) -> containers.PatchedImage:
    patches = [(outcome.name, Path(outcome.rendition)) for outcome in put.applied()]
    return image_spec(put.pin, put.series_version, put.series_hash, patches, options)


def image_spec(pin, series_version: str, series_hash: str, patches: list[tuple[str, Path]],
               options: RocmOptions) -> containers.PatchedImage:
    """The patched image of ``pin`` with ``patches`` ((series name, rendition file), in order)."""
    return containers.PatchedImage(
        base_image=options.image_for(pin.version, pin.rocm_image),
        pin=pin.version,
        series_version=series_version,
        series_hash=series_hash,
        patches=tuple(patches),
        tools=(*sorted(CHECK_SCRIPTS.glob("*.py")), *CHECKPOINT_SCRIPTS),
    )


def judge(cell: Cell, run: containers.ContainerRun, record: CellRecord) -> None:
    """The check definitions applied to what the container printed."""
    figures = run_figures(cell.check, run, record)
    if figures is not None:
        if cell.check == "build":
            figures["exit"] = run.exit_code  # a compile script that crashed after printing fails too
        judge_figures(cell, figures, record)


def run_figures(check: str, run: containers.ContainerRun, record: CellRecord) -> dict | None:
    """The figures a check container printed last; None, with the failed part recorded, where it
    did not start, timed out or printed none."""
    where = f"{check} in the patched image"
    if run.start_error:
        record.parts.append(Part(where, FAILED, f"the container did not start: {run.start_error}"[:600]))
        return None
    if run.timed_out:
        record.parts.append(Part(where, FAILED, "timed out"))
        return None
    figures = last_json(run.log)
    if figures is None:
        record.parts.append(Part(where, FAILED, f"exit {run.exit_code}, no figures printed: {run.log.strip()[-400:]}"))
    return figures


def judge_figures(cell: Cell, figures: dict, record: CellRecord, synthetic: bool = False) -> None:
    """A build, load or spec cell's parts from its figures (what its check printed, or, where its
    server never became healthy, what the server's container reported). ``synthetic``: served
    from the synthetic checkpoint, whose zeroed final norms force accept length and greedy
    agreement: they are recorded, not judged."""
    record.gpu = str(figures.pop("gpu", ""))
    record.figures.update(figures)
    if cell.check == "build":
        kernels = figures.get("kernels", {})
        failed = {k: v for k, v in kernels.items() if v}
        ok = kernels and not failed and figures.get("exit", 0) == 0
        detail = f"compiled {', '.join(kernels)}" if ok else f"{failed or 'nothing compiled'}"
        record.parts.append(Part("JIT compile of the touched kernels in the container", PASSED if ok else FAILED, detail))
        return
    healthy = figures.get("healthy_s")
    record.parts.append(
        Part("server healthy", PASSED if healthy is not None else FAILED,
             f"after {healthy} s" if healthy is not None else f"not healthy: {figures.get('error', 'see the log')}")
    )
    mismatches = figures.get("mismatch_lines") or []
    record.parts.append(Part("no shape mismatch in the server log", FAILED if mismatches else PASSED, "; ".join(mismatches)[:400]))
    record.figures["checkpoint"] = "synthetic" if synthetic else "model"
    if healthy is not None:
        record.parts.append(compile_part(figures))
    if cell.check == "load":
        text = figures.get("generate")
        record.parts.append(Part("one generate", PASSED if text else FAILED, repr(text)[:200]))
        if healthy is not None:
            record.parts.append(flags_part(figures))
        return
    for part in spec_parts(cell.depth, record.figures, synthetic):  # derived figures land in the record
        record.parts.append(part)


COMPILE_PART = "the fused metadata-copy kernel did not fail to compile"


def compile_part(figures: dict) -> Part:
    """The missing ROCm guard's own signature: the pin's Python caller logs every failed JIT
    compile and falls back, and the failure is not cached, so a count above one is the compile
    retried step after step."""
    failures = figures.get("compile_failures") or 0
    if not failures:
        return Part(COMPILE_PART, PASSED, "no failed compile in the server log")
    retried = " (retried: the failure is not cached)" if failures > 1 else ""
    return Part(COMPILE_PART, FAILED, f"{failures} failed compile(s){retried}: {figures.get('compile_failure_line', '')}"[:400])


FLAGS_PART = "the launch's flags resolve as asked"


def flags_part(figures: dict) -> Part:
    """The flags the launch asked for (``asked``), as the running server reports them: a flag it
    reports otherwise fails; one it does not report leaves the part unchecked, never passed."""
    asked, resolved = figures.get("flags_asked") or {}, figures.get("flags_resolved") or {}
    if not asked:
        return Part(FLAGS_PART, PASSED, "the launch asks for none of the checked flags")
    wrong = {flag: (value, resolved[flag]) for flag, value in asked.items() if flag in resolved and resolved[flag] != value}
    unknown = sorted(flag for flag in asked if flag not in resolved)
    findings = "; ".join(figures.get("flag_findings") or [])
    if wrong:
        return Part(FLAGS_PART, FAILED, "; ".join(f"{flag}: asked {a!r}, the server runs {r!r}" for flag, (a, r) in wrong.items())[:400])
    if unknown:
        return Part(FLAGS_PART, SKIPPED, f"the server's /server_info does not report {', '.join(unknown)}")
    return Part(FLAGS_PART, PASSED, ", ".join(f"{flag}={value!r}" for flag, value in asked.items())
                + (f"; the server log says: {findings}" if findings else ""))


def spec_parts(depth: int, figures: dict, synthetic: bool = False) -> list[Part]:
    parts = []
    match = figures.get("prefix_match")
    if synthetic:
        if match:
            figures["prefix_match_mean"] = round(sum(match) / len(match), 3)
        # The checkpoint's zeroed final norms make every logit 0, so target and draft both emit
        # token 0 whatever the layers computed: agreement and acceptance are forced, and prove
        # nothing of the draft. Recorded; judged on the full model (the gate's accept length).
        figures["not_judged"] = ["accept_length", "prefix_match"]
    elif match is None:
        parts.append(Part("greedy outputs against the non-speculative run", FAILED, "no comparison was made"))
    else:
        mean = sum(match) / len(match)
        figures["prefix_match_mean"] = round(mean, 3)
        parts.append(Part("greedy outputs against the non-speculative run", PASSED if mean >= PREFIX_MATCH_FLOOR else FAILED,
                          f"{figures.get('exact_match')} of {len(match)} identical, mean prefix match {mean:.2f}"
                          f" (floor {PREFIX_MATCH_FLOOR})"))
    accept = figures.get("accept_length")
    floor = ACCEPT_LENGTH_FLOORS[depth]
    source = "sglang's AMD CI" if depth == SGLANG_CI_DEPTH else f"from sglang's AMD CI {SGLANG_CI_ACCEPT_LENGTH} at depth {SGLANG_CI_DEPTH}"
    if not synthetic:
        parts.append(Part(f"accept length at least {floor}", PASSED if accept is not None and accept >= floor else FAILED,
                          f"{accept} (floor {floor}, {source})"))
    speed, base = figures.get("decode_tok_s"), figures.get("plain_decode_tok_s")
    if not speed or not base:
        parts.append(Part(COLLAPSE_PART, FAILED, f"depth {depth}: {speed}, without speculative decoding: {base}"))
    else:
        ratio = speed / base
        figures["decode_ratio_vs_plain"] = round(ratio, 3)
        parts.append(Part(COLLAPSE_PART, PASSED if ratio >= COLLAPSE_RATIO else FAILED,
                          f"{speed:.1f} tok/s at depth {depth} vs {base:.1f} without speculative decoding"
                          f" (x{ratio:.2f}, floor x{COLLAPSE_RATIO})"))
    completed = figures.get("burst_completed") or 0
    parts.append(Part(f"{BURST} concurrent requests complete", PASSED if completed == BURST else FAILED,
                      f"{completed} of {BURST}; {figures.get('burst_errors') or ''}"))
    return parts
