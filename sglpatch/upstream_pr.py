"""Preparing one patch as an upstream pull request: a branch on the base, the mbox, and the PR
title and body rendered from the patch's commit message, metadata and witness.

The base is a pin (default: the newest) or a ref in a git repository the user names (their
clone of sglang). The export refuses, with the reason, a patch that is already upstream there
(it reverse-applies) or not needed there (its witness passes on the base).
"""

from __future__ import annotations

import json
import shutil
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sglpatch import sources
from sglpatch.checkouts import checkout_commit
from sglpatch.errors import SglpatchError
from sglpatch.gitcmd import IDENTITY_EMAIL, IDENTITY_NAME, git_out, run_git
from sglpatch.index_apply import apply_to_index, check_exact, made_on, preimage_paths, reverse_applies, three_way_to_index
from sglpatch.processes import run_tool, user_git_env
from sglpatch.series import METADATA_TRAILERS, PatchFile, SeriesPatch
from sglpatch.tree_repo import ensure_tree_repo
from sglpatch.witnesses import registry
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE, WitnessResult

BRANCH_PREFIX = "sglpatch-upstream/"
GH_TIMEOUT_S = 300


@dataclass(frozen=True)
class Export:
    branch: str
    repo: Path
    commit: str
    mbox: Path
    body: Path
    title: str


def export(
    project,
    patch_name: str,
    base: str | None = None,
    base_repo: Path | None = None,
    out: Path | None = None,
    range_diff: str = "",
    signoff: bool = False,
) -> Export:
    """The patch as upstream will see it: one clean commit on ``base`` (the message without our
    metadata trailers, authored and committed by the user where git knows them, with their
    Signed-off-by when ``signoff``), on branch ``sglpatch-upstream/<patch>``, plus its mbox and
    the PR title and body. ``range_diff``, if given, is appended to the body as the changes since
    an earlier version. An existing branch holding anything else is refused, never moved."""
    series = project.series()
    patch = series.get(patch_name)
    pins = project.pins()
    if base_repo is None:
        pin = pins.select([base])[0] if base else pins.newest
        pristine = sources.pristine_from_index(pin)
        repo = project.build_dir / "trees" / pin.version
        repo.parent.mkdir(parents=True, exist_ok=True)
        ensure_tree_repo(repo, pristine)
        base_commit, version = pristine.commit, pin.version
        label = f"sglang {pin.version}"
    else:
        repo = base_repo
        base_commit = git_out(["rev-parse", "--verify", f"{base or 'HEAD'}^{{commit}}"], repo)
        # A git base has no pin; the newest pin's metadata (e.g. the tvm-ffi version a witness
        # compiles against) is the closest description of a current checkout.
        pin, version, label = pins.newest, None, f"{base or 'HEAD'} ({base_commit[:12]}) of {repo}"
    rendition = _rendition(patch, version, repo, base_commit)
    witness = registry.witness_for(rendition.trailer("Witness"), str(rendition.path))
    before = after = None
    with tempfile.TemporaryDirectory() as scratch:
        index = Path(scratch) / "index"
        env = {"GIT_INDEX_FILE": str(index)}
        run_git(["read-tree", base_commit], repo, env=env)
        exact = check_exact(repo, env, rendition.diff_text)
        if not exact.applies and reverse_applies(repo, env, rendition.diff_text):
            raise SglpatchError(f"{patch.name}: already upstream at {label} (the patch reverse-applies); nothing to send")
        if exact.applies:
            tree = apply_to_index(repo, env, rendition.diff_text)
        else:
            # As apply does on a pin: git's three-way apply from the blobs the rendition was made on.
            merged = three_way_to_index(repo, env, rendition.diff_text, made_on(rendition, pins.pins, version))
            if not merged.tree:
                raise SglpatchError(f"{patch.name}: does not apply to {label}, exactly or three-way ({merged.detail}); "
                                    "rebase it first (nox -s rebase)")
            tree = merged.tree
        if witness is not None:
            before = witness.run(checkout_commit(repo, base_commit, Path(scratch) / "before"), pin)
            if before.state == CLEAN:
                raise SglpatchError(
                    f"{patch.name}: not needed at {label}: witness {witness.name} already passes there ({before.detail})"
                )
        commit = upstream_commit(repo, rendition, tree, base_commit, signoff=signoff)
        if witness is not None:
            after = witness.run(checkout_commit(repo, commit, Path(scratch) / "after"), pin)
            if after.state == BUG:
                raise SglpatchError(f"{patch.name}: witness {witness.name} still fails with the patch at {label}: {after.detail}")
    for result in (before, after):
        if result is not None and result.state == UNAVAILABLE:
            raise SglpatchError(
                f"{patch.name}: witness {witness.name} could not run at {label} ({result.detail}); "
                "a pull request must say how it was tested, so nothing was exported"
            )
    branch = BRANCH_PREFIX + patch.stem
    _set_branch(repo, branch, commit)
    folder = (out or project.build_dir / "upstream") / patch.stem
    folder.mkdir(parents=True, exist_ok=True)
    mbox = folder / f"{patch.stem}.mbox"
    mbox.write_bytes(run_git(["format-patch", "-1", "--stdout", commit], repo).stdout)
    title, body = render_pr(rendition, label, before, after, _matrix_results(project, patch.name))
    if range_diff:
        body += f"\n## Changes since the previous version of this series\n\n```\n{range_diff.rstrip()}\n```\n"
    body_path = folder / "PR.md"
    body_path.write_text(f"# {title}\n\n{body}")
    return Export(branch=branch, repo=repo, commit=commit, mbox=mbox, body=body_path, title=title)


def upstream_commit(repo: Path, rendition: PatchFile, tree: str, parent: str, *, signoff: bool = False) -> str:
    """``tree`` committed on ``parent`` with the patch's message minus our metadata trailers.

    The author is the patch's, unless that is sglpatch's own placeholder identity; then, as the
    committer, it is the user's git identity in ``repo`` (their config), where git has one."""
    fields = _mail_fields(repo, rendition)
    user = _user_identity(repo)
    author = (fields.get("Author", ""), fields.get("Email", ""))
    if author[1] == IDENTITY_EMAIL and user is not None:
        author = user
    committer = user or (IDENTITY_NAME, IDENTITY_EMAIL)
    message = f"{rendition.subject}\n\n{message_without_trailers(rendition)}\n"
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


def _set_branch(repo: Path, branch: str, commit: str) -> None:
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


def _rendition(patch: SeriesPatch, version: str | None, repo: Path, base_commit: str) -> PatchFile:
    """The pin's rendition; on a git base, the first rendition whose files exist there."""
    if version is not None:
        rendition = patch.for_version(version)
        if rendition is None:
            raise SglpatchError(f"{patch.name}: no rendition applies to {version}")
        return rendition
    files = set(git_out(["ls-tree", "-r", "--name-only", base_commit], repo).splitlines())
    for rendition in patch.renditions:
        paths = preimage_paths(rendition.diff_text)
        if paths and all(path in files for path in paths):
            return rendition
    return patch.main


def _matrix_results(project, name: str) -> list[str]:
    report = project.build_dir / "apply-report.json"
    if not report.exists():
        return []
    lines = []
    for pin in json.loads(report.read_text())["pins"]:
        for outcome in pin["patches"]:
            if outcome["name"] == name:
                before = outcome.get("witness_before") or "-"
                after = outcome.get("witness_after") or "-"
                lines.append(f"| {pin['version']} | {outcome['status']} | {before} | {after} |")
    return lines


def render_pr(
    rendition: PatchFile,
    base_label: str,
    before: WitnessResult | None,
    after: WitnessResult | None,
    matrix: list[str],
) -> tuple[str, str]:
    """The PR title (the patch subject) and body (its message without our trailers, then tests)."""
    message = message_without_trailers(rendition)
    parts = [message.strip(), "", "## How it was tested", ""]
    if before is not None and after is not None:
        parts.append(
            f"Witness `{before.witness}` on {base_label}: without the patch {before.summary()} "
            f"({before.detail}); with it {after.summary()} ({after.detail})."
        )
    if matrix:
        parts += ["", "Results across released versions:", "", "| sglang | result | before | after |", "|---|---|---|---|", *matrix]
    return rendition.subject, "\n".join(parts).rstrip() + "\n"


def message_without_trailers(rendition: PatchFile) -> str:
    text = rendition.raw.decode()
    body = text.split("\n\n", 1)[1].split("\n---\n", 1)[0]
    kept = [line for line in body.splitlines() if not re.match(rf"^({'|'.join(METADATA_TRAILERS)}):", line, re.I)]
    return "\n".join(kept).strip()


def open_pull_request(export: Export, remote_branch: str | None = None) -> str:
    """Open the PR with the ``gh`` CLI (the user pushed the branch); returns what gh printed."""
    gh = shutil.which("gh")
    if gh is None:
        raise SglpatchError("the gh CLI is not installed; push the branch and open the pull request by hand")
    run = run_tool(
        [gh, "pr", "create", "--title", export.title, "--body-file", str(export.body), "--head", remote_branch or export.branch],
        "gh pr create (network or a prompt?)",
        GH_TIMEOUT_S,
        cwd=export.repo,
        env=user_git_env(),
    )
    if run.returncode != 0:
        raise SglpatchError(f"gh pr create failed: {run.stderr.strip()}")
    return run.stdout.strip()
