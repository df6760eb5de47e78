"""A patch as the upstream pull requests it leaves as: one, or one per ``PR-Split`` trailer.

A patch that carries two concerns (upstream reviews and merges them separately) says so in its
trailers, one per pull request::

    PR-Split: fp8-kv-default: python/sglang/srt/arg_groups/overrides.py, test/registered/unit/...
    PR-Split: inert-fusion-warning: python/sglang/srt/arg_groups/parallel_hook.py, test/registered/unit/...

and its message gives each part's title and description after a line ``== NAME: TITLE ==``. Every
file of the diff and every regression test of the patch (``SeriesPatch.tests``, by its path in
upstream's repository) belongs to exactly one part: each pull request carries, and shows the run
of, its own test. The series
keeps one patch (one witness, one set of renditions, one lock entry); only ``upstream`` cuts it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from sglpatch.plumbing.errors import SglpatchError

SPLIT_TRAILER = "PR-Split"
_SECTION_RE = re.compile(r"^== (?P<name>[A-Za-z0-9][\w.-]*): (?P<title>.+?) ==$", re.M)
_TRAILER_LINE_RE = re.compile(rf"^{SPLIT_TRAILER}:.*$", re.M | re.I)


@dataclass(frozen=True)
class PrPart:
    """One pull request of a patch: ``name`` is "" for a patch that is not split; ``paths`` the
    files it carries (empty: every file of the patch and all its tests)."""

    name: str
    title: str
    text: str
    paths: tuple[str, ...] = ()

    def carries(self, path: str) -> bool:
        return not self.paths or path in self.paths


def pr_parts(patch_name: str, subject: str, message: str, trailers, diff_paths: list[str],
             test_paths: list[str]) -> list[PrPart]:
    """The parts of a patch from its subject, message (without trailers), ``(key, value)`` trailers,
    the paths its diff touches and its tests' paths; a malformed split is one line naming the patch."""
    splits = [value for key, value in trailers if key.lower() == SPLIT_TRAILER.lower()]
    if not splits:
        return [PrPart("", subject, message.strip())]
    declared: dict[str, tuple[str, ...]] = {}
    for value in splits:
        name, sep, paths = value.partition(":")
        name = name.strip()
        files = tuple(p.strip() for p in paths.split(",") if p.strip())
        if not sep or not name or not files:
            raise SglpatchError(f"{patch_name}: {SPLIT_TRAILER}: {value!r} is not 'NAME: PATH[, PATH...]'")
        if name in declared:
            raise SglpatchError(f"{patch_name}: {SPLIT_TRAILER} {name} is declared twice")
        declared[name] = files
    sections = list(_SECTION_RE.finditer(message))
    texts = {}
    for index, match in enumerate(sections):
        end = sections[index + 1].start() if index + 1 < len(sections) else len(message)
        texts[match["name"]] = (match["title"].strip(), message[match.end():end].strip())
    for name in declared:
        if name not in texts:
            raise SglpatchError(f"{patch_name}: {SPLIT_TRAILER} {name} has no '== {name}: TITLE ==' section in the message")
    for name in texts:
        if name not in declared:
            raise SglpatchError(f"{patch_name}: section '== {name}: ... ==' has no {SPLIT_TRAILER} trailer")
    owners: dict[str, str] = {}
    for name, files in declared.items():
        for path in files:
            if path in owners:
                raise SglpatchError(f"{patch_name}: {path} is in both {SPLIT_TRAILER} {owners[path]} and {name}")
            owners[path] = name
    for path in [*diff_paths, *test_paths]:
        if path not in owners:
            raise SglpatchError(f"{patch_name}: {path} is in no {SPLIT_TRAILER} part; name it in one")
    for path in owners:
        if path not in diff_paths and path not in test_paths:
            raise SglpatchError(f"{patch_name}: {SPLIT_TRAILER} {owners[path]} names {path}, which the patch does not touch")
    return [PrPart(name, texts[name][0], texts[name][1], files) for name, files in declared.items()]


def select_parts(patch_name: str, parts: list[PrPart], selector: str | None) -> list[PrPart]:
    """Every part, or the one ``selector`` names."""
    if not selector:
        return parts
    chosen = [part for part in parts if part.name == selector]
    if not chosen:
        names = ", ".join(part.name for part in parts if part.name) or "none: it is not split"
        raise SglpatchError(f"{patch_name}: no pull request part {selector!r} (its parts: {names})")
    return chosen


def part_diff(diff_text: str, part: PrPart) -> str:
    """The file sections of a ``git diff`` text that ``part`` carries, in their order."""
    if not part.paths:
        return diff_text
    sections = re.split(r"(?m)^(?=diff --git )", diff_text)
    kept = [s for s in sections if s.startswith("diff --git ") and _section_path(s) in part.paths]
    return "".join(kept)


def _section_path(section: str) -> str:
    header = section.splitlines()[0]
    match = re.match(r"diff --git a/(\S+) b/(\S+)$", header)
    return match[2] if match else ""


def without_split_markup(message: str) -> str:
    """A message with the PR-Split trailers removed (for a commit of the whole patch)."""
    return _TRAILER_LINE_RE.sub("", message).strip()
