"""Checks on the diff of a patch file: it parses, its hunks add up, it only touches plain text
files at safe paths, and what it adds holds nothing a reviewer cannot see. ``apply`` refuses a
patch with any finding; ``sglpatch check`` lists them all.
"""

from __future__ import annotations

import re
import unicodedata

import unidiff

from sglpatch.series.patches import PatchFile, Problem


def parse_diff(patch: PatchFile) -> unidiff.PatchSet:
    return unidiff.PatchSet(patch.diff_text)


def diff_problems(patch: PatchFile) -> list[Problem]:
    problems = _line_problems(patch) + invisible_problems(patch)
    hunks = _hunk_problems(patch)
    if hunks:
        return problems + hunks
    try:
        patch_set = parse_diff(patch)
    except unidiff.UnidiffParseError as exc:
        return problems + [Problem(patch.path, patch.diff_line, f"diff does not parse: {exc}")]
    seen: dict[str, int] = {}
    headers = [patch.diff_line + i for i, line in enumerate(patch.diff_text.splitlines()) if line.startswith("diff --git ")]
    for number, patched in enumerate(patch_set):
        header = headers[number] if len(headers) == len(patch_set) else _file_header_line(patch, patched.path)
        for raw in dict.fromkeys((patched.source_file, patched.target_file)):
            reason = unsafe_path_reason(raw)
            if reason:
                problems.append(Problem(patch.path, header, f"path {raw!r}: {reason}"))
        for path in dict.fromkeys(_strip(p) for p in (patched.source_file, patched.target_file) if p != "/dev/null"):
            if path in seen:
                problems.append(Problem(patch.path, header, f"{path} is changed twice in one patch (also at line {seen[path]})"))
            seen.setdefault(path, header)
        if not patched.is_binary_file and len(patched) == 0 and not _is_header_only_change(patch, patched):
            problems.append(Problem(patch.path, header, f"{patched.path}: no hunks (truncated patch?)"))
        problems += _overlapping_hunks(patch, patched, header)
    return problems


# Modes git can write that are not a plain file: a symbolic link, a submodule (gitlink).
_SPECIAL_MODES = {"120000": "a symbolic link", "160000": "a submodule (gitlink)"}
_MODE_LINE = re.compile(r"^(new file mode|deleted file mode|old mode|new mode) (\d{6})$")
_INDEX_LINE = re.compile(r"^index [0-9a-f]+\.\.[0-9a-f]+ (\d{6})$")
_NEXT_MESSAGE = re.compile(r"^From [0-9a-f]{40} ")
_NOT_TEXT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _line_problems(patch: PatchFile) -> list[Problem]:
    """What the diff's own lines show: special modes, binary or non-text content, a second patch."""
    problems = []
    for index, line in enumerate(patch.diff_text.splitlines()):
        where = patch.diff_line + index
        mode = _MODE_LINE.match(line) or _INDEX_LINE.match(line)
        if mode and mode.groups()[-1] in _SPECIAL_MODES:
            kind = _SPECIAL_MODES[mode.groups()[-1]]
            problems.append(Problem(patch.path, where, f"the patch creates or changes {kind}; refused"))
        if line.startswith("GIT binary patch") or (line.startswith("Binary files ") and line.endswith(" differ")):
            problems.append(Problem(patch.path, where, "binary patch; only text patches are accepted"))
        if _NEXT_MESSAGE.match(line):
            problems.append(
                Problem(patch.path, where, "a second patch starts here; keep one patch per file (git format-patch does)")
            )
        if _NOT_TEXT.search(line):
            problems.append(Problem(patch.path, where, "control characters in the diff: content that is not text"))
    return problems


# The "Trojan Source" class: code points that reorder how a line is shown, so a reviewer reads
# other code than the compiler does (CVE-2021-42574).
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f" + "".join(map(chr, range(0x202A, 0x202F))) + "".join(map(chr, range(0x2066, 0x206A)))
)
_HUNK_HEADER = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@")


def invisible_problems(patch: PatchFile) -> list[Problem]:
    """Invisible format characters (Unicode category Cf: bidirectional controls, zero-width
    spaces and joiners, ...) in the lines the patch adds, each at its patch line and at its line
    in the patched file: a review of the patch cannot see them, so what it approves is not what
    runs. Context and removed lines are upstream's and are left to upstream."""
    problems = []
    path, target, in_hunk = "", 0, False
    # Split on newlines only, as git counts lines; str.splitlines also breaks at U+2028 and others.
    for index, line in enumerate(patch.diff_text.split("\n")):
        if line.startswith("diff --git "):
            path, in_hunk = line.split()[-1].removeprefix("b/"), False
            continue
        header = _HUNK_HEADER.match(line)
        if header:
            target, in_hunk = int(header.group(1)), True
            continue
        if not in_hunk:
            if line.startswith("+++ ") and line[4:].strip() != "/dev/null":
                path = line[4:].strip().removeprefix("b/")
            continue
        if line.startswith("+"):
            for column, char in enumerate(line[1:]):
                # A byte-order mark opening a file is how some editors save it, and shows nowhere.
                if char == "\ufeff" and target == 1 and column == 0:
                    continue
                if unicodedata.category(char) == "Cf":
                    kind = "a bidirectional control" if char in _BIDI_CONTROLS else "an invisible format character"
                    problems.append(
                        Problem(
                            patch.path,
                            patch.diff_line + index,
                            f"{path}:{target}: added line holds U+{ord(char):04X} "
                            f"{unicodedata.name(char, 'unnamed')} ({kind}: it does not show in a review); refused",
                        )
                    )
            target += 1
        elif line.startswith(" ") or line == "":
            target += 1
    return problems


def _overlapping_hunks(patch: PatchFile, patched: unidiff.PatchedFile, header: int) -> list[Problem]:
    """Hunks of one file must come in order and not overlap (a repeated hunk overlaps itself)."""
    problems = []
    end = 0
    for number, hunk in enumerate(patched, 1):
        start = hunk.source_start
        if number > 1 and start < end:
            problems.append(
                Problem(patch.path, header, f"hunk {number} of {patched.path} (line {start}) overlaps or precedes hunk {number - 1}")
            )
        end = max(end, start + hunk.source_length)
    return problems


def unsafe_path_reason(raw: str) -> str | None:
    """Why git itself (``verify_path`` with its NTFS and HFS protections) or we refuse the path."""
    if raw == "/dev/null":
        return None
    path = raw[2:] if raw.startswith(("a/", "b/")) else raw
    if path.startswith("/"):
        return "absolute paths are refused"
    if not path or path.endswith("/") or "//" in path:
        return "empty path components are refused"
    if "\\" in path or _NOT_TEXT.search(path) or "\t" in path or "\n" in path:
        return "backslashes and control characters are refused in paths"
    for part in path.split("/"):
        if part == "..":
            return "paths with '..' are refused"
        if part == ".":
            return "paths with '.' components are refused"
        # git refuses .git in any case, and the names NTFS and HFS+ read as .git.
        bare = part.rstrip(". ").lower().replace("\u200c", "").replace("\u200d", "")
        if bare in (".git", "git~1"):
            return "paths into .git are refused (git would too)"
        if ":" in part:
            return "':' is refused in paths (NTFS streams; git refuses it there)"
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
