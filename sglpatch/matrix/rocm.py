"""The ROCm tier: the matrix's checks run in a patched ROCm image on AMD GPUs, through docker.

Per cell: build (or reuse, through the engine's layer cache) the pin's patched image, run the
check's script in a container with sglang's AMD CI GPU flags, and judge the figures it prints
against the same check definitions the CPU tier uses (``sglpatch.matrix.cells.CHECKS``). Without a
docker engine or without ``/dev/kfd`` a cell is recorded as skipped, with the reason -- never as a
failure of a machine that cannot run it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.errors import SglpatchError, Unavailable
from sglpatch.matrix import containers
from sglpatch.matrix.cells import PROFILE, Cell, depth_argv, matrix_dir, validate_cell
from sglpatch.matrix.pin import PinUnderTest, prepare_pin
from sglpatch.matrix.records import FAILED, PASSED, SKIPPED, CellRecord, Part, cell_id, combine, last_json, write_record
from sglpatch.profile import load_profile
from sglpatch.project import Project

CHECK_SCRIPTS = Path(__file__).parent.parent / "rocm_checks"
KFD = Path("/dev/kfd")
IMAGE_ENV = "SGLPATCH_ROCM_IMAGE"  # a base image for every pin; "{version}" is replaced by the pin
STATE_INSIDE = "/sglpatch-state"
HF_INSIDE = "/root/.cache/huggingface"

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
# Decode speed at depth d against depth 3, below which it has collapsed. The missing ROCm guard
# shows as a ~30x drop (the kernel's compile is retried on every step), far below this.
COLLAPSE_RATIO = 0.5
BURST = 32


@dataclass
class RocmOptions:
    base_image: str | None = None  # default: $SGLPATCH_ROCM_IMAGE, else the pin's rocm_image
    model: str | None = None  # default: $SGLPATCH_MODEL, else the profile's model folder
    hf_cache: Path = field(default_factory=lambda: Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"))
    docker_url: str | None = None  # default: $DOCKER_HOST or the local socket
    gpu: bool = True  # the AMD CI device flags, and /dev/kfd required
    server_timeout: int = 2400  # seconds for a server to become healthy
    cell_timeout: int = 4 * 3600
    network: str = "host"

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
    validate_cell(cell)
    options = options or RocmOptions()
    started = time.monotonic()
    out = matrix_dir(project)
    log_path = out / "logs" / f"{cell_id(cell.tier, cell.check, cell.pin, cell.depth)}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    series = project.series()
    record = CellRecord(cell.tier, cell.check, cell.pin, cell.depth, series.version, series.digest(), SKIPPED)
    reason, client = unavailable_reason(options)
    if reason:
        record.parts.append(Part(f"{cell.check} in a patched ROCm container", SKIPPED, reason))
        log_path.write_text(f"{record.cell_id}: skipped: {reason}\n")
        return _finish(record, out, log_path, started)
    with open(log_path, "w") as log:

        def emit(line: str) -> None:
            log.write(line + "\n")
            log.flush()
            on_log(line)

        try:
            put = prepare_pin(project, cell.pin)
            record.tree = put.patched_tree
            spec, record.image_digest = build_patched_image(client, put, options, emit)
            record.figures["base_image"] = spec.base_image
            command, mounts = check_command(put, cell, options, record.image_digest, out / "rocm-state" / cell.pin)
            run = containers.run_check(
                client,
                record.image_digest,
                command,
                {containers.LABEL_CELL: record.cell_id, **spec.labels},
                containers.RunOptions(gpu=options.gpu, mounts=mounts, network=options.network, timeout=options.cell_timeout),
                emit,
            )
            judge(cell, run, record)
        except SglpatchError as exc:
            record.parts.append(Part(f"{cell.check} in a patched ROCm container", FAILED, str(exc)[:1000]))
            emit(str(exc))
        finally:
            containers.remove_ours(client, {containers.LABEL_CELL: record.cell_id})
    return _finish(record, out, log_path, started)


def _finish(record: CellRecord, out: Path, log_path: Path, started: float) -> CellRecord:
    record.outcome, record.reason = combine(record.parts)
    record.log = str(log_path)
    record.seconds = round(time.monotonic() - started, 2)
    write_record(record, out / "records")
    return record


def build_patched_image(client, put: PinUnderTest, options: RocmOptions, on_log=print) -> tuple[containers.PatchedImage, str]:
    """The pin's patched image, built FROM its released image (the engine's layer cache makes a
    rebuild cheap): what a matrix cell runs in, and what ``sglpatch image`` gives users."""
    spec = patched_image(put, options)
    on_log(f"# building {spec.tag} FROM {spec.base_image}")
    return spec, containers.build_image(client, spec, on_log)


def patched_image(put: PinUnderTest, options: RocmOptions) -> containers.PatchedImage:
    patches = tuple((outcome.name, Path(outcome.rendition)) for outcome in put.applied())
    return containers.PatchedImage(
        base_image=options.image_for(put.pin.version, put.pin.rocm_image),
        pin=put.pin.version,
        series_version=put.series_version,
        series_hash=put.series_hash,
        patches=patches,
        tools=tuple(sorted(CHECK_SCRIPTS.glob("*.py"))),
    )


def check_command(
    put: PinUnderTest, cell: Cell, options: RocmOptions, image: str, state: Path
) -> tuple[list[str], dict]:
    """The command the container runs for ``cell``, and the folders it needs mounted; ``state``
    keeps the baselines the spec cells of one pin share (plain greedy outputs, depth-3 speed)."""
    checks = f"{containers.TOOLS_DIR}/checks"
    if cell.check == "build":
        return ["python3", f"{checks}/build_check.py", *sorted({Path(k).name for k in put.touched_kernels})], {}
    profile = load_profile(PROFILE)
    model = options.model or os.environ.get("SGLPATCH_MODEL") or profile.model
    state.mkdir(parents=True, exist_ok=True)
    mounts = {str(state): (STATE_INSIDE, "rw"), str(options.hf_cache): (HF_INSIDE, "rw")}
    if Path(model).is_absolute():
        mounts[model] = (model, "ro")
    config = {"mode": cell.check, "timeout": options.server_timeout, "state": STATE_INSIDE, "image": image}
    if cell.check == "load":
        config["argv"] = profile.server_args(model)  # the profile as shipped: MTP at its own depth
    else:
        plain = {k: v for k, v in profile.server.items() if not k.startswith("speculative-")}
        config.update(
            depth=cell.depth,
            argv=depth_argv(profile, cell.depth, model),
            argv_depth3=depth_argv(profile, 3, model),
            argv_plain=type(profile)(**{**profile.__dict__, "server": plain}).server_args(model),
        )
    return ["python3", f"{checks}/serve_check.py", json.dumps(config)], mounts


def judge(cell: Cell, run: containers.ContainerRun, record: CellRecord) -> None:
    """The check definitions applied to what the container printed."""
    figures = last_json(run.log)
    where = f"{cell.check} in the patched image"
    if run.start_error:
        record.parts.append(Part(where, FAILED, f"the container did not start: {run.start_error}"[:600]))
        return
    if run.timed_out:
        record.parts.append(Part(where, FAILED, "timed out"))
        return
    if figures is None:
        record.parts.append(Part(where, FAILED, f"exit {run.exit_code}, no figures printed: {run.log.strip()[-400:]}"))
        return
    record.gpu = str(figures.pop("gpu", ""))
    record.figures.update(figures)
    if cell.check == "build":
        kernels = figures.get("kernels", {})
        failed = {k: v for k, v in kernels.items() if v}
        ok = kernels and not failed and run.exit_code == 0
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
    if cell.check == "load":
        text = figures.get("generate")
        record.parts.append(Part("one generate", PASSED if text else FAILED, repr(text)[:200]))
        return
    for part in spec_parts(cell.depth, record.figures):  # derived figures land in the record
        record.parts.append(part)


def spec_parts(depth: int, figures: dict) -> list[Part]:
    parts = []
    match = figures.get("prefix_match")
    if match is None:
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
    parts.append(Part(f"accept length at least {floor}", PASSED if accept is not None and accept >= floor else FAILED,
                      f"{accept} (floor {floor}, {source})"))
    speed, base = figures.get("decode_tok_s"), figures.get("depth3_decode_tok_s")
    if not speed or not base:
        parts.append(Part("decode speed not collapsed against depth 3", FAILED, f"depth {depth}: {speed}, depth 3: {base}"))
    else:
        ratio = speed / base
        figures["decode_ratio_vs_d3"] = round(ratio, 3)
        parts.append(Part("decode speed not collapsed against depth 3", PASSED if ratio >= COLLAPSE_RATIO else FAILED,
                          f"{speed:.1f} tok/s vs {base:.1f} at depth 3 (x{ratio:.2f}, floor x{COLLAPSE_RATIO})"))
    completed = figures.get("burst_completed") or 0
    parts.append(Part(f"{BURST} concurrent requests complete", PASSED if completed == BURST else FAILED,
                      f"{completed} of {BURST}; {figures.get('burst_errors') or ''}"))
    return parts
