"""Preparing one patch as an upstream pull request: a branch on the base, the mbox, and the PR
title and body rendered from the patch's commit message, metadata and witness.

The base is a pin (default: the newest) or a ref in a git repository the user names (their
clone of sglang). The export refuses, with the reason, a patch that is already upstream there
(it reverse-applies) or not needed there (its witness passes on the base).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sglpatch import sources, witnesses
from sglpatch.apply import checkout_commit, commit_patch, ensure_tree_repo
from sglpatch.errors import SglpatchError
from sglpatch.gitcmd import git_out, run_git
from sglpatch.series import METADATA_TRAILERS, PatchFile, SeriesPatch
from sglpatch.witnesses import BUG, CLEAN, WitnessResult

BRANCH_PREFIX = "sglpatch-upstream/"


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
) -> Export:
    """``range_diff``, if given, is appended to the body as the changes since an earlier version."""
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
    witness = witnesses.witness_for(rendition.trailer("Witness"), str(rendition.path))
    before = after = None
    with tempfile.TemporaryDirectory() as scratch:
        index = Path(scratch) / "index"
        env = {"GIT_INDEX_FILE": str(index)}
        run_git(["read-tree", base_commit], repo, env=env)
        diff = rendition.diff_text.encode()
        if run_git(["apply", "--cached", "--check", "-"], repo, env=env, input=diff, check=False).returncode:
            if run_git(["apply", "--cached", "--check", "--reverse", "-"], repo, env=env, input=diff, check=False).returncode == 0:
                raise SglpatchError(f"{patch.name}: already upstream at {label} (the patch reverse-applies); nothing to send")
            raise SglpatchError(f"{patch.name}: does not apply to {label}; rebase it first (nox -s rebase)")
        if witness is not None:
            before = witness.run(checkout_commit(repo, base_commit, Path(scratch) / "before"), pin)
            if before.state == CLEAN:
                raise SglpatchError(
                    f"{patch.name}: not needed at {label}: witness {witness.name} already passes there ({before.detail})"
                )
        run_git(["apply", "--cached", "-"], repo, env=env, input=diff)
        tree = git_out(["write-tree"], repo, env=env)
        commit = commit_patch(repo, rendition, tree, base_commit)
        if witness is not None:
            after = witness.run(checkout_commit(repo, commit, Path(scratch) / "after"), pin)
            if after.state == BUG:
                raise SglpatchError(f"{patch.name}: witness {witness.name} still fails with the patch at {label}: {after.detail}")
    branch = BRANCH_PREFIX + patch.stem
    run_git(["update-ref", f"refs/heads/{branch}", commit], repo)
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


def _rendition(patch: SeriesPatch, version: str | None, repo: Path, base_commit: str) -> PatchFile:
    """The pin's rendition; on a git base, the first rendition whose files exist there."""
    if version is not None:
        rendition = patch.for_version(version)
        if rendition is None:
            raise SglpatchError(f"{patch.name}: no rendition applies to {version}")
        return rendition
    files = set(git_out(["ls-tree", "-r", "--name-only", base_commit], repo).splitlines())
    for rendition in patch.renditions:
        paths = re.findall(r"^diff --git a/(\S+) ", rendition.diff_text, re.MULTILINE)
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
    message = _message_without_trailers(rendition)
    parts = [message.strip(), "", "## How it was tested", ""]
    if before is not None and after is not None:
        parts.append(
            f"Witness `{before.witness}` on {base_label}: without the patch {before.summary()} "
            f"({before.detail}); with it {after.summary()} ({after.detail})."
        )
    if matrix:
        parts += ["", "Results across released versions:", "", "| sglang | result | before | after |", "|---|---|---|---|", *matrix]
    return rendition.subject, "\n".join(parts).rstrip() + "\n"


def _message_without_trailers(rendition: PatchFile) -> str:
    text = rendition.raw.decode()
    body = text.split("\n\n", 1)[1].split("\n---\n", 1)[0]
    kept = [line for line in body.splitlines() if not re.match(rf"^({'|'.join(METADATA_TRAILERS)}):", line)]
    return "\n".join(kept).strip()


def open_pull_request(export: Export, remote_branch: str | None = None) -> str:
    """Open the PR with the ``gh`` CLI (the user pushed the branch); returns what gh printed."""
    gh = shutil.which("gh")
    if gh is None:
        raise SglpatchError("the gh CLI is not installed; push the branch and open the pull request by hand")
    run = subprocess.run(
        [gh, "pr", "create", "--title", export.title, "--body-file", str(export.body), "--head", remote_branch or export.branch],
        cwd=export.repo,
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        raise SglpatchError(f"gh pr create failed: {run.stderr.strip()}")
    return run.stdout.strip()
