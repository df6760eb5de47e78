"""Writing patches the way quilt and git users do, on a pin's applied tree.

    sglpatch patch start 0.5.14      the pin's tree with the series applied, ready for your commits
    (edit build/trees/0.5.14, git commit; amend or rebase the series' own commits to change them)
    sglpatch patch refresh 0.5.14    every commit of the tree's sglpatch branch back into patches/
    sglpatch export 0.5.14 --quilt DIR | --mbox FILE
                                     the pin's applied series for plain quilt or git am

``refresh`` is quilt's ``refresh`` over git commits: a commit whose subject is a patch of the
series updates that patch's rendition for the pin where its content changed; a new commit becomes
the next numbered patch, named in the series' style (``patch_file_name``: lowercase words of its
subject) and added to ``patches/series``, or,
with ``--rendition-of PATCH``, that patch's rendition for the pin (its layout differs). New
patches get the metadata trailers that are facts (``Upstream-Status: Pending``, ``Applies-To:
==<pin>``: it was made on that pin alone); Origin and Witness are the author's to write, and
``sglpatch check`` says so. Each refreshed commit is kept reachable under
``refs/sglpatch/refreshed/`` so the next ``apply`` can replace it with the series' own commit.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sglpatch.apply.apply_pins import apply_series
from sglpatch.apply.outcomes import APPLIED_STATES
from sglpatch.apply.tree_repo import BRANCH
from sglpatch.plumbing import cache
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import git_out, run_git
from sglpatch.series.check import check_series
from sglpatch.series.lock import read_lock
from sglpatch.series.patches import RENDITIONS_DIR, SERIES_FILE, PatchFile, series_entries
from sglpatch.sources.pristine_tree import PRISTINE_REF

REFRESHED_REFS = "refs/sglpatch/refreshed/"
_NUMBER_RE = re.compile(r"^(\d{4})-")


@dataclass(frozen=True)
class Refreshed:
    path: Path
    action: str  # "new", "updated", "new rendition", "unchanged"
    subject: str


def tree_of(project, version: str) -> Path:
    tree = project.build_dir / "trees" / version
    if not (tree / ".git").is_dir():
        raise SglpatchError(f"{tree}: no applied tree for {version}; run `sglpatch patch start {version}` first")
    return tree


def start(project, version: str):
    """The pin's tree with the series applied (nothing of the user's is dropped: apply refuses)."""
    report = apply_series(project, [version])
    result = report.results[0]
    if not result.ok:
        raise SglpatchError(f"sglang {version}: the series does not apply cleanly, so no patch can start: {result.error}")
    return Path(result.tree_path)


def applied_renditions(project, version: str) -> list[tuple[str, PatchFile]]:
    """(series name, rendition file) of every patch the lock says was applied to ``version``."""
    entry = read_lock(project.lock_file)["pins"].get(version)
    if entry is None:
        raise SglpatchError(f"{project.lock_file}: no entry for {version}; run `sglpatch apply {version}` first")
    series = project.series()
    applied = []
    for outcome in entry.get("patches", []):
        if outcome.get("status") in APPLIED_STATES:
            rendition = series.get(outcome["name"]).for_version(version)
            if rendition is None:
                raise SglpatchError(f"{outcome['name']}: the lock applies it to {version} but no rendition covers it")
            applied.append((outcome["name"], rendition))
    return applied


def refresh(project, version: str, rendition_of: str | None = None) -> list[Refreshed]:
    """Write every commit of the pin's tree back into ``patches/`` (see the module's docstring)."""
    tree = tree_of(project, version)
    series = project.series()
    by_subject = {}
    for patch in series.patches:
        rendition = patch.for_version(version)
        if rendition is not None:
            by_subject[am_subject(rendition.subject, tree)] = (patch, rendition)
    commits = git_out(["rev-list", "--reverse", f"{PRISTINE_REF}..refs/heads/{BRANCH}"], tree).split()
    if not commits:
        raise SglpatchError(f"{tree}: branch {BRANCH} holds no commit on top of the pristine release")
    target = series.get(rendition_of) if rendition_of else None
    # The series' own commit of each patch on this pin, as apply made it and the lock pins it: a
    # commit with its change is unchanged, whatever the rendition's text (apply may have applied
    # it at an offset or merged it three-way).
    locked = {o.get("name"): o.get("commit", "") for o in read_lock(project.lock_file)["pins"].get(version, {}).get("patches", [])}
    written: list[Refreshed] = []
    staged: dict[Path, bytes] = {}
    new_entries: list[str] = []
    number = _next_number(project.patches_dir)
    for commit in commits:
        subject = am_subject(git_out(["log", "-1", "--format=%s", commit], tree), tree)
        known = by_subject.get(subject)
        if known is not None:
            patch, rendition = known
            text = _format_patch(tree, commit, number=None)
            own = locked.get(patch.name, "")
            text = _with_subject_of(text, rendition.raw)
            if _same_patch(text, rendition.raw) or (own and _same_change(tree, commit, own)):
                written.append(Refreshed(rendition.path, "unchanged", subject))
            else:
                staged[rendition.path] = text
                written.append(Refreshed(rendition.path, "updated", subject))
            continue
        if target is not None:
            path = project.patches_dir / RENDITIONS_DIR / target.stem / f"{version}.patch"
            if path.exists():
                raise SglpatchError(f"{path}: a rendition for {version} exists already; amend its commit instead")
            staged[path] = _format_patch(tree, commit, number=None, applies_to=version)
            written.append(Refreshed(path, "new rendition", subject))
            continue
        text = _format_patch(tree, commit, number=number, applies_to=version)
        name = patch_file_name(number, git_out(["log", "-1", "--format=%s", commit], tree))
        staged[project.patches_dir / name] = text
        new_entries.append(name)
        written.append(Refreshed(project.patches_dir / name, "new", subject))
        number += 1
    for path, text in staged.items():
        cache.write_atomically(path, text)
    if new_entries:
        series_file = project.patches_dir / SERIES_FILE
        current = series_file.read_text()
        cache.write_atomically(series_file, current + ("" if current.endswith("\n") else "\n") + "".join(f"{n}\n" for n in new_entries))
    for commit, item in zip(commits, written):
        # An unchanged patch's commit that is not the series' own (a rebase made it anew) is the
        # user's too: apply replaces it only where it is kept.
        if item.action != "unchanged" or commit not in locked.values():
            run_git(["update-ref", f"{REFRESHED_REFS}{item.path.stem}-{commit[:12]}", commit], tree)
    return written


def problems_of(project, refreshed: list[Refreshed]) -> tuple[list[str], list[str]]:
    """``sglpatch check``'s findings in the files just written: (problems, tests still to write).
    A new patch's missing regression test is the next step, not a problem of what was written."""
    paths = {item.path for item in refreshed if item.action != "unchanged"}
    new = {item.path for item in refreshed if item.action == "new"}
    found = [p for p in check_series(project.patches_dir, project.pins()) if p.path in paths]
    awaited = [p for p in found if p.awaits_test and p.path in new]
    return [str(p) for p in found if p not in awaited], [p.message.removeprefix("no regression test: ") for p in awaited]


def am_subject(text: str, cwd: Path) -> str:
    """The subject ``git am`` gives a commit of a patch with this subject: git's own rules
    (``git mailinfo``), which drop every leading bracketed prefix (``[PATCH v2]``, and the
    ``[AMD]``/``[Quark]`` of upstream's titles too), ``Re:`` and folded whitespace. A subject
    already rewritten so is given back as it is, so a commit's and a patch's subjects compare."""
    with tempfile.TemporaryDirectory(prefix="sglpatch-mail-") as scratch:
        message = f"Subject: {' '.join(text.split())}\n\n".encode()
        info = run_git(["mailinfo", str(Path(scratch) / "msg"), str(Path(scratch) / "patch")], cwd, input=message)
    for line in info.stdout.decode(errors="replace").splitlines():
        if line.startswith("Subject: "):
            return line.removeprefix("Subject: ").strip()
    return ""


def _subject_header(text: bytes) -> tuple[int, int, list[bytes]]:
    """(first line, end line, lines) of the patch's ``Subject:`` header, folded lines included."""
    lines = text.split(b"\n")
    for start, line in enumerate(lines):
        if line == b"":
            break
        if line.startswith(b"Subject:"):
            end = start + 1
            while end < len(lines) and lines[end][:1] in (b" ", b"\t"):
                end += 1
            return start, end, lines
    return -1, -1, lines


def _with_subject_of(text: bytes, original: bytes) -> bytes:
    """``text`` (git format-patch of a commit) with the subject header of the patch it came from:
    git am dropped the patch's bracketed prefixes from the commit, and writing the patch back
    must not drop them from the series."""
    start, end, lines = _subject_header(text)
    first, last, old = _subject_header(original)
    if start < 0 or first < 0:
        return text
    return b"\n".join([*lines[:start], *old[first:last], *lines[end:]])


def _next_number(patches_dir: Path) -> int:
    numbers = [int(m.group(1)) for _, name in series_entries(patches_dir) if (m := _NUMBER_RE.match(Path(name).name))]
    return max(numbers, default=0) + 1


def _format_patch(tree: Path, commit: str, *, number: int | None, applies_to: str | None = None) -> bytes:
    """``git format-patch --zero-commit`` of ``commit``, with the factual trailers added if absent."""
    if applies_to is not None:
        commit = _with_trailers(tree, commit, {"Upstream-Status": "Pending", "Applies-To": f"=={applies_to}"})
    args = ["format-patch", "-1", "--stdout", "--zero-commit", "--no-signature"]
    if number is not None:
        args += ["--start-number", str(number)]
    return run_git([*args, commit], tree).stdout


NAME_LENGTH = 60  # of the words after the number, as long as the series' own names run


def patch_file_name(number: int, subject: str) -> str:
    """The series' style of name for a new patch: its number, then the words of its subject in
    lowercase joined by ``-`` (a bracketed tag such as ``[AMD]`` a word like the others, anything
    but letters and digits a break), cut at a word within ``NAME_LENGTH`` characters:
    "[AMD] Parse the connector type up to the first `://` only" is
    ``0004-amd-parse-the-connector-type-up-to-the-first-only.patch``."""
    words, length = [], 0
    for word in re.findall(r"[a-z0-9]+", subject.lower()):
        if words and length + 1 + len(word) > NAME_LENGTH:
            break
        words.append(word)
        length += len(word) + (1 if len(words) > 1 else 0)
    return f"{number:04d}-{'-'.join(words) or 'patch'}.patch"


def _with_trailers(tree: Path, commit: str, trailers: dict[str, str]) -> str:
    """The same commit (tree, parents, author, dates) with ``trailers`` added where the message
    has none of that key; a key the author wrote keeps the author's value."""
    message = run_git(["log", "-1", "--format=%B", commit], tree).stdout
    present = {
        line.split(":", 1)[0].strip().lower()
        for line in run_git(["interpret-trailers", "--parse"], tree, input=message).stdout.decode().splitlines()
    }
    missing = [f"{key}: {value}" for key, value in trailers.items() if key.lower() not in present]
    if not missing:
        return commit
    args = ["interpret-trailers", *(arg for trailer in missing for arg in ("--trailer", trailer))]
    new_message = run_git(args, tree, input=message).stdout
    info = git_out(["log", "-1", "--format=%an%x00%ae%x00%aI%x00%cn%x00%ce%x00%cI%x00%T%x00%P", commit], tree).split("\0")
    env = {
        "GIT_AUTHOR_NAME": info[0], "GIT_AUTHOR_EMAIL": info[1], "GIT_AUTHOR_DATE": info[2],
        "GIT_COMMITTER_NAME": info[3], "GIT_COMMITTER_EMAIL": info[4], "GIT_COMMITTER_DATE": info[5],
    }
    parents = [arg for parent in info[7].split() for arg in ("-p", parent)]
    return git_out(["commit-tree", info[6], *parents], tree, env=env, input=new_message)


def _same_change(tree: Path, commit: str, other: str) -> bool:
    """Whether two commits make the same change with the same message (``git patch-id --stable``
    of each diff, and the messages), where the other commit is in the tree's repository."""
    if run_git(["cat-file", "-e", f"{other}^{{commit}}"], tree, check=False).returncode != 0:
        return False

    def identity(sha: str) -> tuple[str, bytes]:
        diff = run_git(["diff-tree", "-p", "--no-commit-id", f"{sha}^", sha], tree).stdout
        patch_id = run_git(["patch-id", "--stable"], tree, input=diff).stdout.decode().split()
        return (patch_id[0] if patch_id else ""), run_git(["log", "-1", "--format=%B", sha], tree).stdout

    return identity(commit) == identity(other)


def _same_patch(new: bytes, old: bytes) -> bool:
    """Equal as patches: message and diff alike, whatever git version signed the file."""
    def body(text: bytes) -> str:
        lines = text.decode(errors="replace").splitlines()
        lines = [line for line in lines if not re.match(r"^index [0-9a-f]+\.\.[0-9a-f]+", line)]
        for index in range(len(lines) - 1, -1, -1):
            if lines[index] == "-- ":
                lines = lines[:index]
                break
        return "\n".join(lines[1:]).rstrip()
    return body(new) == body(old)
