"""The patch series: ``patches/series`` (quilt order), the format-patch files, their trailers.

Each patch is a ``git format-patch`` file that plain ``git am`` accepts. Its metadata lives in
trailers at the end of the commit message, after DEP-3 and Yocto:

    Upstream-Status: Pending | Submitted [url] | Accepted [version or commit]
                     | Backport [version] | Inappropriate [reason]
    Origin: who wrote it and from what
    Bug: where the problem is reported (optional)
    Witness: the check that fails without the patch and passes with it (``upstream-test``: the
             patch's own regression tests, below)
    Applies-To: the pins this rendition is for, as a PEP 440 specifier (">=0.5.10,<0.5.19")
    Fixed-Upstream-In: the first pin where upstream has the fix, with the evidence (optional)

Where upstream moved the code, a patch has more renditions, one file each, in
``patches/renditions/<patch name without .patch>/``; each carries its own ``Applies-To`` and the
rendition whose specifier contains a pin's version is the one applied to that pin (exactly, or by
git's three-way apply: ``sglpatch.apply.one_pin``). The main file is the newest rendition, the one that
covers the newest pin (``newest_in_main``).

A patch's regression tests, in sglang's own layout, live beside it in
``patches/tests/<patch name without .patch>/``, at the path the pull request adds them
(``test/registered/unit/<path mirroring python/sglang/srt>/test_*.py``). They are no part of
the diff: the released trees have no ``test/`` folder, and the pinned commits stay the release's
files plus the fix. The ``upstream-test`` witness runs them (``sglpatch.witnesses.upstream_test``).
"""

from __future__ import annotations

import email
import email.policy
import hashlib
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import run_git

SERIES_FILE = "series"
CHANGELOG_FILE = "CHANGELOG.md"
RENDITIONS_DIR = "renditions"
TESTS_DIR = "tests"  # patches/tests/<stem>/<path in upstream's repository>
# patches/tests/<stem>/cases.toml: which tests judge each of the patch's witness's cases; not a test.
CASES_FILE = "cases.toml"

REQUIRED_TRAILERS = ("Upstream-Status", "Origin", "Witness", "Applies-To")
# Every trailer that is our metadata rather than part of the change's description.
METADATA_TRAILERS = (*REQUIRED_TRAILERS, "Bug", "Fixed-Upstream-In", "PR-Split")
UPSTREAM_STATUS_RE = re.compile(
    r"^(Pending|(Submitted|Accepted|Backport|Inappropriate) \[[^\]]+\])$"
)
UPSTREAM_STATUS_VOCABULARY = (
    "Pending, Submitted [url], Accepted [version or commit], Backport [version], "
    "Inappropriate [reason]"
)
_CHANGELOG_VERSION_RE = re.compile(r"^## v(\d+)\b", re.MULTILINE)


@dataclass(frozen=True)
class Problem:
    """One lint finding, located at a file and line."""

    path: Path
    line: int
    message: str
    # A patch just written by ``patch refresh`` has no test yet: the step that follows, not a fault
    # of what refresh wrote (``sglpatch check`` still refuses the series until it is there).
    awaits_test: bool = False

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


@dataclass(frozen=True)
class PatchFile:
    path: Path
    raw: bytes
    subject: str
    author: str
    date: str
    trailers: tuple[tuple[str, str], ...]
    trailer_lines: dict[str, int]
    diff_text: str
    diff_line: int  # line number in the file where the diff starts

    def trailer(self, key: str) -> str | None:
        values = [value for name, value in self.trailers if name.lower() == key.lower()]
        return values[-1] if values else None

    @property
    def applies_to(self) -> SpecifierSet:
        spec = self.trailer("Applies-To")
        if spec is None:
            raise SglpatchError(f"{self.path}: no Applies-To trailer")
        try:
            return SpecifierSet(spec)
        except InvalidSpecifier:
            raise SglpatchError(f"{self.path}: Applies-To {spec!r} is not a PEP 440 specifier") from None

    def covers(self, version: str) -> bool:
        return self.applies_to.contains(Version(version), prereleases=True)


@dataclass(frozen=True)
class RegressionTest:
    """One test file a patch's pull request adds: ``path`` in upstream's repository
    (``test/registered/unit/...``), kept at ``file`` beside the patch."""

    path: str
    file: Path


@dataclass(frozen=True)
class SeriesPatch:
    """One entry of the series file with every rendition of it (the main file first), and the
    regression tests that go upstream with its main file."""

    name: str
    renditions: tuple[PatchFile, ...]
    tests: tuple[RegressionTest, ...] = ()

    @property
    def main(self) -> PatchFile:
        return self.renditions[0]

    @property
    def stem(self) -> str:
        return self.name.removesuffix(".patch")

    def for_version(self, version: str) -> PatchFile | None:
        """The rendition for ``version``; None when no rendition applies to it."""
        matches = [rendition for rendition in self.renditions if rendition.covers(version)]
        if len(matches) > 1:
            names = ", ".join(str(match.path) for match in matches)
            raise SglpatchError(f"patch {self.name}: several renditions claim {version}: {names}")
        return matches[0] if matches else None


@dataclass(frozen=True)
class Series:
    directory: Path
    version: str
    patches: tuple[SeriesPatch, ...]
    files: tuple[Path, ...] = field(default=())

    def digest(self) -> str:
        """sha256 over the series file, the changelog and every patch file, in series order."""
        digest = hashlib.sha256()
        for path in (self.directory / SERIES_FILE, *self.files):
            digest.update(str(path.relative_to(self.directory)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
        return digest.hexdigest()

    def get(self, name: str) -> SeriesPatch:
        """The patch ``name`` names: its file name, its stem or its number (``0002`` or ``2``);
        every verb that takes a patch finds it here."""
        for patch in self.patches:
            if name in (patch.name, patch.stem):
                return patch
        numbered = [patch for patch in self.patches if name.isdigit() and _number(patch.name) == int(name)]
        if len(numbered) == 1:
            return numbered[0]
        names = ", ".join(patch.name for patch in (numbered or self.patches))
        if numbered:
            raise SglpatchError(f"{self.directory / SERIES_FILE}: {name!r} names several patches: {names}")
        raise SglpatchError(f"{self.directory / SERIES_FILE}: no patch named {name!r}; the series has {names or 'none'}")


def _number(name: str) -> int | None:
    """A patch's number, as git format-patch writes it at the start of its name (``0002-...``)."""
    digits = re.match(r"(\d+)-", name)
    return int(digits.group(1)) if digits else None


def series_entries(directory: Path) -> list[tuple[int, str]]:
    """(line number, patch name) for each entry of the quilt-style series file."""
    path = directory / SERIES_FILE
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise SglpatchError(f"{path}: series file not found") from None
    entries = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        name, *options = text.split()
        if options not in ([], ["-p1"]):
            raise SglpatchError(f"{path}:{number}: only -p1 patches are supported, got {' '.join(options)}")
        parts = PurePosixPath(name).parts
        if name.startswith(("/", "~")) or "\\" in name or ".." in parts or RENDITIONS_DIR == parts[0]:
            raise SglpatchError(
                f"{path}:{number}: {name!r} must name a patch file inside {directory} (no absolute path, "
                f"no '..', not under {RENDITIONS_DIR}/)"
            )
        entries.append((number, name))
    return entries


def series_version(directory: Path) -> str:
    path = directory / CHANGELOG_FILE
    try:
        match = _CHANGELOG_VERSION_RE.search(path.read_text())
    except FileNotFoundError:
        raise SglpatchError(f"{path}: changelog not found; it holds the series version") from None
    if not match:
        raise SglpatchError(f"{path}: no '## vN' heading; the newest one is the series version")
    return match.group(1)


def load_series(directory: Path) -> Series:
    """The series with every patch parsed; the first malformed file stops it with its name."""
    patches = []
    files = [directory / CHANGELOG_FILE]
    for number, name in series_entries(directory):
        main = directory / name
        if not main.is_file():
            raise SglpatchError(f"{directory / SERIES_FILE}:{number}: {name} does not exist")
        extra = sorted((directory / RENDITIONS_DIR / name.removesuffix(".patch")).glob("*.patch"))
        renditions = tuple(parse_patch_file(path) for path in (main, *extra))
        files.extend(rendition.path for rendition in renditions)
        tests = regression_tests(directory, name.removesuffix(".patch"))
        files.extend(test.file for test in tests)
        patches.append(SeriesPatch(name=name, renditions=renditions, tests=tests))
    return Series(
        directory=directory,
        version=series_version(directory),
        patches=tuple(patches),
        files=tuple(files),
    )


def regression_tests(directory: Path, stem: str) -> tuple[RegressionTest, ...]:
    """Every file under ``patches/tests/<stem>/``, by its path in upstream's repository (but the
    patch's ``cases.toml``)."""
    root = directory / TESTS_DIR / stem
    if not root.is_dir():
        return ()
    found = sorted(p for p in root.rglob("*")
                   if p.is_file() and "__pycache__" not in p.parts and p != root / CASES_FILE)
    return tuple(RegressionTest(p.relative_to(root).as_posix(), p) for p in found)


def parse_patch_file(path: Path) -> PatchFile:
    """A format-patch file split into headers, commit message trailers and the diff."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SglpatchError(f"{path}: not UTF-8 text ({exc})") from None
    lines = text.splitlines(keepends=True)
    if not lines or not lines[0].startswith("From "):
        raise SglpatchError(f"{path}:1: not a git format-patch file (no 'From <sha> <date>' line)")
    header_end = next((i for i, line in enumerate(lines) if line in ("\n", "\r\n")), None)
    if header_end is None:
        raise SglpatchError(f"{path}: no blank line after the mail headers")
    headers = email.message_from_string("".join(lines[1:header_end]), policy=email.policy.default)
    for required in ("From", "Date", "Subject"):
        if not headers.get(required):
            raise SglpatchError(f"{path}: mail header {required} is missing")
    separator = next((i for i in range(header_end, len(lines)) if lines[i].rstrip("\r\n") == "---"), None)
    diff_start = next((i for i in range(header_end, len(lines)) if lines[i].startswith("diff --git ")), None)
    if diff_start is None:
        raise SglpatchError(f"{path}: no 'diff --git' section; the patch is empty or truncated")
    if separator is None or separator > diff_start:
        raise SglpatchError(f"{path}: no '---' line between the commit message and the diff")
    body = "".join(lines[header_end + 1 : separator])
    trailers = _parse_trailers(path, body)
    trailer_lines = {}
    for index in range(header_end + 1, separator):
        key = lines[index].split(":", 1)[0]
        if ":" in lines[index] and " " not in key:
            trailer_lines[key.lower()] = index + 1
    diff_lines = lines[diff_start:]
    # format-patch ends with a "-- " signature line and the git version; it is not part of the diff.
    for index in range(len(diff_lines) - 1, -1, -1):
        if diff_lines[index].rstrip("\r\n") == "-- ":
            diff_lines = diff_lines[:index]
            break
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", str(headers["Subject"]))
    return PatchFile(
        path=path,
        raw=raw,
        subject=subject,
        author=str(headers["From"]),
        date=str(headers["Date"]),
        trailers=trailers,
        trailer_lines=trailer_lines,
        diff_text="".join(diff_lines),
        diff_line=diff_start + 1,
    )


def _parse_trailers(path: Path, body: str) -> tuple[tuple[str, str], ...]:
    # git's own trailer parser, so what we read is what `git interpret-trailers` and reviewers see.
    result = run_git(
        ["interpret-trailers", "--parse", "--no-divider"], path.parent, input=body.encode()
    )
    trailers = []
    for line in result.stdout.decode().splitlines():
        key, _, value = line.partition(":")
        trailers.append((key.strip(), value.strip()))
    return tuple(trailers)


# -- writing trailers -----------------------------------------------------------------------------


def message_trailers(text: str) -> list[tuple[str, str]]:
    """The trailers of a format-patch file's commit message (above its ``---``), as git reads them."""
    parsed = run_git(["interpret-trailers", "--parse"], Path(tempfile.gettempdir()), input=text.encode())
    return [(key.strip(), value.strip()) for key, _, value in
            (line.partition(":") for line in parsed.stdout.decode().splitlines())]


def set_trailers(text: str, trailers: dict[str, str], *, where: str = "after") -> str:
    """A format-patch file's text with each trailer set in its commit message by ``git
    interpret-trailers`` (the diff below ``---`` as it was): one of that key is replaced -- in its
    place (``where="after"``) or moved to the end (``"end"``) -- and a missing one added at the end."""
    args = ["interpret-trailers", "--where", where, "--if-exists", "replace", "--if-missing", "add"]
    for key, value in trailers.items():
        args += ["--trailer", f"{key}: {value}"]
    return run_git(args, Path(tempfile.gettempdir()), input=text.encode()).stdout.decode()


def spec_for(versions, pinned) -> str | None:
    """The ``Applies-To`` that holds exactly ``versions`` among the ``pinned`` versions (``==v``
    or ``>=a,<=b``), or None where no single range does."""
    chosen = sorted(set(versions), key=Version)
    if not chosen:
        return None
    if len(chosen) == 1:
        return f"=={chosen[0]}"
    low, high = Version(chosen[0]), Version(chosen[-1])
    inside = sorted((v for v in set(pinned) | set(chosen) if low <= Version(v) <= high), key=Version)
    return f">={chosen[0]},<={chosen[-1]}" if inside == chosen else None


def covered_by(text: str, pinned: list[str]) -> list[str]:
    """The pinned versions a rendition's text claims by its ``Applies-To``."""
    spec = dict(message_trailers(text)).get("Applies-To", "")
    found = SpecifierSet(spec)
    return [version for version in pinned if found.contains(Version(version), prereleases=True)]


def newest_in_main(patch: SeriesPatch, texts: dict[Path, str | None], pinned: list[str]) -> dict[Path, str | None]:
    """``texts`` (a rendition's path -> its new text, None where it goes) with, where a file other
    than the main one then covers the newest pin, that file's text in the main file and the main
    file's text under ``renditions/`` named after the newest pin it covers."""
    final = {r.path: r.raw.decode() for r in patch.renditions}
    final.update(texts)
    final = {path: text for path, text in final.items() if text is not None}
    main = patch.main.path
    covering = {path: covered_by(text, pinned) for path, text in final.items()}
    claimed = [version for versions in covering.values() for version in versions]
    if not claimed:
        return texts
    newest = max(claimed, key=Version)
    holder = next(path for path, versions in covering.items() if newest in versions)
    if holder == main:
        return texts
    changes = dict(texts)
    changes[main] = final[holder]
    changes[holder] = None
    if main in final and covering[main]:
        aside = main.parent / RENDITIONS_DIR / patch.stem / f"{max(covering[main], key=Version)}.patch"
        if aside in final and aside != holder:
            raise SglpatchError(f"{aside}: exists, so the main file of {patch.name} cannot move there; rename one by hand")
        changes[aside] = final[main]
    return changes
