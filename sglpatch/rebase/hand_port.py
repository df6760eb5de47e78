"""The tree ``rebase`` leaves for a person where no tool made a port the judge accepts, and its way
back: ``build/port/<release>/`` holds the nearest candidate of every patch left (zdiff3 conflict
markers where git's merge conflicted) for a person to finish, and ``sglpatch patch refresh
<release>`` writes the edited tree back as those patches' renditions for the release."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from sglpatch.apply.index_apply import commit_patch
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import git_out, run_git
from sglpatch.rebase.merge_tools import FIXED_COMMIT_ENV
from sglpatch.rebase.patch import with_message_of
from sglpatch.rebase.report import RebaseOutcome
from sglpatch.rebase.trial import Trial
from sglpatch.series.patches import RENDITIONS_DIR, set_trailers

HAND_PORT_NOTE = "sglpatch-port.json"  # in the prepared tree's .git: what it was prepared from


def prepare_hand_port(project, trial: Trial, version: str, left: list[RebaseOutcome]) -> Path:
    """``build/port/<version>/``: a git checkout of the release with the patches accepted before the
    first patch that needs a hand port committed on branch ``port``, and in the working tree the
    nearest candidate of every patch that needs one, in series order (git's zdiff3 conflict markers
    where a candidate conflicted, or where a later one's change met an earlier one's), for a person
    to finish and ``sglpatch patch refresh <version>`` to write back as their renditions."""
    rendition, how, combined, port = left[0].conflict
    entries = [_entry(trial, left[0])]
    for outcome in left[1:]:
        _, later_how, tree, parent = outcome.conflict
        # The later candidate's own change (against the tree it was tried on) merged onto the ones before.
        combined, conflicted = _merge_change(trial.repo, combined, parent, tree)
        entries.append({**_entry(trial, outcome), "conflicts_with_earlier": conflicted})
    dest = project.build_dir / "port" / version
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    run_git(["clone", "--quiet", "--no-checkout", str(trial.pristine.repo), str(dest)], dest.parent)
    run_git(["push", "--quiet", str(dest), f"{port}:refs/heads/port"], trial.repo)
    names = ", ".join(f"{entry['step']} of {entry['rendition']}" for entry in entries)
    candidate = git_out(["commit-tree", combined, "-p", port, "-m", f"candidates: {names}"], trial.repo, env=FIXED_COMMIT_ENV)
    run_git(["push", "--quiet", str(dest), f"{candidate}:refs/sglpatch/candidate"], trial.repo)
    run_git(["symbolic-ref", "HEAD", "refs/heads/port"], dest)
    run_git(["read-tree", "refs/sglpatch/candidate"], dest)
    run_git(["checkout-index", "--all", "--force"], dest)
    run_git(["read-tree", "port"], dest)
    note = {"version": version, "patches": entries}
    (dest / ".git" / HAND_PORT_NOTE).write_text(json.dumps(note, indent=2) + "\n")
    return dest


def _entry(trial: Trial, outcome: RebaseOutcome) -> dict:
    rendition, how, tree, parent = outcome.conflict
    files = [p for p in git_out(["diff", "--name-only", "--no-renames", parent, tree], trial.repo).splitlines() if p]
    findings = next((a.findings for a in outcome.attempts if a.rendition == rendition and a.how == how), [])
    return {"patch": outcome.name, "rendition": rendition, "step": how, "findings": findings, "files": files}


def _merge_change(repo: Path, onto_tree: str, base: str, tree: str) -> tuple[str, bool]:
    """(the tree of ``base``..``tree``'s change merged onto ``onto_tree`` by git's merge, with zdiff3
    markers where they meet; whether they did)."""
    ours = git_out(["commit-tree", onto_tree, "-p", base, "-m", "earlier candidates"], repo, env=FIXED_COMMIT_ENV)
    theirs = git_out(["commit-tree", tree, "-p", base, "-m", "candidate"], repo, env=FIXED_COMMIT_ENV)
    merged = run_git(["-c", "merge.conflictStyle=zdiff3", "merge-tree", "--write-tree", "--name-only", ours, theirs], repo, check=False)
    lines = merged.stdout.decode(errors="replace").splitlines()
    if merged.returncode not in (0, 1) or not lines:
        raise SglpatchError(f"git merge-tree failed preparing the hand port: {merged.stderr.decode(errors='replace').strip()}")
    return lines[0].strip(), merged.returncode == 1


def refresh_hand_port(project, version: str) -> list[Path]:
    """Write the edited tree under ``build/port/<version>/`` back as the renditions for ``version``
    of the patches it was prepared for (``Applies-To: ==<version>``, each candidate's message),
    each file to the patch whose candidate changed it (one no candidate changed to the first);
    refuses while conflict markers remain, or where one file holds two patches' changes. Returns
    the renditions' paths."""
    dest = project.build_dir / "port" / version
    note_file = dest / ".git" / HAND_PORT_NOTE
    if not note_file.is_file():
        raise SglpatchError(f"{dest}: no tree prepared for a hand port of {version} (sglpatch rebase {version} prepares one)")
    note = json.loads(note_file.read_text())
    entries = note.get("patches") or [{**note, "files": []}]  # a note from before every patch got its candidate
    env = {"GIT_INDEX_FILE": str(dest / ".git" / "index-refresh")}
    run_git(["read-tree", "port"], dest, env=env)
    run_git(["add", "--all", "--", "."], dest, env=env)
    tree = git_out(["write-tree"], dest, env=env)
    changed = [p for p in git_out(["diff", "--name-only", "--cached", "port"], dest, env=env).splitlines() if p]
    if not changed:
        raise SglpatchError(f"{dest}: nothing changed against the release; nothing written")
    for path in changed:
        shown = run_git(["cat-file", "blob", f"{tree}:{path}"], dest, check=False)
        marked = [n for n, line in enumerate(shown.stdout.decode(errors="replace").splitlines(), 1)
                  if line.startswith(("<<<<<<< ", ">>>>>>> ", "||||||| ")) or line == "======="]
        if shown.returncode == 0 and marked:
            raise SglpatchError(f"{dest / path}:{marked[0]}: a conflict marker is left; resolve it, then refresh again")
    owners: dict[str, dict] = {}
    for path in changed:
        claiming = [entry for entry in entries if path in entry.get("files", [])]
        if len(claiming) > 1:
            raise SglpatchError(f"{dest / path}: the candidates of {claiming[0]['patch']} and {claiming[1]['patch']} both change it;"
                                " refresh cannot tell their changes apart: port one, refresh, and rebase again")
        owners[path] = claiming[0] if claiming else entries[0]
    series = project.series()
    parent = git_out(["rev-parse", "port"], dest)
    written = []
    for entry in entries:
        paths = [path for path in changed if owners[path] is entry]
        if not paths:
            continue
        patch = series.get(entry["patch"])
        source = next((r for r in patch.renditions if str(r.path.relative_to(project.root)) == entry["rendition"]), patch.main)
        run_git(["read-tree", parent], dest, env=env)
        for path in paths:
            mode_blob = git_out(["ls-tree", tree, "--", path], dest).split()
            if mode_blob:
                run_git(["update-index", "--add", "--cacheinfo", f"{mode_blob[0]},{mode_blob[2]},{path}"], dest, env=env)
            else:
                run_git(["update-index", "--force-remove", "--", path], dest, env=env)
        commit = commit_patch(dest, source, git_out(["write-tree"], dest, env=env), parent)
        text = run_git(["format-patch", "-1", "--stdout", "--zero-commit", commit], dest).stdout.decode()
        target = project.patches_dir / RENDITIONS_DIR / patch.stem / f"{version}.patch"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(set_trailers(with_message_of(source, text), {"Applies-To": f"=={version}"}))
        written.append(target)
        parent = commit
    return written
