"""The merge tools ``rebase`` tries a rendition with, past an exact and a three-way apply.

Each takes the rendition's diff, the pristine commit of the release it was made for (``base``, its
objects borrowed into the trial repository) and the commit to port onto (the new release's pristine
tree with the patches accepted before), and proposes a tree -- or says why it could not. None of
them decides: the judge (``sglpatch.rebase.judge``) does.

- ``merge_ort``: git's own merge (merge-ort, rename detection on) of the rendition's commit, made on
  the tree it was made for, onto the new tree -- a cherry-pick, run with ``git merge-tree
  --write-tree`` on a history where both trees are children of the old release. It follows files
  that moved. A conflicted result keeps zdiff3 markers (for the tree left to a person).
- ``wiggle``: Debian's ``wiggle --merge`` per file (new, old, old patched), which merges hunks whose
  context changed word by word; a file that moved is followed by git's rename detection.
- ``follow_renames``: a proposal whose added lines use a name the release renamed in that file
  (``get_global_server_args`` -> ``get_server_args``), with the release's name instead;
- ``sibling_lines``: a proposal whose added line uses a name the release lacks (the judge's
  finding), with that line as another rendition of the patch wrote it where that rendition's line
  uses no missing name -- a rendition made for an older release where the proposal came from a
  newer one, or the other way round;
- ``reduce``: the rendition without the hunks the release already holds (each reverse-applies on
  its own) and without the files the release removed; what is left goes through the cascade again.
"""

from __future__ import annotations

import collections
import difflib
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import unidiff

from sglpatch.apply.index_apply import reverse_applies
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import IDENTITY_EMAIL, IDENTITY_NAME, commit_env, git_out, run_git
from sglpatch.plumbing.processes import declared_env, run_tool

# Commits of the trial history only, under one identity and date, so their hashes reproduce.
FIXED_COMMIT_ENV = commit_env(IDENTITY_NAME, IDENTITY_EMAIL, "1970-01-01T00:00:00Z")
WIGGLE_TIMEOUT_S = 120


@dataclass
class Proposal:
    """What one tool proposed: a tree (or "" when it could not), what it changed, why not."""

    tree: str = ""
    changed: list[str] = field(default_factory=list)  # paths the proposal changes, on the new tree
    detail: str = ""
    conflict_tree: str = ""  # merge-ort's tree with conflict markers, where it conflicted
    content_only: bool = False  # every conflict is within a file both sides kept (no modify/delete, rename)


def _index_env(scratch: Path, name: str) -> dict[str, str]:
    return {"GIT_INDEX_FILE": str(scratch / f"index-{name}")}


def patched_base(repo: Path, base: str, diff: str, scratch: Path) -> tuple[str, str]:
    """(commit of the rendition applied exactly on ``base``, "") or ("", why it does not apply)."""
    env = _index_env(scratch, "base")
    run_git(["read-tree", base], repo, env=env)
    applied = run_git(["apply", "--cached", "--whitespace=nowarn", "-"], repo, env=env, input=diff.encode(), check=False)
    if applied.returncode != 0:
        return "", "does not apply to the tree it was made for: " + applied.stderr.decode(errors="replace").strip()[-600:]
    tree = git_out(["write-tree"], repo, env=env)
    return git_out(["commit-tree", tree, "-p", base, "-m", "rendition"], repo, env=FIXED_COMMIT_ENV), ""


def _graft(repo: Path, onto: str, base: str) -> str:
    """The tree of ``onto`` as a child of ``base``, so a merge takes ``base`` as the merge base."""
    return git_out(["commit-tree", f"{onto}^{{tree}}", "-p", base, "-m", "release"], repo, env=FIXED_COMMIT_ENV)


def _changed(repo: Path, a: str, b: str) -> list[str]:
    out = git_out(["diff", "--name-only", "--no-renames", a, b], repo)
    return [line for line in out.splitlines() if line]


def merge_ort(repo: Path, base: str, diff: str, onto: str, scratch: Path) -> Proposal:
    patched, why = patched_base(repo, base, diff, scratch)
    if not patched:
        return Proposal(detail=why)
    release = _graft(repo, onto, base)
    merged = run_git(
        ["-c", "merge.conflictStyle=zdiff3", "merge-tree", "--write-tree", "--messages", release, patched],
        repo, check=False,
    )
    out = merged.stdout.decode(errors="replace").splitlines()
    if merged.returncode not in (0, 1) or not out:
        return Proposal(detail=merged.stderr.decode(errors="replace").strip()[-600:])
    tree = out[0].strip()
    messages = "\n".join(line for line in out[1:] if line.strip())
    if merged.returncode == 1:
        kinds = re.findall(r"^CONFLICT \(([^)]*)\)", messages, re.MULTILINE)
        return Proposal(detail=("conflict: " + messages)[-1500:], conflict_tree=tree, changed=_changed(repo, onto, tree),
                        content_only=bool(kinds) and all(kind == "content" for kind in kinds))
    return Proposal(tree, _changed(repo, onto, tree), messages[-800:])


def _renamed_to(repo: Path, base: str, release: str, path: str) -> str | None:
    """Where git's rename detection finds ``path`` of ``base`` in ``release`` (None: removed)."""
    out = git_out(["diff", "--name-status", "-M50%", "--diff-filter=R", base, release], repo)
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[1] == path:
            return parts[2]
    return None


def stage_file(repo: Path, env: dict[str, str], path: str, data: bytes, mode_of: str | None) -> None:
    """``data`` as ``path`` in the index ``env`` names, with the file mode ``path`` has in the tree
    ``mode_of`` (100644 where it has none there, or where ``mode_of`` is None: a new file)."""
    blob = git_out(["hash-object", "-w", "--stdin"], repo, input=data)
    mode = (git_out(["ls-tree", mode_of, "--", path], repo).split(" ")[0] if mode_of else "") or "100644"
    run_git(["update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}"], repo, env=env)


def file_at(repo: Path, commit: str, path: str) -> bytes | None:
    """The file at ``path`` in ``commit``; None where the commit has none."""
    shown = run_git(["cat-file", "blob", f"{commit}:{path}"], repo, check=False)
    return shown.stdout if shown.returncode == 0 else None


def _exists(repo: Path, commit: str, path: str) -> bool:
    return run_git(["cat-file", "-e", f"{commit}:{path}"], repo, check=False).returncode == 0


def _wiggle(args: list[str]) -> tuple[bytes | None, str]:
    done = run_tool(["wiggle", "--merge", *args], "wiggle", WIGGLE_TIMEOUT_S, unavailable=True, env=declared_env(), input=b"")
    if done.returncode != 0:
        return None, (done.stderr.decode(errors="replace") or "").strip() or f"exit status {done.returncode}"
    return done.stdout, ""


def wiggle(repo: Path, base: str, diff: str, onto: str, scratch: Path) -> Proposal:
    """Per file of ``diff``: ``wiggle --merge FILE PATCH`` (the file's hunks onto the release's
    file, their context wiggled), and where that leaves a conflict ``wiggle --merge NEW OLD
    OLD-PATCHED`` (the change between the trees it was made for, merged word by word)."""
    env = _index_env(scratch, "wiggle")
    run_git(["read-tree", onto], repo, env=env)
    release = None
    notes = []
    work = Path(tempfile.mkdtemp(dir=scratch, prefix="wiggle-"))
    patched = None
    for number, part in enumerate(unidiff.PatchSet(diff)):
        path = part.path
        target = path
        if part.is_added_file:
            if _exists(repo, onto, path):
                return Proposal(detail=f"{path}: the patch creates it, and the release has one")
            merged = "".join(line.value for hunk in part for line in hunk if not line.is_removed).encode()
        else:
            if not _exists(repo, onto, path):
                release = release or _graft(repo, onto, base)
                target = _renamed_to(repo, base, release, path)
                if target is None:
                    return Proposal(detail=f"{path}: the release removed it")
                notes.append(f"{path} -> {target} (moved)")
            if part.is_removed_file:
                run_git(["update-index", "--force-remove", target], repo, env=env)
                continue
            (work / f"{number}.release").write_bytes(file_at(repo, onto, target) or b"")
            (work / f"{number}.patch").write_text(_file_header(part) + "".join(str(hunk) for hunk in part))
            merged, why = _wiggle([str(work / f"{number}.release"), str(work / f"{number}.patch")])
            if merged is None:
                if patched is None:
                    patched, reason = patched_base(repo, base, diff, scratch)
                    if not patched:
                        return Proposal(detail=f"{target}: wiggle left conflicts ({why}); {reason}")
                (work / f"{number}.old").write_bytes(file_at(repo, base, path) or b"")
                (work / f"{number}.new").write_bytes(file_at(repo, patched, path) or b"")
                merged, why3 = _wiggle([str(work / f"{number}.release"), str(work / f"{number}.old"), str(work / f"{number}.new")])
                if merged is None:
                    return Proposal(detail=f"{target}: wiggle left conflicts, from the patch ({why}) and from the trees ({why3})")
                notes.append(f"{target}: merged from the trees it was made for")
        stage_file(repo, env, target, merged, None if part.is_added_file else onto)
    tree = git_out(["write-tree"], repo, env=env)
    return Proposal(tree, _changed(repo, onto, tree), "; ".join(notes))


def wiggle_available() -> bool:
    try:
        return run_tool(["wiggle", "--version"], "wiggle", 30, env=declared_env()).returncode == 0
    except SglpatchError:
        return False


# -- per hunk ----------------------------------------------------------------------------------------


@dataclass
class Reduced:
    diff: str  # the rendition's diff without the dropped hunks ("" when nothing is left)
    dropped: list[str]  # one line per dropped hunk or file, saying why


def _file_header(patched: unidiff.PatchedFile) -> str:
    source = patched.source_file if patched.source_file == "/dev/null" else patched.source_file
    return f"--- {source}\n+++ {patched.target_file}\n"


def reduce(repo: Path, diff: str, onto: str, scratch: Path) -> Reduced:
    """Drop from ``diff`` each hunk that reverse-applies on ``onto`` by itself (the release holds that
    change) and each file ``onto`` does not have (the release removed it; the judge then decides
    whether the port is whole without it)."""
    env = _index_env(scratch, "reduce")
    run_git(["read-tree", onto], repo, env=env)
    kept, dropped = [], []
    for patched in unidiff.PatchSet(diff):
        path = patched.path
        if not patched.is_added_file and not _exists(repo, onto, path):
            dropped.append(f"{path}: every hunk ({len(patched)}), the release removed the file")
            continue
        hunks = []
        for number, hunk in enumerate(patched, 1):
            single = _file_header(patched) + str(hunk)
            if reverse_applies(repo, env, single) and not patched.is_added_file:
                dropped.append(f"{path}: hunk {number} (at line {hunk.source_start}), the release already holds it")
            else:
                hunks.append(str(hunk))
        if hunks:
            kept.append(_file_header(patched) + "".join(hunks))
    return Reduced("".join(kept), dropped)


# -- names the release renamed around the patch ---------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _skeleton(line: str) -> tuple[str, list[str]]:
    return _IDENT.sub("\0", line.strip()), _IDENT.findall(line)


def learned_renames(old: str, new: str) -> dict[str, str]:
    """Identifiers the release renamed in this file: ``a`` became ``b`` on every changed line that
    held ``a``, each of the same shape as before but for the names (``get_global_server_args()`` ->
    ``get_server_args()``), and ``a`` occurs nowhere in the release's file. A name whose uses
    changed shape anywhere but in an import (``get_server_args().x`` -> ``get_exec().comm.x``) is
    no rename."""
    old_lines, new_lines = old.splitlines(), new.splitlines()
    votes: collections.Counter = collections.Counter()
    spoiled: set[str] = set()
    gone, came = [], collections.defaultdict(list)  # changed lines, the new ones by shape
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            gone += old_lines[i1:i2]
            for line in new_lines[j1:j2]:
                shape, names = _skeleton(line)
                came[(shape, len(names))].append(names)
    # Each changed old line against a changed new line of its shape, anywhere in the file (a
    # line upstream moved is a delete and an insert to difflib).
    for line in gone:
        shape, names_a = _skeleton(line)
        pool = came.get((shape, len(names_a)))
        if pool:
            # The one that keeps most of its names where they were.
            best = max(range(len(pool)), key=lambda k: sum(x == y for x, y in zip(names_a, pool[k])))
            names_b = pool.pop(best)
            votes.update((x, y) for x, y in zip(names_a, names_b) if x != y)
        elif not line.lstrip().startswith(("from ", "import ")):
            spoiled.update(_IDENT.findall(line))  # used otherwise now (imports are only regrouped)
    present = set(_IDENT.findall(new))
    chosen: dict[str, set[str]] = collections.defaultdict(set)
    for (x, y), _count in votes.items():
        if x not in present and y in present and x not in spoiled:
            chosen[x].add(y)
    return {x: next(iter(ys)) for x, ys in chosen.items() if len(ys) == 1}


def follow_renames(repo: Path, base: str, tree: str, onto: str, scratch: Path) -> Proposal:
    """The proposal ``tree`` with, on the lines it adds or changes against the release ``onto``, the
    identifiers the release renamed in the same file since ``base`` (``learned_renames``) renamed
    too. "" as the tree when there is nothing to rename."""
    env = _index_env(scratch, "renames")
    run_git(["read-tree", tree], repo, env=env)
    notes = []
    for path in _changed(repo, onto, tree):
        if not path.endswith(".py"):
            continue
        proposed, released, before = (file_at(repo, c, path) for c in (tree, onto, base))
        if proposed is None or released is None or before is None:
            continue
        renames = learned_renames(before.decode(errors="replace"), released.decode(errors="replace"))
        if not renames:
            continue
        text = proposed.decode(errors="replace")
        lines = text.splitlines(keepends=True)
        matcher = difflib.SequenceMatcher(a=released.decode(errors="replace").splitlines(keepends=True), b=lines, autojunk=False)
        done = collections.Counter()
        for tag, _, _, j1, j2 in matcher.get_opcodes():
            if tag not in ("replace", "insert"):
                continue
            for n in range(j1, j2):
                def swap(match):
                    name = match.group(0)
                    if name in renames:
                        done[f"{name} -> {renames[name]}"] += 1
                        return renames[name]
                    return name
                lines[n] = _IDENT.sub(swap, lines[n])
        if done:
            stage_file(repo, env, path, "".join(lines).encode(), tree)
            notes.append(f"{path}: " + ", ".join(f"{rename} ({count}x)" for rename, count in sorted(done.items())))
    if not notes:
        return Proposal(detail="the release renamed nothing the proposal's lines use")
    renamed = git_out(["write-tree"], repo, env=env)
    return Proposal(renamed, _changed(repo, onto, renamed), "renamed as the release did: " + "; ".join(notes))


# -- both sides inserted at one place ----------------------------------------------------------------

_CONFLICT = re.compile(
    r"^<<<<<<< [^\n]*\n(?P<ours>(?:(?!<<<<<<< |\|\|\|\|\|\|\| |=======\n).*\n)*?)"
    r"\|\|\|\|\|\|\| [^\n]*\n(?P<base>(?:.*\n)*?)=======\n(?P<theirs>(?:.*\n)*?)>>>>>>> [^\n]*\n",
    re.MULTILINE,
)


def resolve_insertions(text: str) -> tuple[str | None, int]:
    """``text`` with every zdiff3 conflict whose merge base is empty -- both sides inserted lines at
    the same place, such as a name each added to one import list -- resolved as both insertions,
    the release's first. (None, n) when some conflict changed lines both sides had (a real one)."""
    resolved = 0
    blocks = list(_CONFLICT.finditer(text))
    if not blocks or any(block.group("base") for block in blocks):
        return None, len(blocks)
    for block in reversed(blocks):
        text = text[: block.start()] + block.group("ours") + block.group("theirs") + text[block.end():]
        resolved += 1
    if "<<<<<<< " in text or ">>>>>>> " in text:
        return None, resolved
    return text, resolved


def keep_both_insertions(repo: Path, conflict_tree: str, onto: str, scratch: Path) -> Proposal:
    """merge-ort's conflicted tree with the conflicts where both sides only inserted resolved."""
    env = _index_env(scratch, "insertions")
    run_git(["read-tree", conflict_tree], repo, env=env)
    notes = []
    for path in _changed(repo, onto, conflict_tree):
        data = file_at(repo, conflict_tree, path)
        if data is None or b"<<<<<<< " not in data:
            continue
        text, count = resolve_insertions(data.decode(errors="surrogateescape"))
        if text is None:
            return Proposal(detail=f"{path}: a conflict changes lines both sides had; not only insertions")
        stage_file(repo, env, path, text.encode(errors="surrogateescape"), conflict_tree)
        notes.append(f"{path}: {count} conflict(s) where both sides inserted, both kept")
    if not notes:
        return Proposal(detail="no conflict markers in the merge")
    tree = git_out(["write-tree"], repo, env=env)
    return Proposal(tree, _changed(repo, onto, tree), "; ".join(notes))


# -- a line as another rendition wrote it -------------------------------------------------------------

_FINDING_AT = re.compile(r"^names: (?P<path>[^:]+\.py):(?P<line>\d+): (?P<what>.*)$")
_QUOTED = re.compile(r"'([A-Za-z_][A-Za-z0-9_.]*)'")
# How alike a sibling's line must be to stand in for the proposal's (difflib's ratio, 0..1).
SIBLING_LINE_RATIO = 0.6


def _added_lines(diff: str) -> dict[str, list[str]]:
    """Each file's added lines in a diff (its path on the new side), in order."""
    added: dict[str, list[str]] = {}
    for patched in unidiff.PatchSet(diff):
        added.setdefault(patched.path, []).extend(
            line.value.rstrip("\n") for hunk in patched for line in hunk if line.is_added)
    return added


def sibling_lines(repo: Path, tree: str, onto: str, findings: list[str], siblings: list[tuple[str, str]],
                  scratch: Path) -> Proposal:
    """The proposal ``tree`` with each line a names finding points at replaced by the line another
    rendition of the patch adds to that file in its place -- between the same two lines, else the
    most alike (``SIBLING_LINE_RATIO``) -- among those that use none of the missing names;
    ``siblings`` as (name, diff). "" as the tree where no finding has one."""
    wanted: dict[str, dict[int, set[str]]] = {}
    for finding in findings:
        found = _FINDING_AT.match(finding)
        if found:
            missing = set(_QUOTED.findall(found.group("what")))
            wanted.setdefault(found.group("path"), {}).setdefault(int(found.group("line")), set()).update(missing)
    offered = [(name, _added_lines(diff)) for name, diff in siblings]
    env = _index_env(scratch, "siblings")
    run_git(["read-tree", tree], repo, env=env)
    notes = []
    for path, at in sorted(wanted.items()):
        proposed = file_at(repo, tree, path)
        if proposed is None:
            continue
        lines = proposed.decode(errors="replace").splitlines(keepends=True)
        changed = False
        for number, missing in sorted(at.items()):
            if not 0 < number <= len(lines):
                continue
            old = lines[number - 1]
            body = old.strip()
            around = (lines[number - 2].strip() if number > 1 else None, lines[number].strip() if number < len(lines) else None)
            best = None
            for name, added in offered:
                theirs = added.get(path, [])
                for at_line, line in enumerate(theirs):
                    if line.strip() == body or any(re.search(rf"\b{re.escape(m)}\b", line) for m in missing):
                        continue
                    # Alike by the line itself, or standing between the same two lines.
                    beside = (at_line > 0 and theirs[at_line - 1].strip() == around[0],
                              at_line + 1 < len(theirs) and theirs[at_line + 1].strip() == around[1])
                    ratio = difflib.SequenceMatcher(a=body, b=line.strip(), autojunk=False).ratio()
                    if all(beside) or ratio >= SIBLING_LINE_RATIO:
                        score = (sum(beside), ratio)
                        if best is None or score > best[0]:
                            best = (score, line, name)
            if best is None:
                continue
            indent = old[: len(old) - len(old.lstrip())]
            lines[number - 1] = indent + best[1].strip() + ("\n" if old.endswith("\n") else "")
            notes.append(f"{path}:{number}: {body!r} -> {best[1].strip()!r} (as {best[2]} writes it)")
            changed = True
        if changed:
            stage_file(repo, env, path, "".join(lines).encode(), tree)
    if not notes:
        return Proposal(detail="no other rendition writes those lines without the missing names")
    replaced = git_out(["write-tree"], repo, env=env)
    return Proposal(replaced, _changed(repo, onto, replaced), "lines as another rendition writes them: " + "; ".join(notes))
