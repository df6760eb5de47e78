"""Scratch checkouts of a commit's files, for witnesses and the judge to look at: written by git
itself from a private index, and moved from one commit to the next by writing only what differs.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from sglpatch.plumbing import cache
from sglpatch.plumbing.gitcmd import run_git


def checkout_commit(repo: Path, commit: str, dest: Path, paths: list[str] | None = None) -> Path:
    """The files of ``commit`` (only ``paths`` where given) written to ``dest`` (no .git), for a
    witness to look at: by git itself (a private index and ``checkout-index``, which refuses
    paths outside ``dest``)."""
    dest.mkdir(parents=True, exist_ok=True)
    if paths is not None and not paths:
        return dest
    which = ["--all"] if paths is None else ["-z", "--stdin"]
    names = None if paths is None else "\0".join(paths).encode(errors="surrogateescape") + b"\0"
    with tempfile.TemporaryDirectory(prefix="sglpatch-checkout-") as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        run_git(["read-tree", commit], repo, env=env)
        run_git(["--work-tree", str(dest), "checkout-index", "--force", *which], repo, env=env, input=names)
    return dest


def advance_checkout(repo: Path, folder: Path, old: str, new: str) -> Path:
    """Turn ``folder``, a checkout of ``old``, into one of ``new`` by writing only the paths that
    differ: a series touches a handful of a release's thousands of files. Where the folder no
    longer holds exactly ``old``'s paths (something wrote into it), it is checked out afresh."""
    if _checked_out_paths(folder) != set(tree_modes(repo, old)):
        cache.remove(folder)
        return checkout_commit(repo, new, folder)
    changed = run_git(["diff-tree", "-r", "-z", "--no-renames", "--name-status", old, new], repo).stdout
    fields = changed.decode(errors="surrogateescape").split("\0")
    written = []
    for status, path in zip(fields[0::2], fields[1::2]):
        target = folder / path
        if status == "D" or target.is_symlink() or target.exists():
            target.unlink(missing_ok=True)
        if status == "D":
            parent = target.parent
            while parent != folder and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
        else:
            written.append(path)
    if written:
        checkout_commit(repo, new, folder, written)
    return folder


def _checked_out_paths(folder: Path) -> set[str]:
    found = set()
    for root, dirs, files in os.walk(folder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            found.add(os.path.relpath(os.path.join(root, name), folder))
    return found


class Checkouts:
    """The commits witnesses look at, in one private folder removed afterwards: the first checked
    out, each next one made from the one before (the folder holds one commit at a time)."""

    def __init__(self, tree_path: Path):
        self.tree_path = tree_path
        self.folder: Path | None = None
        self.commit: str | None = None

    def __enter__(self) -> "Checkouts":
        return self

    def get(self, commit: str) -> Path:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(dir=self.tree_path / ".git", prefix="sglpatch-witness-"))
            checkout_commit(self.tree_path, commit, self.folder)
        elif commit != self.commit:
            advance_checkout(self.tree_path, self.folder, self.commit, commit)
        self.commit = commit
        return self.folder

    def __exit__(self, *exc) -> None:
        if self.folder is not None:
            cache.remove(self.folder)


def tree_modes(tree_path: Path, commit: str) -> dict[str, str]:
    """Every path of ``commit`` and its git mode ("100644", "120000" for a symbolic link, ...)."""
    listing = run_git(["ls-tree", "-r", "-z", "--full-tree", commit], tree_path).stdout.decode()
    modes = {}
    for entry in filter(None, listing.split("\0")):
        meta, path = entry.split("\t", 1)
        modes[path] = meta.split()[0]
    return modes
