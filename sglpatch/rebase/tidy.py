"""Fewer renditions (``sglpatch patch tidy``): a rendition its neighbour reproduces goes, and the
main file in ``patches/`` is the newest rendition.

A rendition R that its neighbour N reproduces -- the very same tree, by N's exact or three-way
apply, on every pin R covers (``sglpatch.rebase.redundant``) -- is removed and N's ``Applies-To``
grows to take R's pins: ``apply`` then makes those trees from N by that same step, and the lock
still pins every tree. Where both reproduce each other the older goes (the newer is nearer the
next release). One removal changes what N covers, so the search runs again after each, until
nothing is left to remove.

The main file is the rendition that covers the newest pin: a reviewer, the upstream export and
the next release's rebase all start from it. Where another file covers the newest pin, its text
becomes the main file and the main file's text moves to ``renditions/<patch>/<pin>.patch``, named
after the newest pin it covers.

Nothing is written unless the series, staged with the changes, passes ``check`` and applies to
every pin a changed rendition covers with each pin's tree the lock's (``sglpatch.apply.staged``); the
lock's commits are recorded again there, since a rendition's message carries its ``Applies-To``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from sglpatch.apply.staged import write_staged
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.project import Project
from sglpatch.rebase.redundant import Reproduced, reproduced_renditions
from sglpatch.series.lock import LOCK_FILE
from sglpatch.series.patches import covered_by, newest_in_main, set_trailers, spec_for


@dataclass
class TidyReport:
    removed: list[str] = field(default_factory=list)  # one line per rendition removed, and why
    moved: list[str] = field(default_factory=list)  # main-file swaps
    pins: list[str] = field(default_factory=list)  # the pins applied again, each to the lock's tree
    written: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.removed or self.moved)


def tidy_renditions(project, *, write: bool = True) -> TidyReport:
    """Remove every rendition a neighbour reproduces and keep the newest in the main file; with
    ``write``, staged and applied first (see the module's docstring)."""
    report = TidyReport()
    if not project.lock_file.exists():
        raise SglpatchError(f"{project.lock_file}: not found; tidy keeps every pin's tree the lock's, so "
                            "run `sglpatch apply --update-lock` first")
    pinned = [pin.version for pin in project.pins().pins]
    with tempfile.TemporaryDirectory(prefix="sglpatch-tidy-") as scratch:
        copy = Path(scratch) / "project"
        for part in ("upstream", "patches"):
            shutil.copytree(project.root / part, copy / part)
        shutil.copy2(project.lock_file, copy / LOCK_FILE)
        view = Project(copy, sealed=True)
        while True:
            chosen = _choose(reproduced_renditions(view), view, pinned)
            if chosen is None:
                break
            report.removed.append(_remove(view, chosen, pinned))
        series = view.series()
        for patch in series.patches:
            swapped = newest_in_main(patch, {}, pinned)
            for path, text in swapped.items():
                if text is None:
                    path.unlink()
                else:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
            if swapped:
                moved = [str(p.relative_to(copy)) for p, t in swapped.items() if t is not None and p != patch.main.path]
                report.moved.append(f"{patch.name}: the newest rendition is now the main file"
                                    + (f"; its old text is {moved[0]}" if moved else ""))
        changes = _changes(project.root, copy)
    if not changes:
        return report
    old_series = project.series()
    report.pins = sorted({version for patch in old_series.patches for r in patch.renditions if r.path in changes
                          for version in pinned if r.covers(version)}, key=Version)
    if not write:
        return report
    lock = json.loads(project.lock_file.read_text())["pins"]
    write_staged(project, changes, report.pins, verify=lambda staged, applied: _same_trees(applied, lock))
    report.written = True
    return report


def _choose(notes: list[Reproduced], view, pinned: list[str]) -> Reproduced | None:
    """The rendition to remove first: one whose reproducing neighbour is newer, else any."""
    def first_pin(relative: str) -> Version:
        text = (view.root / relative).read_text()
        return min((Version(v) for v in covered_by(text, pinned)), default=Version("0"))

    newer = [note for note in notes if first_pin(note.neighbour) > first_pin(note.rendition)]
    return (newer or notes or [None])[0]


def _remove(view, note: Reproduced, pinned: list[str]) -> str:
    """R goes and N takes its pins; where R is the main file, N's text takes its place."""
    rendition, neighbour = view.root / note.rendition, view.root / note.neighbour
    text = neighbour.read_text()
    pins = sorted(set(covered_by(text, pinned)) | set(note.pins), key=Version)
    spec = spec_for(pins, pinned)
    if spec is None:
        raise SglpatchError(f"{note.neighbour}: with {note.rendition}'s pins its pins {pins} are no single range")
    main = view.root / "patches" / note.patch
    if rendition == main:
        main.write_text(set_trailers(text, {"Applies-To": spec}))
        neighbour.unlink()
        how = f"{note.neighbour} takes its place"
    else:
        neighbour.write_text(set_trailers(text, {"Applies-To": spec}))
        rendition.unlink()
        how = f"{note.neighbour} covers its pins"
    return (f"{note.rendition}: {note.neighbour} gives the same tree by its {note.step} apply on "
            f"{', '.join(note.pins)}; {how} (Applies-To: {spec})")


def _changes(root: Path, copy: Path) -> dict[Path, bytes | None]:
    """What differs under patches/ between the project and the copy: new bytes, None where removed."""
    old = {path.relative_to(root) for path in (root / "patches").rglob("*.patch")}
    new = {path.relative_to(copy) for path in (copy / "patches").rglob("*.patch")}
    changes: dict[Path, bytes | None] = {}
    for relative in sorted(old | new):
        before = (root / relative).read_bytes() if relative in old else None
        after = (copy / relative).read_bytes() if relative in new else None
        if before != after:
            changes[root / relative] = after
    return changes


def _same_trees(applied, lock: dict) -> str:
    """Where a pin's tree is not the lock's, which and how; "" where every tree is."""
    for result in applied.results:
        locked = lock.get(result.version, {}).get("tree")
        if result.tree != locked:
            return f"sglang {result.version}: the tidied series gives tree {result.tree[:12]}, the lock has {str(locked)[:12]}"
    return ""
