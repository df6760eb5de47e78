"""Checks on the diff of a patch file: it parses, its hunks add up, and it only touches plain text
files at safe paths. ``apply`` refuses a patch with any finding; ``sglpatch check`` lists them all.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import unidiff

from sglpatch.series import PatchFile, Problem


def parse_diff(patch: PatchFile) -> unidiff.PatchSet:
    return unidiff.PatchSet(patch.diff_text)


def diff_problems(patch: PatchFile) -> list[Problem]:
    problems = _hunk_problems(patch)
    if problems:
        return problems
    try:
        patch_set = parse_diff(patch)
    except unidiff.UnidiffParseError as exc:
        return [Problem(patch.path, patch.diff_line, f"diff does not parse: {exc}")]
    lines = patch.diff_text.splitlines()
    for index, line in enumerate(lines):
        where = patch.diff_line + index
        if line.startswith(("new file mode 120000", "new mode 120000", "deleted file mode 120000")):
            problems.append(Problem(patch.path, where, "the patch creates or changes a symbolic link; refused"))
        if line.startswith("GIT binary patch") or (line.startswith("Binary files ") and line.endswith(" differ")):
            problems.append(Problem(patch.path, where, "binary patch; only text patches are accepted"))
    for patched in patch_set:
        header = _file_header_line(patch, patched.path)
        for raw in (patched.source_file, patched.target_file):
            reason = unsafe_path_reason(raw)
            if reason:
                problems.append(Problem(patch.path, header, f"path {raw!r}: {reason}"))
        if not patched.is_binary_file and len(patched) == 0 and not _is_header_only_change(patch, patched):
            problems.append(Problem(patch.path, header, f"{patched.path}: no hunks (truncated patch?)"))
    return problems


def unsafe_path_reason(raw: str) -> str | None:
    if raw == "/dev/null":
        return None
    path = raw[2:] if raw.startswith(("a/", "b/")) else raw
    posix = PurePosixPath(path)
    if posix.is_absolute():
        return "absolute paths are refused"
    if ".." in posix.parts:
        return "paths with '..' are refused"
    return None


def touched_paths(patch_set: unidiff.PatchSet) -> tuple[list[str], list[str]]:
    """(paths that must already exist, paths the patch creates)."""
    existing, created = [], []
    for patched in patch_set:
        if patched.is_added_file:
            created.append(_strip(patched.target_file))
        else:
            existing.append(_strip(patched.source_file))
            if patched.is_rename:
                created.append(_strip(patched.target_file))
    return existing, created


def hunk_at(patch_set: unidiff.PatchSet, path: str, source_line: int) -> tuple[int, str] | None:
    """(1-based hunk number, hunk text) of the hunk of ``path`` that starts at ``source_line``."""
    for patched in patch_set:
        if patched.path != path:
            continue
        for number, hunk in enumerate(patched, 1):
            if hunk.source_start == source_line or (hunk.source_length == 0 and hunk.source_start + 1 == source_line):
                return number, str(hunk)
    return None


def _strip(raw: str) -> str:
    return raw[2:] if raw.startswith(("a/", "b/")) else raw


def _file_header_line(patch: PatchFile, path: str) -> int:
    for index, line in enumerate(patch.diff_text.splitlines()):
        if line.startswith("diff --git ") and line.endswith(f"b/{path}"):
            return patch.diff_line + index
    return patch.diff_line


def _is_header_only_change(patch: PatchFile, patched: unidiff.PatchedFile) -> bool:
    # Pure renames, mode changes and empty new files carry no hunks legitimately.
    return patched.is_rename or patched.is_added_file or patched.is_removed_file or (
        "old mode " in patch.diff_text and "new mode " in patch.diff_text
    )


def _hunk_problems(patch: PatchFile) -> list[Problem]:
    """Hunk counts checked one hunk at a time, so a miscount is reported at its own @@ line."""
    lines = patch.diff_text.splitlines(keepends=True)
    problems = []
    hunk_number = 0
    current = ""
    for index, line in enumerate(lines):
        if line.startswith("diff --git "):
            current, hunk_number = line.split()[-1].removeprefix("b/"), 0
            continue
        if not line.startswith("@@"):
            continue
        hunk_number += 1
        end = next(
            (j for j in range(index + 1, len(lines)) if lines[j].startswith(("@@", "diff --git "))),
            len(lines),
        )
        body = "".join(lines[index:end])
        try:
            unidiff.PatchSet(f"--- a/{current}\n+++ b/{current}\n{body}")
        except unidiff.UnidiffParseError as exc:
            problems.append(
                Problem(patch.path, patch.diff_line + index, f"hunk {hunk_number} of {current}: {exc}")
            )
            continue
        if _hunk_too_long(body):
            problems.append(
                Problem(
                    patch.path,
                    patch.diff_line + index,
                    f"hunk {hunk_number} of {current}: more lines than its header counts",
                )
            )
    return problems


def _hunk_too_long(body: str) -> bool:
    header, *rest = body.splitlines()
    try:
        ranges = header.split("@@")[1].split()
        old = int(ranges[0].split(",")[1]) if "," in ranges[0] else 1
        new = int(ranges[1].split(",")[1]) if "," in ranges[1] else 1
    except (IndexError, ValueError):
        return False
    counted_old = sum(1 for line in rest if line[:1] in (" ", "-") or line == "")
    counted_new = sum(1 for line in rest if line[:1] in (" ", "+") or line == "")
    return counted_old > old or counted_new > new
