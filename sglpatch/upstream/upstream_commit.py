"""The git side of an upstream pull request: its commit (the patch's message without our
trailers, its author and committer), its branch in the user's clone (never moved over work of
theirs), and opening it with the ``gh`` CLI."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import IDENTITY_EMAIL, IDENTITY_NAME, git_out, run_git
from sglpatch.plumbing.processes import run_tool, user_git_env
from sglpatch.series.patches import METADATA_TRAILERS, PatchFile

BRANCH_PREFIX = "sglpatch-upstream/"
GH_TIMEOUT_S = 300
UPSTREAM_REPO = "sgl-project/sglang"
UPSTREAM_BASE = "main"


def commit_tree(repo: Path, tree: str, parent: str, message: str) -> str:
    env = {"GIT_AUTHOR_NAME": IDENTITY_NAME, "GIT_AUTHOR_EMAIL": IDENTITY_EMAIL,
           "GIT_COMMITTER_NAME": IDENTITY_NAME, "GIT_COMMITTER_EMAIL": IDENTITY_EMAIL}
    return git_out(["commit-tree", tree, "-p", parent], repo, env=env, input=message.encode())


def upstream_commit(repo: Path, rendition: PatchFile, tree: str, parent: str, *, signoff: bool = False,
                    title: str | None = None, text: str | None = None) -> str:
    """``tree`` committed on ``parent`` with the patch's message minus our metadata trailers.

    The author is the patch's ``From:``, unless that is this project's placeholder (the series'
    own patches carry it): then the author is the user, as their git configuration in ``repo``
    names them. The committer is the user. Without a git identity the commit would carry the
    placeholder, which no pull request should: refused, one line."""
    fields = _mail_fields(repo, rendition)
    user = _user_identity(repo)
    author = (fields.get("Author", ""), fields.get("Email", ""))
    if user is None and author[1] == IDENTITY_EMAIL:
        raise SglpatchError(f"{repo}: the pull request's commit needs your git identity as its author and committer "
                            f"(git -C {repo} config user.name 'Your Name'; git -C {repo} config user.email you@example.com)")
    if author[1] == IDENTITY_EMAIL:
        author = user
    committer = user or author
    message = f"{title or rendition.subject}\n\n{text if text is not None else message_without_trailers(rendition)}\n"
    if signoff:
        if user is None:
            raise SglpatchError(f"{repo}: -s needs your git identity (git config user.name and user.email)")
        message = message.rstrip("\n") + f"\n\nSigned-off-by: {user[0]} <{user[1]}>\n"
    env = {
        "GIT_AUTHOR_NAME": author[0],
        "GIT_AUTHOR_EMAIL": author[1],
        "GIT_AUTHOR_DATE": fields.get("Date", ""),
        "GIT_COMMITTER_NAME": committer[0],
        "GIT_COMMITTER_EMAIL": committer[1],
        "GIT_COMMITTER_DATE": fields.get("Date", ""),
    }
    return git_out(["commit-tree", tree, "-p", parent], repo, env=env, input=message.encode())


def _mail_fields(repo: Path, rendition: PatchFile) -> dict[str, str]:
    info = run_git(["mailinfo", "/dev/null", "/dev/null"], repo, input=rendition.raw).stdout.decode()
    return dict(line.split(": ", 1) for line in info.splitlines() if ": " in line)


def _user_identity(repo: Path) -> tuple[str, str] | None:
    """The user's name and email as their own git configuration gives them in ``repo``."""
    values = []
    for key in ("user.name", "user.email"):
        try:
            done = run_tool(["git", "config", "--get", key], f"git config {key} in {repo}", 60, cwd=repo,
                            env=user_git_env())
        except SglpatchError:
            return None
        if done.returncode != 0 or not done.stdout.strip():
            return None
        values.append(done.stdout.strip())
    return values[0], values[1]


def set_branch(repo: Path, branch: str, commit: str) -> None:
    """Create ``branch`` at ``commit``; an existing one is left alone unless it holds the same change."""
    ref = f"refs/heads/{branch}"
    existing = run_git(["rev-parse", "--verify", "--quiet", ref], repo, check=False).stdout.decode().strip()
    if existing == commit:
        return
    if existing:
        same = git_out(["rev-parse", f"{existing}^{{tree}}", f"{existing}^"], repo, check=False).split() == git_out(
            ["rev-parse", f"{commit}^{{tree}}", f"{commit}^"], repo
        ).split()
        if not same:
            raise SglpatchError(
                f"{repo}: branch {branch} already exists at {existing[:12]} with other content; it is yours now, "
                f"so it is not overwritten (rename or delete it: git -C {repo} branch -m {branch} {branch}-old)"
            )
        return  # the same change, committed another time: keep the user's branch as it is
    run_git(["update-ref", ref, commit, ""], repo)


def message_without_trailers(rendition: PatchFile) -> str:
    text = rendition.raw.decode()
    body = text.split("\n\n", 1)[1].split("\n---\n", 1)[0]
    kept = [line for line in body.splitlines() if not re.match(rf"^({'|'.join(METADATA_TRAILERS)}):", line, re.I)]
    return "\n".join(kept).strip()


def open_pull_request(export, remote_branch: str | None = None, *, repo: str = UPSTREAM_REPO,
                      base: str = UPSTREAM_BASE) -> str:
    """Open the PR on ``repo`` against ``base`` with the ``gh`` CLI (the user pushed the branch);
    returns what gh printed."""
    gh = shutil.which("gh")
    if gh is None:
        raise SglpatchError("the gh CLI is not installed; push the branch and open the pull request by hand")
    run = run_tool(
        [gh, "pr", "create", "--repo", repo, "--base", base, "--title", export.title, "--body-file", str(export.body),
         "--head", remote_branch or export.branch],
        "gh pr create (network or a prompt?)",
        GH_TIMEOUT_S,
        cwd=export.repo,
        env=user_git_env(),
    )
    if run.returncode != 0:
        raise SglpatchError(f"gh pr create failed: {run.stderr.strip()}")
    return run.stdout.strip()


def branch_name(stem: str, part: str = "") -> str:
    """``sglpatch-upstream/<patch>``; for one ``PR-Split`` part, ``sglpatch-upstream/<number>-<part>``
    (the patch's number and the part's name: a stem may already end with a part's words)."""
    if not part:
        return BRANCH_PREFIX + stem
    number = re.match(r"\d+", stem)
    return BRANCH_PREFIX + (f"{number.group(0)}-{part}" if number else f"{stem}-{part}")
