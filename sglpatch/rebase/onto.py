"""Rebasing the series onto an sglang release that is not pinned (``sglpatch rebase <version>``).

The release -- newer than every pin, or between two -- is pinned from the package index. Each
patch's witness runs on the release's pristine tree first. Then a cascade of merge tools, each
a well-kept tool, proposes trees, nearest rendition first (``sglpatch.rebase.merge_tools``):

1. every rendition exactly as it is (``git apply``);
2. per rendition with a pinned tree it was made for (the nearest ``MERGE_CANDIDATES``): git's
   three-way apply; git's own merge (merge-ort, rename detection: a cherry-pick of the rendition's
   commit from the tree it was made for); Debian's ``wiggle``; then the same with the hunks the
   release already holds (each reverse-applies) and the files it removed left out;
3. where a proposal uses a name the release renamed around it, the same proposal with the
   release's name (``merge_tools.follow_renames``); where a line it adds uses a name the release
   lacks, that line as another rendition of the patch writes it (``merge_tools.sibling_lines``).

Every proposal is judged (``sglpatch.rebase.judge``) -- no name its added lines use missing from the
release, the witness bug on the pristine release and clean on the port, the patch's regression
tests (``patches/tests/<patch>/``, the ``upstream-test`` witness) passing on the port, every touched module
importing in the pin's CPU Python on the emulated box -- and the first accepted is taken. Each
patch ends as:

- ``carries-over``: a rendition applies as it is, or by git's three-way apply (which ``apply``
  repeats from the same blobs), and the judge accepts it; its ``Applies-To`` grows to take the
  release;
- ``new-rendition``: a merge tool's tree the judge accepts; a new rendition for review,
  ``Applies-To: ==<release>``, the step that made it in the report. The main file stays the newest
  rendition: one made for a release newer than every pin takes its place, and the old main text
  moves under ``renditions/``;
- ``already-upstream``: the witness passes on the pristine release and a rendition (perhaps one made
  for a file's new path) reverse-applies: the release holds this very change;
- ``fixed-upstream``: the witness passes and no rendition reverse-applies: upstream fixed it its
  own way. No rendition claims the release (``apply`` says not-applicable there);
- ``needs-hand-port`` (the judge refused every proposal, or no tool made one) and
  ``witness-unavailable``: a person must look. ``build/port/<release>/`` then holds the nearest
  candidate (zdiff3 conflict markers where git's merge conflicted), and ``sglpatch patch refresh
  <release>`` writes the edited tree back as the rendition (``sglpatch.rebase.hand_port``).

The report lists every try: the tool, what it changed, the judge's verdict and findings.

Nothing is written unless every patch is classified. Then the new pin, the renditions and the
changed ``Applies-To`` trailers are staged in a temporary copy of the project, linted, and the
series is applied there -- witnesses and all, lock updated -- to the release and to every pin whose
rendition changed. Only when that apply succeeds and agrees with the classification, and the
release's CPU matrix cells (build, load, speculative decoding at depths 1 to 6) pass on the staged
series -- the judge's last part, on the whole patched tree -- are the staged files moved into the
project (and put back as they were if a move fails; ``sglpatch.apply.staged``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from packaging.version import Version

from sglpatch.apply.outcomes import APPLIED_STATES, Outcome
from sglpatch.apply.staged import write_staged
from sglpatch.matrix.cpu import run_cpu_tier
from sglpatch.matrix.records import PASSED, CellRecord
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import git_out
from sglpatch.rebase.hand_port import prepare_hand_port
from sglpatch.rebase.new_pin import new_pin
from sglpatch.rebase.patch import Writes, rebase_patch
from sglpatch.rebase.refusals import release_to_port
from sglpatch.rebase.report import RebaseReport
from sglpatch.rebase.trial import Trial
from sglpatch.series.lock import LOCK_FILE
from sglpatch.series.patches import RENDITIONS_DIR, newest_in_main
from sglpatch.sources import pristine_tree
from sglpatch.sources.pins import with_pin

# What ``apply`` must then say on the release for each verdict, or nothing is written.
_APPLY_AGREES = {
    Outcome.CARRIES_OVER: APPLIED_STATES,
    Outcome.NEW_RENDITION: APPLIED_STATES,
    Outcome.ALREADY_UPSTREAM: (Outcome.NOT_NEEDED,),
    Outcome.FIXED_UPSTREAM: (Outcome.NOT_APPLICABLE,),
}


def rebase_onto(project, version: str, *, write: bool = True, backwards: bool = False) -> RebaseReport:
    """Classify every patch of the series on ``version``; with ``write``, and only when every patch
    is classified and the staged apply succeeds, pin it and write the renditions and the lock.
    A release older than every pin is refused unless ``backwards`` (``refusals.release_to_port``)."""
    pins = project.pins()
    version = release_to_port(pins, version, backwards=backwards)
    pin, note = new_pin(version)
    pristine = pristine_tree.pristine_from_index(pin)
    series = project.series()
    report = RebaseReport(version, pin.artifact, pin.sha256, pin.released, len(series.patches))
    writes = Writes()
    with tempfile.TemporaryDirectory(prefix="sglpatch-rebase-") as scratch:
        trial = Trial(Path(scratch), pin, pristine)
        for patch in series.patches:
            report.outcomes.append(rebase_patch(project, trial, patch, pins.pins, version, writes))
        report.tree = git_out(["rev-parse", f"{trial.parent}^{{tree}}"], trial.repo)
        left = [outcome for outcome in report.outcomes if outcome.verdict == Outcome.NEEDS_HAND_PORT and outcome.conflict]
        if left:
            prepared = prepare_hand_port(project, trial, version, left)
            # Under the project (build/port/V), or wherever SGLPATCH_OUT_DIR puts the build folder.
            report.prepared = str(prepared.relative_to(project.root) if prepared.is_relative_to(project.root) else prepared)
            for outcome in left:
                outcome.prepared = report.prepared
    # The main file stays the newest rendition: a rendition made for a release newer than every pin
    # takes its place, and its old text moves under renditions/.
    pinned = [pin.version for pin in pins.pins] + [version]
    for patch in series.patches:
        own = patch.main.path.parent / RENDITIONS_DIR / patch.stem
        mine = {path: text for path, text in writes.files.items() if path == patch.main.path or path.parent == own}
        writes.files.update(newest_in_main(patch, mine, pinned))
        for outcome in report.outcomes:
            if outcome.name == patch.name and outcome.rendition and writes.files.get(project.root / outcome.rendition, "") is None:
                outcome.rendition = str(patch.main.path.relative_to(project.root))
    # A file to remove that does not exist (the new rendition that went straight into the main file) is no change.
    report.files = sorted(str(path.relative_to(project.root)) for path, text in writes.files.items()
                          if text is not None or path.exists())
    report.files += ["upstream/pins.toml", LOCK_FILE]
    # What writing would refuse is said by a dry run too: a classification whose Applies-To cannot
    # be written is no port.
    if report.complete and writes.problems:
        report.error = "; ".join(writes.problems)
        return report
    if not write or not report.complete:
        return report
    changes = {path: None if text is None else text.encode() for path, text in writes.files.items()
               if text is not None or path.exists()}
    changes[pins.path] = with_pin(pins.path.read_text(), pin, note).encode()
    touched = sorted(
        {
            other.version
            for patch in series.patches
            for rendition in patch.renditions
            if rendition.path in writes.files
            for other in pins.pins
            if rendition.covers(other.version)
        },
        key=Version,
    )
    report.relocked = [*touched, version]
    try:
        write_staged(project, changes, report.relocked,
                     verify=lambda staged, applied: _agrees(applied, report) or _cells_refuse(staged, report))
    except SglpatchError as exc:
        report.error = str(exc)
        return report
    report.written = True
    return report


def pin_cells(staged, version: str) -> list[CellRecord]:
    """The release's CPU matrix cells on the staged series (``sglpatch.matrix.cpu``)."""
    return run_cpu_tier(staged, [version])


def _cells_refuse(staged, report: RebaseReport) -> str:
    """Why the release's CPU matrix cells refuse the staged series ("" when every one passed); a
    cell that could not run refuses it too."""
    records = pin_cells(staged, report.version)
    report.cells = [f"{record.cell_id} {record.outcome}" for record in records]
    report.cells_replayed = [record.cell_id for record in records if record.cached]
    if not records:
        return f"no CPU matrix cell ran on {report.version}"
    failed = [record for record in records if record.outcome != PASSED]
    if failed:
        replayed = " (replayed)" if failed[0].cached else ""
        return (f"the CPU matrix cell {failed[0].cell_id} says {failed[0].outcome}{replayed} on the staged series"
                f" ({len(failed)} of {len(records)} did not pass): {failed[0].reason}")
    return ""


def _agrees(applied, report: RebaseReport) -> str:
    """Where the staged apply says something other than the classification on the release, why."""
    result = next(result for result in applied.results if result.version == report.version)
    by_name = {outcome.name: outcome for outcome in result.patches}
    for outcome in report.outcomes:
        got = by_name.get(outcome.name)
        status = got.status if got else "missing"
        if status not in _APPLY_AGREES[outcome.verdict]:
            return f"{outcome.name}: the rebase says {outcome.verdict} on {report.version}, but apply says {status}"
    return ""
