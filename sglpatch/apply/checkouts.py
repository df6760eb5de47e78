"""Scratch checkouts of a commit's files, for witnesses and the judge to look at: written by git
itself from a private index, and moved from one commit to the next by writing only what differs,
each time checked to hold exactly the commit (``Checkouts``).
"""

from __future__ import annotations

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


class Checkouts:
    """The commits witnesses look at, in one private folder removed afterwards, each one exactly
    the commit it is asked for: the first checked out with a private index that records every
    file's state, each next one moved from the one before by git (``read-tree -m -u``: only the
    files that differ are written). Before each move or reuse the folder is compared with that
    index (``git diff-files``, and ``git ls-files --others`` for files added: what ``git status
    --porcelain`` reports); a folder something wrote into (a witness, a patch's regression test)
    is checked out afresh, never moved on with the change still in it, and so is one that is gone.

    The folder is made in ``within``: by default the tree's ``.git``, where apply, holding the
    tree's lock, removes what a killed run left; checks that run without that lock and across
    several applies of the pin (the matrix's cells) keep theirs elsewhere, so an apply between two
    of them does not take it away."""

    def __init__(self, tree_path: Path, within: Path | None = None):
        self.tree_path = tree_path
        self.within = within
        self.folder: Path | None = None
        self.commit: str | None = None
        self.index: Path | None = None
        self.refreshed: list[list[str]] = []  # the changes found (and dropped) before each fresh checkout

    def __enter__(self) -> "Checkouts":
        return self

    def _git(self, args: list[str]):
        return run_git(["--work-tree", str(self.folder), *args], self.tree_path, env={"GIT_INDEX_FILE": str(self.index)})

    def changes(self) -> list[str]:
        """The folder's paths that are not the commit's as checked out: modified, removed or added."""
        modified = self._git(["diff-files", "--name-only", "-z"]).stdout
        added = self._git(["ls-files", "--others", "-z"]).stdout
        return sorted({name.decode(errors="surrogateescape") for name in (modified + added).split(b"\0") if name})

    def get(self, commit: str) -> Path:
        if self.folder is not None and not (self.folder.is_dir() and self.index.is_file()):
            self._remove()  # gone: nothing in it to record, only its leftover half to clear
        if self.folder is not None:
            changed = self.changes()
            if changed:
                self.refreshed.append(changed)
                self._remove()
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(dir=self.within or self.tree_path / ".git", prefix="sglpatch-witness-")).resolve()
            self.index = self.folder.with_name(self.folder.name + ".index")
            self._git(["read-tree", commit])
            self._git(["checkout-index", "--all", "--force", "-u"])
        elif commit != self.commit:
            self._git(["read-tree", "-m", "-u", self.commit, commit])
        self.commit = commit
        return self.folder

    def _remove(self) -> None:
        if self.folder is not None:
            cache.remove(self.folder)
        if self.index is not None:
            self.index.unlink(missing_ok=True)
        self.folder = self.index = self.commit = None

    def close(self) -> None:
        """The folder and its index removed."""
        self._remove()

    def __exit__(self, *exc) -> None:
        self.close()


def tree_modes(tree_path: Path, commit: str) -> dict[str, str]:
    """Every path of ``commit`` and its git mode ("100644", "120000" for a symbolic link, ...)."""
    listing = run_git(["ls-tree", "-r", "-z", "--full-tree", commit], tree_path).stdout.decode()
    modes = {}
    for entry in filter(None, listing.split("\0")):
        meta, path = entry.split("\t", 1)
        modes[path] = meta.split()[0]
    return modes
