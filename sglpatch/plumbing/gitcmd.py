"""Running git with an environment that makes its results the same on every machine.

User and system git configuration (autocrlf, apply.whitespace, hooks, signing) could change the
trees and commits we produce, so every call ignores both and pins the locale.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.processes import NETWORK, declared_env

IDENTITY_NAME = "sglpatch"
IDENTITY_EMAIL = "sglpatch@localhost"
# Long enough for the biggest real operation (importing or cloning a 5,800-file release takes
# seconds); a git that runs past it is hung (a lock, a credential prompt, a dead remote).
GIT_TIMEOUT_S = 900


def git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Of the caller's environment only what git needs to run (``processes.declared_env``): a
    caller's ``GIT_DIR``, ``GIT_INDEX_FILE`` or ``GIT_WORK_TREE`` would point our git elsewhere."""
    env = declared_env(("GIT_EXEC_PATH", *NETWORK))  # a remote's proxies; what it gives is checked by SHA
    env.update(
        {
            "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
        }
    )
    if extra:
        env.update(extra)
    return env


def run_git(
    args: list[str],
    cwd: Path,
    *,
    env: dict[str, str] | None = None,
    input: bytes | None = None,
    check: bool = True,
    timeout: float = GIT_TIMEOUT_S,
) -> subprocess.CompletedProcess[bytes]:
    try:
        result = subprocess.run(
            ["git", *args],
            cwd=cwd,
            env=git_env(env),
            input=input,
            capture_output=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise SglpatchError(f"git {' '.join(args[:3])} in {cwd} did not finish within {timeout:g} s") from None
    except OSError as exc:
        raise SglpatchError(f"cannot run git in {cwd}: {exc}") from None
    if check and result.returncode != 0:
        raise SglpatchError(
            f"git {' '.join(args[:3])} failed in {cwd}: {result.stderr.decode(errors='replace').strip()}"
        )
    return result


def git_out(args: list[str], cwd: Path, **kwargs) -> str:
    return run_git(args, cwd, **kwargs).stdout.decode().strip()


def commit_env(name: str, email: str, date: str) -> dict[str, str]:
    """Author and committer fixed to the given identity and date, so commit hashes reproduce."""
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": IDENTITY_NAME,
        "GIT_COMMITTER_EMAIL": IDENTITY_EMAIL,
        "GIT_COMMITTER_DATE": date,
    }


def borrow_objects(objects_dir: Path, repos: list[Path]) -> None:
    """Let the repository whose object store is ``objects_dir`` read the objects of each of
    ``repos`` (git's alternates), each listed once: a scratch repository then holds only the
    objects it makes, and the pristine releases' stay in the cache."""
    alternates = objects_dir / "info" / "alternates"
    listed = alternates.read_text().splitlines() if alternates.exists() else []
    added = [str(repo / "objects") for repo in repos if str(repo / "objects") not in listed]
    if added:
        alternates.parent.mkdir(parents=True, exist_ok=True)
        alternates.write_text("".join(f"{path}\n" for path in [*listed, *added]))


@functools.cache
def version() -> str:
    """``git --version``: what git's merges (a three-way apply) are made by, for the keys of the
    answers they go into."""
    return git_out(["--version"], Path(os.curdir))
