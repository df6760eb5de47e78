"""Each patch's regression tests judged on the release its fix was written for, as ``sglpatch
check`` asks before anything is recorded: the series applied there in a scratch folder, every
witness run pristine and patched (answers kept as apply keeps them), and only what apply would
refuse reported - tests that pass on the pristine release they were written for, or that disagree
with the patch's own witness case by case (``witnesses.agreement``). Nothing of the project
changes: no tree, branch or lock entry is written.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.apply.apply_pins import apply_series
from sglpatch.apply.outcomes import FAILURES, Outcome
from sglpatch.apply.report import replay_mark
from sglpatch.plumbing.project import Project
from sglpatch.series.patches import load_series
from sglpatch.witnesses.results import REPLAY_MARK
from sglpatch.witnesses.upstream_test import release_written_for


@dataclass
class WhereWritten:
    """What the tests said where each fix was written: one line per patch judged, the refusals
    (apply would refuse them too) and what could not be judged here, with the reason."""

    judged: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)


def written_for(project: Project) -> dict[str, str]:
    """Each patch with regression tests -> the release its main file was written for (where no pin
    is such, the patch is left out: ``check``'s lint says what is wrong with its range)."""
    pins = tuple(project.pins().pins)
    found = {}
    for patch in load_series(project.patches_dir).patches:
        release = release_written_for(patch.main, pins) if patch.tests else None
        if release:
            found[patch.name] = release
    return found


def judge_where_written(project: Project) -> WhereWritten:
    """Apply the series, witnessed, on each release a patch with tests was written for, and say
    what its tests and witness said there."""
    wanted = written_for(project)
    judged = WhereWritten()
    if not wanted:
        return judged
    with tempfile.TemporaryDirectory(prefix="sglpatch-check-") as scratch:
        releases = [pin.version for pin in project.pins().pins if pin.version in set(wanted.values())]
        report = apply_series(project, releases, out_dir=Path(scratch), record=False)
    for result in report.results:
        for outcome in result.patches:
            if wanted.get(outcome.name) != result.version:
                continue
            where = f"{outcome.name} on {result.version}, the release the fix was written for"
            if outcome.status == Outcome.WITNESS_UNAVAILABLE:
                judged.unavailable.append(f"{where}: cannot tell: {outcome.detail}")
            elif outcome.status in FAILURES:
                judged.refused.append(f"{where}: {outcome.status}: {outcome.detail}")
            else:
                before, after = replay_mark(outcome, "pristine"), replay_mark(outcome, "patched")
                own = f"witness {outcome.witness_before}{before} -> {outcome.witness_after or '-'}{after}"
                tests = f"; tests {outcome.tests_before}{before} -> {outcome.tests_after or '-'}{after}" if outcome.tests_before else ""
                replayed = f" ({REPLAY_MARK} {result.replayed})" if result.replayed else ""
                judged.judged.append(f"{where}: {outcome.status}; {own}{tests}{replayed}")
    return judged
