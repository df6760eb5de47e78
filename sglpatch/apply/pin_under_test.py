"""The pin under test: a pin with the series applied, its trees, and what the series touches there.

What the matrix's tiers check, the patched image is built from (``sglpatch.rocm.image``) and the
bench measures."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.apply.apply_pins import apply_series
from sglpatch.apply.checkouts import Checkouts
from sglpatch.apply.one_pin import PinResult
from sglpatch.apply.outcomes import Outcome
from sglpatch.matrix.records import matrix_dir
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import git_out
from sglpatch.plumbing.project import Project
from sglpatch.series import diffs
from sglpatch.sources.pins import Pin


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
        return [o for o in self.result.patches if o.commit and o.status not in (Outcome.NOT_NEEDED, Outcome.NOT_APPLICABLE)]


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
        if rendition is None or outcome is None or outcome.status == Outcome.NOT_APPLICABLE:
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


# The pin's one scratch checkout, moved between the commits its checks look at: a whole checkout
# writes some 5,000 files (3 s of this disk's time), and every witness of every cell wrote its own.
# It lives in the temporary folder, not the tree's .git: each cell applies the pin again first,
# and apply clears what it finds there as a killed run's leftovers.
_CHECKOUTS: dict[Path, Checkouts] = {}


def checkout(put: PinUnderTest, commit: str) -> Path:
    """A scratch checkout of one commit of the pin, until the next call for the pin or
    ``remove_checkouts``: the pin's one folder, moved to the commit (only the files that differ
    are written; one something wrote into is checked out afresh)."""
    within = Path(tempfile.gettempdir())
    return _CHECKOUTS.setdefault(put.tree_path, Checkouts(put.tree_path, within=within)).get(commit)


def remove_checkouts() -> None:
    while _CHECKOUTS:
        _CHECKOUTS.popitem()[1].close()
