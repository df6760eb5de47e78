"""A pin's applied series for the tools people already use (``sglpatch export``): a quilt folder
for ``quilt push -a``, an mbox for ``git am``, each patch as the lock pins it for that pin."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from sglpatch.apply.index_apply import commit_as_patch
from sglpatch.apply.into import locked_series
from sglpatch.plumbing import cache
from sglpatch.plumbing.errors import SglpatchError


def locked_patches(project, version: str) -> list[tuple[str, bytes]]:
    """(series name, the pin's own patch) of every patch the lock applies to ``version``: its
    commit as the lock pins it (``into.locked_series``, checked there), as ``git format-patch``
    writes it. Not the rendition file: one that apply merged three-way gives the pin's change
    only through git's merge, and plain ``quilt push`` or ``git am`` cannot do that."""
    pin = project.pins().select([version])[0]
    with locked_series(project, pin) as locked:
        return [(name, commit_as_patch(locked.repo, commit)) for (name, _), commit in zip(locked.renditions, locked.commits)]


def export_quilt(project, version: str, dest: Path) -> Path:
    """The pin's applied series as a quilt folder: each patch as locked for the pin under its series
    name, and a ``series`` file in order (``QUILT_PATCHES=DEST quilt push -a`` on the pristine tree)."""
    if dest.exists() and any(dest.iterdir()):
        raise SglpatchError(f"{dest}: exists and is not empty; choose an empty or new folder")
    applied = locked_patches(project, version)
    staging = Path(tempfile.mkdtemp(dir=dest.parent if dest.parent.exists() else None, prefix=".sglpatch-quilt-"))
    try:
        for name, text in applied:
            (staging / name).write_bytes(text)
        (staging / "series").write_text(
            f"# sglpatch series for sglang {version}, applied in this order (-p1)\n" + "".join(f"{n}\n" for n, _ in applied)
        )
        if dest.exists():
            dest.rmdir()
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(dest))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def export_mbox(project, version: str, dest: Path) -> Path:
    """The pin's applied series as one mbox, in order, each patch as locked for the pin, for
    ``git am`` on the pristine tree."""
    if dest.exists():
        raise SglpatchError(f"{dest}: exists; choose a new file name")
    applied = locked_patches(project, version)
    cache.write_atomically(dest, b"".join(text if text.endswith(b"\n") else text + b"\n" for _, text in applied))
    return dest
