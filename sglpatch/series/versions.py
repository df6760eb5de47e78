"""Series versions: ``sglpatch series bump`` records one, ``sglpatch series diff`` compares two.

A version is the newest ``## vN`` heading of ``patches/CHANGELOG.md``. The files of an older
version come from this repository's own history (the newest commit whose changelog says vN); the
working tree is the current version. Two versions are compared as git range-diff of their commits
on one pin, with patches that exist on one side only listed plainly.
"""

from __future__ import annotations

import datetime
import re
import tempfile
from pathlib import Path

from sglpatch.apply.one_pin import apply_pin
from sglpatch.plumbing import cache
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import git_out, run_git
from sglpatch.series.patches import CHANGELOG_FILE, load_series, series_version
from sglpatch.sources import pristine_tree

_UNMATCHED_OLD = re.compile(r"^\s*(\d+):\s+[0-9a-f]+\s+<\s+-:\s+-+\s+(.*)$")
_UNMATCHED_NEW = re.compile(r"^\s*-:\s+-+\s+>\s+(\d+):\s+[0-9a-f]+\s+(.*)$")


def bump(patches_dir: Path, message: str, today: datetime.date | None = None) -> str:
    """Record version N+1 in the changelog with ``message``; returns the new version."""
    if not message.strip():
        raise SglpatchError("a series version needs a changelog message")
    current = int(series_version(patches_dir))
    path = patches_dir / CHANGELOG_FILE
    text = path.read_text()
    heading = re.search(r"^## v\d+", text, re.MULTILINE)
    assert heading is not None  # series_version found one
    date = (today or datetime.date.today()).isoformat()
    bullets = "".join(f"- {line}\n" for line in message.strip().splitlines())
    entry = f"## v{current + 1} — {date}\n\n{bullets}\n"
    cache.write_atomically(path, text[: heading.start()] + entry + text[heading.start() :])
    return str(current + 1)


def materialize(root: Path, version: str, dest: Path) -> Path:
    """The patches/ folder as it was at ``version`` (the working tree if that is the current one)."""
    patches_dir = root / "patches"
    if series_version(patches_dir) == version:
        return patches_dir
    commit = _commit_of_version(root, version)
    listing = git_out(["ls-tree", "-r", "--name-only", commit, "--", "patches"], root).splitlines()
    for name in listing:
        target = dest / Path(name).relative_to("patches")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(run_git(["show", f"{commit}:{name}"], root).stdout)
    return dest


def _commit_of_version(root: Path, version: str) -> str:
    commits = git_out(["log", "--format=%H", "--", f"patches/{CHANGELOG_FILE}"], root).splitlines()
    for commit in commits:
        text = run_git(["show", f"{commit}:patches/{CHANGELOG_FILE}"], root).stdout.decode()
        match = re.search(r"^## v(\d+)\b", text, re.MULTILINE)
        if match and match.group(1) == version:
            return commit
    raise SglpatchError(f"series v{version} is in neither the working tree nor the history of {root}")


def range_diff(project, old: str, new: str, pin_name: str | None = None) -> str:
    """git range-diff of series ``old`` and ``new`` applied to one pin (default: the oldest)."""
    pins = project.pins()
    pin = pins.select([pin_name])[0] if pin_name else pins.pins[0]
    pristine = pristine_tree.pristine_from_index(pin)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        trees = {}
        for label, version in (("old", old), ("new", new)):
            series = load_series(materialize(project.root, version, work / f"patches-{label}"))
            result = apply_pin(
                pin, series, pristine, work / f"out-{label}", work / f"{label}.lock", run_witnesses=False
            )
            if not result.commit:
                raise SglpatchError(f"series v{version} does not apply to {pin.version}: {result.error}")
            trees[label] = (Path(result.tree_path), result.commit)
        new_tree, new_commit = trees["new"]
        old_tree, old_commit = trees["old"]
        run_git(["fetch", "--quiet", str(old_tree), old_commit], new_tree)
        output = git_out(
            ["range-diff", "--no-color", f"{pristine.commit}..{old_commit}", f"{pristine.commit}..{new_commit}"],
            new_tree,
        )
    return f"series v{old} -> v{new} on sglang {pin.version}\n" + plain_unmatched(output)


def plain_unmatched(output: str) -> str:
    """range-diff's one-sided pairs ("1: abc < -: ---") written as plain added/removed lines."""
    lines = []
    for line in output.splitlines():
        removed, added = _UNMATCHED_OLD.match(line), _UNMATCHED_NEW.match(line)
        if removed:
            lines.append(f"removed in the new version: {removed.group(2)}")
        elif added:
            lines.append(f"added in the new version: {added.group(2)}")
        else:
            lines.append(line)
    return "\n".join(lines)
