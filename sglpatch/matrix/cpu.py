"""The CPU tier: runs a cell's check here, on the real code of the patched pin, and records it.

Compile witnesses, the pin's own Python imported under HIP emulation, its ``ServerArgs`` and
quantization resolution (the checks are in ``cpu_checks``). CPU cells are cached by the patched and
pristine tree hashes and the code that checks them, so a warm re-run of the whole tier costs seconds.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import time
from pathlib import Path

from sglpatch.apply.pin_under_test import PinUnderTest, prepare_pin, remove_checkouts
from sglpatch.matrix.cells import DEPTHS, PROFILE, Cell, cells, validate_cell
from sglpatch.matrix.cpu_checks import build_cell, code_digest, load_cell, spec_cells
from sglpatch.matrix.records import FAILED, PASSED, SKIPPED, CellRecord, Part, cell_id, combine, matrix_dir, write_record
from sglpatch.plumbing import cache, progress, workers
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.project import Project
from sglpatch.serving.profile import load_profile
from sglpatch.witnesses import answer_cache, cpu_envs
from sglpatch.witnesses.rocm_guard import RocmGuardWitness

CELLS = cache.Memo("matrix-cpu")
# The keys this process computed and kept (the spec check answers every depth of a pin at once):
# a later cell of the same run that reads one back ran in this run, it was not replayed; each with
# where the parts of that run gave back kept answers.
_ANSWERED_HERE: dict[str, list[str]] = {}


def _cell_key(put: PinUnderTest, cell: Cell) -> str | None:
    """A digest of what a cell's answer read: the patched and pristine trees, the checking code,
    the launch profile's content, the CPU environment with its installed versions, and what the
    compile witness runs with (the toolchain's stamp and level, the tvm-ffi headers). None before
    the pin's CPU environment is built: nothing can be looked up or kept for it yet."""
    if not cpu_envs.env_built(put.pin):
        return None
    key = "\0".join([cell.check, cell.pin, str(cell.depth), put.patched_tree, put.pristine_tree, code_digest(),
                     load_profile(PROFILE).content_digest(), cpu_envs.env_fingerprint(put.pin),
                     RocmGuardWitness().fingerprint(put.pin)])
    return f"{cell.check}-{cell.pin}-{cell.depth or 0}-{hashlib.sha256(key.encode()).hexdigest()[:32]}"


def run_cpu_cell(project: Project, cell: Cell, *, use_cache: bool = True) -> CellRecord:
    """Run one CPU cell (spec runs every depth of the pin at once and caches each) and write its
    record and log under ``build/matrix``."""
    try:
        return _shown_cell(project, cell, use_cache)
    finally:
        remove_checkouts()


def _shown_cell(project: Project, cell: Cell, use_cache: bool) -> CellRecord:
    validate_cell(cell)
    with progress.step(cell_id(cell.tier, cell.check, cell.pin, cell.depth)) as shown:
        record = _run_cell(project, cell, use_cache)
        shown.outcome = record.outcome + (" (cached)" if record.cached else "")
    return record


def _run_cell(project: Project, cell: Cell, use_cache: bool) -> CellRecord:
    """The cell's kept record (``cached``), or its parts run now; ``cached`` too, with
    ``figures["replayed"]`` naming them, where a part gave back a kept answer. Without
    ``use_cache`` nothing kept by another process is given back, a witness's answer included."""
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
    key = _cell_key(put, cell)
    kept = CELLS.get(key) if use_cache and key is not None else None
    if kept is not None:
        try:
            record = CellRecord.from_dict(kept)
            if key in _ANSWERED_HERE:
                record.cached = bool(_ANSWERED_HERE[key])
                if _ANSWERED_HERE[key]:
                    record.figures["replayed"] = _ANSWERED_HERE[key]
            else:
                record.cached = True
            # The answer read the trees, not the patch files: a series that gives the same trees
            # (renditions tidied, a message edited) reuses it, and the record names the series run now.
            record.series_version, record.series_hash = put.series_version, put.series_hash
            return _finish(record, out, log_path, started, None)
        except (ValueError, TypeError, KeyError):
            CELLS.path(key).unlink(missing_ok=True)
    with contextlib.ExitStack() as scope:
        if not use_cache:
            scope.enter_context(answer_cache.rerun())  # every part runs again, the witnesses' too
        replayed = scope.enter_context(answer_cache.replays_seen())
        answered = set(_ANSWERED_HERE)
        record, log = _run_fresh(put, cell)
    for kept in set(_ANSWERED_HERE) - answered:
        _ANSWERED_HERE[kept] = list(dict.fromkeys(replayed))
    if replayed:
        # A part that gave back a kept answer did not run now: the record says which.
        record.cached = True
        record.figures["replayed"] = list(dict.fromkeys(replayed))
        log = [*log, *(f"replayed, not run now: {where}" for where in record.figures["replayed"])]
    return _finish(record, out, log_path, started, log)


def _run_fresh(put: PinUnderTest, cell: Cell) -> tuple[CellRecord, list[str]]:
    if cell.check == "spec":
        records = {depth: _new_record(Cell(cell.tier, "spec", cell.pin, depth), put) for depth in DEPTHS}
        logs = spec_cells(put, records)
        for depth, record in records.items():
            _remember(put, Cell(cell.tier, "spec", cell.pin, depth), record)
        return records[cell.depth], logs[cell.depth]
    record = _new_record(cell, put)
    log = (build_cell if cell.check == "build" else load_cell)(put, record)
    _remember(put, cell, record)
    return record, log


def _new_record(cell: Cell, put: PinUnderTest) -> CellRecord:
    return CellRecord(
        tier=cell.tier, check=cell.check, pin=cell.pin, depth=cell.depth,
        series_version=put.series_version, series_hash=put.series_hash, outcome=SKIPPED,
        gpu="none: HIP emulation of 8x MI355X (gfx950) on CPU", tree=put.patched_tree,
    )


def _remember(put: PinUnderTest, cell: Cell, record: CellRecord) -> None:
    """Only settled answers are cached: a skipped part may run next time (a toolchain, a witness,
    a child that hung). The key is taken after the run, when the environment it used is built."""
    record.outcome, record.reason = combine(record.parts)
    key = _cell_key(put, cell)
    if record.outcome in (PASSED, FAILED) and key is not None:
        CELLS.put(key, json.loads(record.to_json()))
        _ANSWERED_HERE[key] = []


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


def run_cpu_tier(project: Project, pins: list[str] | None = None, *, use_cache: bool = True, jobs: int = 1) -> list[CellRecord]:
    """Every CPU cell of the pins (all by default) in this process, or in ``jobs`` worker
    processes that each take whole pins: the fork servers of the CPU Python, the prepared pins
    and the per-pin probe run are shared by a pin's cells, instead of one process per cell."""
    selected = project.pins().select(pins)
    # One run for all the workers: under --no-cache a compile pass one of them made in this run is
    # given back to the other, not made again (nor waited for and then made again). Each pin is
    # still prepared as apply prepares it (its answers given back), outside its cells' rerun().
    with cache.one_run():
        return _tier_cells(project, selected, use_cache, jobs)


def _tier_cells(project: Project, selected, use_cache: bool, jobs: int) -> list[CellRecord]:
    versions = [pin.version for pin in selected]
    if jobs <= 1 or len(versions) <= 1:
        return [record for version in versions for record in _pin_cells(project, version, use_cache)]
    # In a log each worker's cells are lines; on a terminal the live display belongs to this
    # process alone (a worker writing under it would garble it), so it counts the pins.
    worker_mode = "lines" if progress.mode() == "lines" else "quiet"
    with progress.step(f"CPU tier: {len(versions)} pins on {jobs} workers", total=len(versions)) as shown:
        groups = {pin.version: cpu_envs.env_group(pin) for pin in selected}
        done = []

        def count(version: str, records: list[CellRecord]) -> None:
            done.append(version)
            shown.advance()
            shown.update(f"{len(done)}/{len(versions)} pins done ({version})")

        per_pin = workers.share_out(versions, groups.get, functools.partial(_pin_cells, project, use_cache=use_cache),
                                    jobs, initializer=progress.configure, initargs=(worker_mode,), on_done=count)
    return [record for records in per_pin for record in records]


def _pin_cells(project: Project, version: str, use_cache: bool) -> list[CellRecord]:
    """A pin's cells, sharing its scratch checkout (removed when the last is done)."""
    try:
        return [_shown_cell(project, cell, use_cache) for cell in cells([version], ("cpu",))]
    finally:
        remove_checkouts()
