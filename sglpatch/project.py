"""The repository's layout and the whole-series operations that the CLI and nox sessions share.

A project is the folder holding ``upstream/pins.toml``, ``patches/`` and ``series.lock``; applied
trees land in ``build/trees/<version>`` and the report in ``build/apply-report.json`` unless told
otherwise.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sglpatch import cache, cpu_envs, progress, sources, workers
from sglpatch.apply import PinResult, apply_pin
from sglpatch.errors import SglpatchError
from sglpatch.lock import LOCK_FILE
from sglpatch.pins import Pins, load_pins
from sglpatch.series import Series, load_series
from sglpatch.suggest import Suggestion, status_suggestions

OUT_ENV = "SGLPATCH_OUT_DIR"


@dataclass(frozen=True)
class Project:
    root: Path
    # A staged or copied project (a rebase's staging, a leave-one-out copy) keeps every write under
    # its own root: ``$SGLPATCH_OUT_DIR`` would send its trees and records into the real build.
    sealed: bool = False

    @classmethod
    def find(cls, start: Path | None = None) -> "Project":
        here = (start or Path.cwd()).resolve()
        for candidate in (here, *here.parents):
            if (candidate / "upstream" / "pins.toml").is_file() and (candidate / "patches").is_dir():
                return cls(candidate)
        raise SglpatchError(f"{here}: not inside an sglpatch project (no upstream/pins.toml and patches/)")

    @property
    def pins_file(self) -> Path:
        return self.root / "upstream" / "pins.toml"

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def lock_file(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def build_dir(self) -> Path:
        if self.sealed:
            return self.root / "build"
        return Path(os.environ.get(OUT_ENV) or self.root / "build")

    def pins(self) -> Pins:
        return load_pins(self.pins_file)

    def series(self) -> Series:
        return load_series(self.patches_dir)


@dataclass
class ApplyReport:
    series_version: str
    series_digest: str
    results: list[PinResult]
    suggestions: list[Suggestion] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(result.ok for result in self.results)

    def to_dict(self) -> dict:
        return {
            "series": {"version": self.series_version, "digest": self.series_digest},
            "ok": self.ok,
            "pins": [asdict(result) for result in self.results],
            "status_suggestions": [asdict(suggestion) for suggestion in self.suggestions],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def apply_series(
    project: Project,
    pin_names: list[str] | None = None,
    *,
    update_lock: bool = False,
    out_dir: Path | None = None,
    git_url: str | None = None,
    report_path: Path | None = None,
    run_witnesses: bool = True,
    allow_unavailable: bool = False,
    discard_local: bool = False,
    record: bool = True,
    jobs: int = 1,
) -> ApplyReport:
    """Apply the series to the named pins (all by default), each independently. Without
    ``record`` nothing of the project changes: trees are built under ``out_dir`` and the lock is
    only compared (``sglpatch witness``). With ``jobs`` > 1 the pins are shared out among that
    many worker processes; each pin's tree and the lock are locked per entry, so the results are
    the same as one by one."""
    pins = project.pins()
    selected = pins.select(pin_names)
    series = project.series()
    trees = (out_dir or project.build_dir) / "trees"
    trees.mkdir(parents=True, exist_ok=True)
    options = dict(update_lock=update_lock, run_witnesses=run_witnesses, allow_unavailable=allow_unavailable,
                   discard_local=discard_local, record=record)
    if jobs > 1 and len(selected) > 1:
        results = _apply_in_workers(project, selected, series, trees, git_url, options, jobs)
    else:
        results = []
        for number, pin in enumerate(selected, 1):
            results.append(_apply_shown(project, pin, series, trees, git_url, options, f"{number}/{len(selected)}"))
    report = ApplyReport(series.version, series.digest(), results, status_suggestions(series, results))
    if record or report_path:
        destination = report_path or (out_dir or project.build_dir) / "apply-report.json"
        cache.write_atomically(destination, report.to_json() + "\n")
    return report


def _apply_shown(project, pin, series, trees, git_url, options, place: str) -> PinResult:
    with progress.step(f"sglang {pin.version} ({place})") as shown:
        result = _apply_one_pin(project, pin, series, trees, git_url, **options)
        shown.outcome = "ok" if result.ok else f"FAILED: {result.error[:160]}"
    return result


def _apply_in_workers(project, selected, series, trees, git_url, options, jobs) -> list[PinResult]:
    """The pins shared out among ``jobs`` worker processes (``workers.share_out``), each keeping
    to the pins of one CPU Python while it can, so each environment's fork server starts once."""
    numbered = [(f"{number}/{len(selected)}", pin) for number, pin in enumerate(selected, 1)]
    # In a log each worker prints its pins' lines; a live display belongs to this process alone,
    # which counts each pin as a worker reports it done.
    worker_mode = "lines" if progress.mode() == "lines" else "quiet"
    label = f"apply: {len(selected)} pins on {min(jobs, len(selected))} workers"
    with progress.step(label, total=len(selected)) as shown:
        done = []

        def count(item, result: PinResult) -> None:
            done.append(result)
            shown.advance()
            shown.update(f"{len(done)}/{len(selected)} pins done (sglang {result.version}: "
                         f"{'ok' if result.ok else 'FAILED'})")

        # Without witnesses no CPU Python is used, and none is looked up.
        groups = {pin.version: cpu_envs.env_group(pin) if options["run_witnesses"] else pin.version for pin in selected}
        work = functools.partial(_apply_numbered, project, series, trees, git_url, options)
        return workers.share_out(numbered, lambda item: groups[item[1].version], work, jobs,
                                 initializer=progress.configure, initargs=(worker_mode,), on_done=count)


def _apply_numbered(project, series, trees, git_url, options, item) -> PinResult:
    place, pin = item
    return _apply_shown(project, pin, series, trees, git_url, options, place)


def _apply_one_pin(project, pin, series, trees, git_url, **options) -> PinResult:
    try:
        pristine = sources.pristine_from_git(pin, git_url) if git_url else sources.pristine_from_index(pin)
    except SglpatchError as exc:
        return PinResult(version=pin.version, tree_path=str(trees / pin.version), error=str(exc))
    return apply_pin(pin, series, pristine, trees, project.lock_file, pins=project.pins().pins, **options)
