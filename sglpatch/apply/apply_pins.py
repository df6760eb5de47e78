"""The series applied to many pins at once, one report for all: what ``sglpatch apply`` and
``sglpatch witness`` run, one pin after another or shared out among worker processes."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sglpatch.apply.one_pin import PinResult, apply_pin
from sglpatch.plumbing import cache, interrupts, progress, workers
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.project import Project
from sglpatch.sources import pristine_tree
from sglpatch.upstream.suggest import Suggestion, status_suggestions
from sglpatch.witnesses import cpu_envs


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
    report = ApplyReport(series.version, series.digest(), results, status_suggestions(series, results, pins.pins))
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
        done, started = [], {}

        def count(item, result: PinResult) -> None:
            done.append(result)
            started.pop(result.version, None)
            if result.ok and options["record"]:
                interrupts.changed(f"sglang {result.version} applied in {result.tree_path}")
            shown.advance()
            shown.update(f"{len(done)}/{len(selected)} pins done (sglang {result.version}: "
                         f"{'ok' if result.ok else 'FAILED'})")

        # Without witnesses no CPU Python is used, and none is looked up.
        groups = {pin.version: cpu_envs.env_group(pin) if options["run_witnesses"] else pin.version for pin in selected}
        work = functools.partial(_apply_numbered, project, series, trees, git_url, options)
        try:
            return workers.share_out(numbered, lambda item: groups[item[1].version], work, jobs,
                                     initializer=progress.configure, initargs=(worker_mode,), on_done=count,
                                     on_start=lambda item: started.setdefault(item[1].version, item[1]))
        except KeyboardInterrupt:
            # A worker's pin is moved whole or not at all (``interrupts.whole``), but what it had
            # done when it stopped stays in the worker: say what may have changed.
            if options["record"]:
                for version in started:
                    interrupts.may_have_changed(f"sglang {version}'s tree and lock entry are as they were, or applied whole")
            raise


def _apply_numbered(project, series, trees, git_url, options, item) -> PinResult:
    place, pin = item
    return _apply_shown(project, pin, series, trees, git_url, options, place)


def _apply_one_pin(project, pin, series, trees, git_url, **options) -> PinResult:
    try:
        pristine = pristine_tree.pristine_from_git(pin, git_url) if git_url else pristine_tree.pristine_from_index(pin)
    except SglpatchError as exc:
        return PinResult(version=pin.version, tree_path=str(trees / pin.version), error=str(exc))
    return apply_pin(pin, series, pristine, trees, project.lock_file, pins=project.pins().pins, **options)
