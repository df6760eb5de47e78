"""The pin's tree repository (``build/trees/<version>``) and its ``sglpatch`` branch: cloned from
the cached pristine commit, and moved to an applied commit only where that drops nothing of the
user's -- no local change, no commit sglpatch did not make, no untracked file in the way -- in one
step that the next run finishes if it was interrupted.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from sglpatch.plumbing import cache, interrupts
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import IDENTITY_EMAIL, git_out, run_git
from sglpatch.sources.pristine_tree import PRISTINE_REF, Pristine

BRANCH = "sglpatch"
UPDATING_MARKER = "sglpatch-updating"


def ensure_tree_repo(tree_path: Path, pristine: Pristine) -> None:
    """The pin's tree repository, cloned from the cached pristine commit if it is not there."""
    if not (tree_path / ".git").is_dir():
        if tree_path.exists() and any(tree_path.iterdir()):
            raise SglpatchError(f"{tree_path}: exists and is not a git repository; move it away")
        staging = Path(tempfile.mkdtemp(dir=tree_path.parent, prefix=f".{tree_path.name}-"))
        try:
            # A clone from a path hardlinks the cached objects (cheap, and the tree survives a
            # cleared cache), and copies them where the cache is on another filesystem: git's
            # --local would refuse there ("failed to create link ... Invalid cross-device link").
            run_git(["clone", "--quiet", "--no-checkout", str(pristine.repo), str(staging)], tree_path.parent)
            # Until the first checkout finishes, the tree is ours to overwrite.
            (staging / ".git" / UPDATING_MARKER).write_text("first checkout\n")
            if tree_path.exists():
                tree_path.rmdir()
            os.replace(staging, tree_path)
        except BaseException:
            with contextlib.suppress(OSError):  # what stopped the clone is the error to say, not this
                cache.remove(staging)
            raise
    local = run_git(["rev-parse", "--verify", "--quiet", PRISTINE_REF], tree_path, check=False)
    if local.stdout.decode().strip() == pristine.commit:
        return
    if run_git(["cat-file", "-e", f"{pristine.commit}^{{commit}}"], tree_path, check=False).returncode:
        run_git(["fetch", "--quiet", str(pristine.repo), PRISTINE_REF], tree_path)
    run_git(["update-ref", PRISTINE_REF, pristine.commit], tree_path)


def clear_leftovers(tree_path: Path) -> None:
    """Private indexes and checkouts of a run that was killed; we hold the tree's lock, so no live
    run owns them."""
    for pattern in ("sglpatch-index-*", "sglpatch-witness-*"):
        for leftover in (tree_path / ".git").glob(pattern):
            cache.remove(leftover)


def _untracked_in_the_way(tree_path: Path, commit: str) -> list[str]:
    listing = run_git(["ls-files", "-z", "--others", "--exclude-standard"], tree_path).stdout.decode()
    untracked = [path for path in listing.split("\0") if path]
    if not untracked:
        return []
    present = run_git(["ls-tree", "-r", "-z", "--name-only", commit, "--", *untracked], tree_path).stdout.decode()
    return [path for path in present.split("\0") if path]


def check_clean(tree_path: Path) -> None:
    if (tree_path / ".git" / UPDATING_MARKER).exists():
        return  # an interrupted update of ours; move_branch finishes it
    status = git_out(["status", "--porcelain", "--untracked-files=no"], tree_path)
    if status:
        first = status.splitlines()[0]
        raise SglpatchError(
            f"{tree_path}: the tree has local changes ({first} ...); commit or discard them first"
        )


def local_commits(tree_path: Path, commit: str) -> list[str]:
    """Commits that moving the tree to ``commit`` would leave unreachable and that sglpatch did
    not make ("<hash> <subject>", newest first): the user's work on the branch or a detached HEAD.

    A commit is ours when its committer is sglpatch's fixed identity; one still reachable from
    ``commit``, the pristine branch, any other branch or tag, or ``refs/sglpatch/*`` (where
    ``sglpatch patch refresh`` keeps the commits it wrote into patches/) is not lost."""
    heads = []
    for ref in ("HEAD", f"refs/heads/{BRANCH}"):
        found = run_git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], tree_path, check=False)
        if found.returncode == 0:
            heads.append(found.stdout.decode().strip())
    if not heads:
        return []
    others = [
        line.split()[0]
        for line in run_git(
            ["for-each-ref", "--format=%(objectname) %(refname)", "refs/heads", "refs/tags", "refs/sglpatch"], tree_path
        )
        .stdout.decode()
        .splitlines()
        if line.split()[1] != f"refs/heads/{BRANCH}"
    ]
    listing = run_git(
        ["rev-list", "--format=%H%x00%ce%x00%s", "--no-commit-header", *dict.fromkeys(heads), "--not", commit, *others],
        tree_path,
    ).stdout.decode()
    lost = []
    for line in listing.splitlines():
        sha, email, subject = (line.split("\0") + ["", ""])[:3]
        if email != IDENTITY_EMAIL:
            lost.append(f"{sha[:12]} {subject}")
    return lost


def on_branch_at(tree_path: Path, commit: str) -> bool:
    """The tree has ``commit`` checked out on the sglpatch branch."""
    # One git for both: HEAD's commit, then the ref HEAD names ("HEAD" when detached); an unborn
    # HEAD fails the call.
    found = run_git(["rev-parse", "HEAD", "--symbolic-full-name", "HEAD", "--"], tree_path, check=False)
    return found.returncode == 0 and found.stdout.decode().split()[:2] == [commit, f"refs/heads/{BRANCH}"]


def refuse_to_lose_work(tree_path: Path, commit: str) -> None:
    """Refuse before anything is written when moving the tree to ``commit`` would drop the user's
    commits or overwrite their untracked files."""
    lost = local_commits(tree_path, commit)
    if lost:
        newest, oldest = lost[0].split()[0], lost[-1].split()[0]
        raise SglpatchError(
            f"{tree_path}: the {BRANCH} branch holds {len(lost)} commit(s) sglpatch did not make "
            f"({'; '.join(lost[:3])}{' ...' if len(lost) > 3 else ''}); applying would drop them. "
            f"Export them first (git -C {tree_path} format-patch -o <folder> {oldest}^..{newest}) "
            "or run again with --discard-local"
        )
    untracked = _untracked_in_the_way(tree_path, commit)
    if untracked:
        raise SglpatchError(
            f"{tree_path}: untracked file {untracked[0]}{' and others' if len(untracked) > 1 else ''} would be "
            "overwritten by the applied tree; move it away or run again with --discard-local"
        )


def move_branch(tree_path: Path, commit: str, at: bool | None = None) -> None:
    """Check out ``commit`` on the sglpatch branch; ``at``, where given, is ``on_branch_at`` asked
    under the same hold of the tree's lock."""
    git_dir = tree_path / ".git"
    marker = git_dir / UPDATING_MARKER
    if (on_branch_at(tree_path, commit) if at is None else at) and not marker.exists():
        return
    # Not stopped halfway by Ctrl-C (a kill still can: the marker tells the next run to finish it).
    with interrupts.whole(f"{tree_path}: branch {BRANCH} and its files moved to {commit[:12]}"):
        marker.write_text(commit + "\n")
        run_git(["update-ref", f"refs/heads/{BRANCH}", commit], tree_path)
        run_git(["symbolic-ref", "HEAD", f"refs/heads/{BRANCH}"], tree_path)
        run_git(["reset", "--quiet", "--hard", commit], tree_path)
        marker.unlink()
