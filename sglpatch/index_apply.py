"""One rendition on a tree held in a private index (``git apply --cached``): whether it applies
exactly and at which offsets, whether it reverse-applies (the tree already holds it), where it does
not match, and its commit as ``git am`` would make it -- for ``apply`` on a pin and ``rebase`` on a
release alike.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import unidiff

from sglpatch import diffs
from sglpatch.gitcmd import commit_env, git_out, run_git
from sglpatch.series import RENDITIONS_DIR, PatchFile

_OFFSET_RE = re.compile(r"Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)")
_FAILED_AT_RE = re.compile(r"error: patch failed: (.+):(\d+)")


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
