"""The download and build cache, kept outside the repository and shared by concurrent runs.

Every entry is written under a temporary name and renamed into place only when complete, and every
writer holds a file lock for its entry, so pytest-xdist workers and parallel nox sessions can share
one cache; a reader that finds a half-written or damaged entry rebuilds it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from filelock import FileLock

CACHE_ENV = "SGLPATCH_CACHE_DIR"


def cache_root() -> Path:
    """$SGLPATCH_CACHE_DIR, else $XDG_CACHE_HOME/sglpatch, else ~/.cache/sglpatch."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        root = Path(explicit)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = Path(xdg) / "sglpatch"
    root.mkdir(parents=True, exist_ok=True)
    return root


def entry_lock(path: Path) -> FileLock:
    """The lock that guards building ``path``; it sits beside it, never inside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path) + ".lock")


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
