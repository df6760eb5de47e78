"""One rendition on a tree held in a private index (``git apply --cached``): whether it applies
exactly and at which offsets, whether it reverse-applies (the tree already holds it), git's
three-way apply from the blobs the rendition was made on, where it does not match, and its commit
as ``git am`` would make it -- for ``apply`` on a pin, ``apply --into``, the upstream export and
``rebase`` on a release alike.

The three-way apply reads the pre-image blobs a rendition's ``index`` lines name. They are in the
pristine tree of a pin the rendition was made for, so those trees are lent to git for the one call
(``GIT_ALTERNATE_OBJECT_DIRECTORIES``): the repository applied to keeps no link to the cache. The
blobs are named by hash, so the tree it makes is the same whichever pin lent them.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import unidiff
from packaging.version import Version

from sglpatch.plumbing.gitcmd import commit_env, git_out, run_git
from sglpatch.series import diffs
from sglpatch.series.patches import RENDITIONS_DIR, PatchFile
from sglpatch.sources import pristine_tree
from sglpatch.sources.pins import Pin

_OFFSET_RE = re.compile(r"Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)")
_FAILED_AT_RE = re.compile(r"error: patch failed: (.+):(\d+)")
_INDEX_RE = re.compile(r"^index ([0-9a-f]{7,64})\.\.[0-9a-f]{7,64}", re.MULTILINE)
_DIFF_A_RE = re.compile(r"^diff --git a/(\S+) b/", re.MULTILINE)


@dataclass(frozen=True)
class ExactCheck:
    """``git apply --check -v`` of a diff on the index: whether it applies as it is, and what git said."""

    applies: bool
    stderr: str

    @property
    def offsets(self) -> str:
        """The hunks that applied away from their line ("hunk 2 at line 31 (offset 3)", ...); "" where none."""
        found = _OFFSET_RE.findall(self.stderr)
        return ", ".join(f"hunk {h} at line {line} (offset {off})" for h, line, off in found)


def check_exact(repo: Path, env: dict[str, str], diff: str) -> ExactCheck:
    checked = run_git(["apply", "--cached", "--check", "-v", "--whitespace=nowarn", "-"], repo, env=env,
                      input=diff.encode(errors="surrogateescape"), check=False)
    return ExactCheck(checked.returncode == 0, checked.stderr.decode())


def apply_to_index(repo: Path, env: dict[str, str], diff: str) -> str:
    """Apply ``diff`` exactly to the index ``env`` names; returns the tree it makes."""
    run_git(["apply", "--cached", "--whitespace=nowarn", "-"], repo, env=env, input=diff.encode())
    return git_out(["write-tree"], repo, env=env)


def reverse_applies(repo: Path, env: dict[str, str], diff: str) -> bool:
    """Whether ``diff`` reverse-applies on the index ``env`` names: the tree already holds it."""
    reverse = run_git(["apply", "--cached", "--check", "--reverse", "--whitespace=nowarn", "-"], repo, env=env,
                      input=diff.encode(), check=False)
    return reverse.returncode == 0


def preimage_blobs(diff: str) -> list[str]:
    """The (abbreviated) blob names a diff's ``index`` lines give its files before the change; a
    file the diff creates has none."""
    return list(dict.fromkeys(name for name in _INDEX_RE.findall(diff) if name.strip("0")))


def preimage_paths(diff: str) -> list[str]:
    """The paths of the files a diff changes as they were before it (``diff --git a/<path>``)."""
    return list(dict.fromkeys(_DIFF_A_RE.findall(diff)))


@dataclass(frozen=True)
class ThreeWay:
    """Git's three-way apply of a diff on the index: the tree it made ("" where it did not), the
    pin whose tree lent the pre-image blobs, and what stopped it."""

    tree: str
    lent_by: str = ""
    detail: str = ""


def three_way_to_index(repo: Path, env: dict[str, str], diff: str, bases: Iterable[tuple[str, Path]]) -> ThreeWay:
    """``git apply --cached --3way`` of ``diff`` on the index ``env`` names, the pre-image blobs read
    from the first of ``bases`` -- (pin, pristine repository), tried in order, each fetched only when
    reached -- that holds them all. Leaves the index as it was where it does not apply."""
    needed = preimage_blobs(diff)
    if not needed:
        return ThreeWay("", detail="the diff names no pre-image blob (no index lines), so git has no base to merge from")
    lent: list[str] = []
    for label, base in bases:
        lent.append(str(base / "objects"))
        borrowed = {**env, "GIT_ALTERNATE_OBJECT_DIRECTORIES": os.pathsep.join(lent)}
        if _holds(repo, borrowed, needed):
            before = git_out(["write-tree"], repo, env=env)
            merged = run_git(["apply", "--cached", "--3way", "--whitespace=nowarn", "-"], repo, env=borrowed,
                             input=diff.encode(), check=False)
            if merged.returncode == 0:
                return ThreeWay(git_out(["write-tree"], repo, env=borrowed), label)
            run_git(["read-tree", before], repo, env=env)
            said = merged.stderr.decode(errors="replace").strip().splitlines()
            return ThreeWay("", label, "three-way merge conflicts: " + "; ".join(said[-4:]))
    return ThreeWay("", detail=f"no pinned tree holds the blobs it was made on ({', '.join(needed)})")


def _holds(repo: Path, env: dict[str, str], blobs: list[str]) -> bool:
    found = run_git(["cat-file", "--batch-check=%(objecttype)"], repo, env=env,
                    input="".join(f"{blob}\n" for blob in blobs).encode(), check=False)
    return found.returncode == 0 and found.stdout.decode().split() == ["blob"] * len(blobs)


def made_on(rendition: PatchFile, pins: Iterable[Pin], version: str | None) -> Iterator[tuple[str, Path]]:
    """(pin, pristine repository) of each pin other than ``version`` whose tree may hold the blobs
    ``rendition`` was made on, for ``three_way_to_index``: the pin its file is named after first
    (``renditions/<patch>/<pin>.patch``), then every other pin it covers, nearest to ``version``
    first (newest first where ``version`` is None: a git base of the user's). Each is read only
    when the one before it did not hold the blobs: its pristine tree where the cache has it, else
    just the files the rendition changes, from its artifact (``sources.release_files``: a user's
    first ``apply --into`` then imports no second tree)."""
    pins = list(pins)
    ordered = sorted({pin.version for pin in pins} | ({version} if version else set()), key=Version)
    at = ordered.index(version) if version else len(ordered)
    covered = [pin for pin in pins if pin.version != version and rendition.covers(pin.version)]
    covered.sort(key=lambda pin: (pin.version != rendition.path.stem, abs(ordered.index(pin.version) - at),
                                  bool(version) and pin.parsed_version > Version(version)))
    paths = preimage_paths(rendition.diff_text)
    for pin in covered:
        cached = pristine_tree.cached_pristine(pin)
        yield pin.version, cached or pristine_tree.release_files(pin, paths)


def display_name(rendition: PatchFile) -> str:
    parts = rendition.path.parts
    return "/".join(parts[-3:]) if len(parts) >= 3 and parts[-3] == RENDITIONS_DIR else parts[-1]


def conflict_detail(where: str, patch_set: unidiff.PatchSet, stderr: str) -> str:
    match = _FAILED_AT_RE.search(stderr)
    if not match:
        return f"{where}: {stderr.strip()}"
    path, line = match.group(1), int(match.group(2))
    hunk = diffs.hunk_at(patch_set, path, line)
    if hunk is None:
        return f"{where}: {path}:{line} does not match"
    number, text = hunk
    return f"{where}: hunk {number} of {path} (at line {line}) does not match:\n{text.rstrip()}"


def commit_patch(tree_path: Path, rendition: PatchFile, tree: str, parent: str) -> str:
    """Commit ``tree`` on ``parent`` with the patch's author, date and message, as git am would."""
    with tempfile.TemporaryDirectory(prefix="sglpatch-mail-") as scratch:
        msg, patch = Path(scratch) / "msg", Path(scratch) / "patch"
        info = run_git(["mailinfo", str(msg), str(patch)], tree_path, input=rendition.raw).stdout.decode()
        fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line)
        body = msg.read_text()
    message = fields.get("Subject", "") + ("\n\n" + body if body.strip() else "\n")
    env = commit_env(fields.get("Author", ""), fields.get("Email", ""), fields.get("Date", ""))
    return git_out(["commit-tree", tree, "-p", parent], tree_path, env=env, input=message.encode())


def commit_as_patch(repo: Path, commit: str, *, zero_commit: bool = False) -> bytes:
    """The pin's own patch for one of its commits (``git format-patch``): what a plain ``git apply``
    or ``patch -p1`` without fuzz applies to that pin, however apply made the commit. With
    ``zero_commit`` its ``From`` line names no commit, as the series' files do."""
    return run_git(["format-patch", "-1", "--stdout", "--no-signature", *(["--zero-commit"] if zero_commit else []), commit],
                   repo).stdout


def add_tests_to_index(repo: Path, env: dict[str, str], tests) -> str:
    """A patch's regression tests (``series.RegressionTest``: ``path`` in upstream's repository,
    ``file`` beside the patch) added to the index at their upstream paths, as the patch's pull
    request adds them; returns the index's tree."""
    for test in tests:
        blob = git_out(["hash-object", "-w", str(Path(test.file).resolve())], repo)
        run_git(["update-index", "--add", "--cacheinfo", f"100644,{blob},{test.path}"], repo, env=env)
    return git_out(["write-tree"], repo, env=env)
