"""git in a user's own checkout (``apply --into``), as the user's git: their configuration and
identity, the git directory git itself names (a linked worktree's or a submodule's), refusals of
what git would refuse (an operation in progress, no identity), and of what could not be written
(a read-only mount, no permission) before anything is.
"""

from __future__ import annotations

import os
from pathlib import Path

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import run_git
from sglpatch.plumbing.processes import run_tool, user_git_env

USER_GIT_TIMEOUT_S = 300

# What git itself reads for the committer's identity, beside the configuration files in HOME.
IDENTITY_ENV = ("GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM",
                "GIT_CONFIG_NOSYSTEM")
# The operations git refuses to start another beside, by the file each leaves in the git
# directory (as git status tells them apart), with how git says to end each.
IN_PROGRESS = (
    ("rebase-merge", "a rebase is in progress", "git rebase --continue or git rebase --abort"),
    ("rebase-apply/applying", "'git am' is in progress", "git am --continue or git am --abort"),
    ("rebase-apply", "a rebase is in progress", "git rebase --continue or git rebase --abort"),
    ("MERGE_HEAD", "a merge is in progress", "git merge --continue or git merge --abort"),
    ("CHERRY_PICK_HEAD", "a cherry-pick is in progress", "git cherry-pick --continue or git cherry-pick --abort"),
    ("REVERT_HEAD", "a revert is in progress", "git revert --continue or git revert --abort"),
    ("BISECT_LOG", "a bisect is in progress", "git bisect reset"),
)


def git_path(checkout: Path, *names: str) -> list[Path]:
    """Where git keeps ``names`` for this checkout, as git itself says (``--git-path``): a linked
    worktree's or a submodule's git directory is not ``.git/``."""
    args = ["rev-parse", "--path-format=absolute", *(arg for name in names for arg in ("--git-path", name))]
    return [Path(line) for line in user_git(args, checkout).splitlines()]


def refuse_during_an_operation(checkout: Path) -> None:
    """Refused, as git refuses to start one operation inside another, while one is in progress."""
    for path, (_, what, how) in zip(git_path(checkout, *(name for name, _, _ in IN_PROGRESS)), IN_PROGRESS):
        if path.exists():
            raise SglpatchError(f"{checkout}: {what} there; finish it first ({how}); nothing was changed")


def require_committer(checkout: Path) -> None:
    """git's own answer for who commits here; where git has none, git's own request for one."""
    asked = run_tool(["git", "var", "GIT_COMMITTER_IDENT"], f"git var in {checkout}", USER_GIT_TIMEOUT_S,
                     cwd=checkout, env=user_env())
    if asked.returncode != 0:
        said = [line.strip() for line in asked.stderr.splitlines() if line.strip()]
        asks = [line for line in said if line.startswith("git config")]
        why = next((line for line in said if line.startswith("fatal:")), said[-1] if said else "no identity")
        raise SglpatchError(
            f"{checkout}: git says: {said[0] if said else 'Committer identity unknown'} ({why}). Please tell me who "
            f"you are: run {' and '.join(asks) or 'git config user.email / user.name'} (without --global: for this "
            "repository only); nothing was changed"
        )


def user_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return user_git_env({**{key: os.environ[key] for key in IDENTITY_ENV if key in os.environ}, **(extra or {})})


def is_git(checkout: Path) -> bool:
    inside = run_git(["rev-parse", "--show-toplevel"], checkout, check=False)
    return inside.returncode == 0 and Path(inside.stdout.decode().strip()).resolve() == checkout


def user_git(args: list[str], checkout: Path, env: dict[str, str] | None = None, input: bytes | None = None) -> str:
    """git in the user's checkout with the user's own configuration (identity, hooks stay theirs),
    of the caller's environment only what that needs (``processes.user_git_env``)."""
    done = run_tool(["git", *args], f"git {' '.join(args[:2])} in {checkout}", USER_GIT_TIMEOUT_S, cwd=checkout,
                    env=user_env(env), input=input or b"")
    if done.returncode != 0:
        raise SglpatchError(f"git {' '.join(args[:2])} failed in {checkout}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode().strip()


def discard(path: Path) -> None:
    """Remove a scratch file of ours while an error is on its way out: one that cannot be removed
    (a read-only git directory never had it) is left, so the error said is the one that stopped us."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def refuse_unless_writable(folders) -> None:
    """Refused, naming the folder and why, before anything is written, where git or we could not
    write: a read-only file system (a read-only mount of the checkout) or no permission."""
    for folder in folders:
        while not folder.exists() and folder != folder.parent:  # a folder the series creates: where it goes
            folder = folder.parent
        if not os.access(folder, os.W_OK):
            why = ("on a read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY
                   else "not writable by this user")
            raise SglpatchError(f"{folder}: {why}, so the series cannot be applied there; nothing was changed")


def has_branch(checkout: Path) -> bool:
    return run_tool(["git", "symbolic-ref", "--quiet", "HEAD"], f"git symbolic-ref in {checkout}", 60,
                    cwd=checkout, env=user_env()).returncode == 0
