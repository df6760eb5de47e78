"""Renditions a neighbour reproduces (``sglpatch check --redundant-renditions``).

A rendition R of a patch is reproduced by its neighbour N (the rendition covering the pins just
before or just after R's) when, on every pin R covers, N applied by a low step of the cascade --
exactly, else git's three-way apply from the trees N was made for -- gives the very tree R gives.
Each pin's parent is its pristine release with the patches before this one applied as the lock
records them. Such an R can go, N's ``Applies-To`` taking its pins: ``apply`` makes the same trees
from N by that same step (``sglpatch patch tidy``, ``sglpatch.rebase.tidy``). This needs each pin's
pristine tree (built from its artifact once, then cached), so ``check`` runs it only when asked.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from sglpatch.apply.index_apply import made_on, three_way_to_index
from sglpatch.apply.outcomes import APPLIED_STATES
from sglpatch.plumbing.gitcmd import borrow_objects, git_out, run_git
from sglpatch.series.lock import read_lock
from sglpatch.series.patches import PatchFile, SeriesPatch
from sglpatch.sources import pristine_tree
from sglpatch.sources.pins import Pin



@dataclass
class Reproduced:
    """R, which its neighbour N reproduces on each of R's pins by ``step``."""

    patch: str
    rendition: str  # relative to the project
    neighbour: str
    step: str  # "exact" or "three-way"
    pins: list[str]

    def message(self) -> str:
        return (f"{self.rendition}: {self.neighbour} gives the same tree by its {self.step} apply on "
                f"{', '.join(self.pins)}; `sglpatch patch tidy` removes it")


def _covered(rendition: PatchFile, pins: tuple[Pin, ...]) -> list[Pin]:
    return [pin for pin in pins if rendition.covers(pin.version)]


def neighbours(patch: SeriesPatch, pins: tuple[Pin, ...]) -> list[tuple[PatchFile, list[PatchFile]]]:
    """Each rendition that covers a pin with the renditions next to it by version range (the one
    before and the one after), oldest first."""
    ranged = sorted(((r, _covered(r, pins)) for r in patch.renditions if _covered(r, pins)),
                    key=lambda pair: min(pin.parsed_version for pin in pair[1]))
    out = []
    for at, (rendition, _) in enumerate(ranged):
        beside = [ranged[i][0] for i in (at - 1, at + 1) if 0 <= i < len(ranged)]
        out.append((rendition, beside))
    return out


class _Workbench:
    """One scratch repository that borrows every pristine release's objects; trees are made in a
    private index with ``git apply --cached``."""

    def __init__(self, scratch: Path):
        self.repo = scratch / "redundant.git"
        run_git(["init", "--bare", "--quiet", str(self.repo)], scratch)
        self.env = {"GIT_INDEX_FILE": str(scratch / "index")}
        self.pristine: dict[str, pristine_tree.Pristine] = {}

    def pristine_of(self, pin: Pin) -> pristine_tree.Pristine:
        if pin.version not in self.pristine:
            self.pristine[pin.version] = pristine_tree.pristine_from_index(pin)
            borrow_objects(self.repo / "objects", [self.pristine[pin.version].repo])
        return self.pristine[pin.version]

    def apply(self, tree: str, diff: str, bases=None) -> str:
        """The tree ``diff`` makes on ``tree`` exactly, or with ``bases`` ((pin, pristine repository)
        as ``index_apply.made_on`` gives them) by git's three-way apply ("" when it does not apply)."""
        run_git(["read-tree", tree], self.repo, env=self.env)
        if bases is not None:
            return three_way_to_index(self.repo, self.env, diff, bases).tree
        done = run_git(["apply", "--cached", "--whitespace=nowarn", "-"], self.repo, env=self.env, input=diff.encode(), check=False)
        return git_out(["write-tree"], self.repo, env=self.env) if done.returncode == 0 else ""

    def as_apply_does(self, tree: str, rendition: PatchFile, pins: tuple[Pin, ...], version: str) -> str:
        """The tree ``apply`` makes from ``rendition`` on ``tree`` of pin ``version``: exactly, else three-way."""
        return self.apply(tree, rendition.diff_text) or self.apply(tree, rendition.diff_text, made_on(rendition, pins, version))


def reproduced_renditions(project) -> list[Reproduced]:
    """Every rendition of the series that a neighbour reproduces on all the pins it covers."""
    pins = project.pins().pins
    series = project.series()
    lock = read_lock(project.lock_file)["pins"]
    relative = lambda path: str(Path(path).relative_to(project.root))  # noqa: E731
    found = []
    with tempfile.TemporaryDirectory(prefix="sglpatch-redundant-") as scratch:
        bench = _Workbench(Path(scratch))
        parents: dict[tuple[str, int], str] = {}

        def parent(pin: Pin, index: int) -> str:
            """The pin's tree with the series' patches before ``index`` applied as the lock has them."""
            key = (pin.version, index)
            if key not in parents:
                if index == 0:
                    parents[key] = git_out(["rev-parse", f"{bench.pristine_of(pin).commit}^{{tree}}"], bench.repo)
                else:
                    below = parent(pin, index - 1)
                    earlier = series.patches[index - 1]
                    statuses = {p.get("name"): p.get("status") for p in lock.get(pin.version, {}).get("patches", [])}
                    rendition = earlier.for_version(pin.version)
                    applied = statuses.get(earlier.name) in APPLIED_STATES if statuses else rendition is not None
                    parents[key] = ((bench.as_apply_does(below, rendition, pins, pin.version) or below)
                                    if rendition and applied else below)
            return parents[key]

        for index, patch in enumerate(series.patches):
            for rendition, beside in neighbours(patch, pins):
                covered = sorted(_covered(rendition, pins), key=lambda pin: Version(pin.version))
                own = {pin.version: bench.as_apply_does(parent(pin, index), rendition, pins, pin.version) for pin in covered}
                if not all(own.values()):
                    continue  # a rendition that holds the release verbatim (not applied there) makes no tree to compare
                for neighbour in beside:
                    step = _reproduces(bench, neighbour, [(parent(pin, index), own[pin.version]) for pin in covered],
                                       pins, covered)
                    if step:
                        found.append(Reproduced(patch.name, relative(rendition.path), relative(neighbour.path), step,
                                                [pin.version for pin in covered]))
    return found


def _reproduces(bench: _Workbench, neighbour: PatchFile, cases: list[tuple[str, str]], pins: tuple[Pin, ...],
                covered: list[Pin]) -> str:
    """"exact" or "three-way" where ``neighbour`` gives the wanted tree on every (parent, wanted)
    case -- one per pin of ``covered`` -- by that step (the lowest that does for all of them), else ""."""
    if all(bench.apply(parent, neighbour.diff_text) == wanted for parent, wanted in cases):
        return "exact"
    if all(bench.apply(parent, neighbour.diff_text, made_on(neighbour, pins, pin.version)) == wanted
           for (parent, wanted), pin in zip(cases, covered)):
        return "three-way"
    return ""
