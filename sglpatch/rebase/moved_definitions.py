"""The last merge tool of the cascade: hunks whose Python function or class the release moved to
another file, re-targeted to where the release now defines it.

For each hunk of a rendition that does not apply on the release (its file is gone, or its context
is not there), the innermost ``def`` or ``class`` around the lines it changes is found with the
stdlib ``ast`` in the tree the rendition was made for (``base``): its qualified name
(``ServerArgs._handle_gpu_defaults``), its line span and its parameters. The release's Python files
that mention the name are parsed the same way; exactly one definition of that qualified name, of
the same kind and with the same parameter names, in a file other than the hunk's own, is where the
hunk goes: its file name is rewritten and its line numbers shifted by as much as the definition
moved. The re-targeted hunks (with the hunks that apply where they are) are then applied with
``git apply`` and, where their context changed too, ``wiggle --merge``. Like every tool it only
proposes: the judge decides.
"""

from __future__ import annotations

import ast
import tempfile
from dataclasses import dataclass
from pathlib import Path

import unidiff

from sglpatch.apply.index_apply import check_exact
from sglpatch.plumbing.gitcmd import git_out, run_git
from sglpatch.plumbing.processes import declared_env, run_tool
from sglpatch.rebase.merge_tools import WIGGLE_TIMEOUT_S, Proposal, file_at, stage_file

STEP = "moved-definitions"


@dataclass(frozen=True)
class Definition:
    """A ``def`` or ``class`` of a module, by qualified name."""

    qualname: str
    kind: str  # "def" (async ones too) or "class"
    start: int  # its first line, decorators included (1-based)
    end: int
    params: tuple[str, ...]  # a function's parameter names in order; () for a class

    def signature(self) -> str:
        return f"{self.kind} {self.qualname}({', '.join(self.params)})" if self.kind == "def" else f"class {self.qualname}"


def definitions(source: str) -> list[Definition]:
    """Every def and class of ``source``, nested ones under their qualified names; [] when it is no
    Python ``ast`` can parse."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[Definition] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualname = f"{prefix}{child.name}"
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                if isinstance(child, ast.ClassDef):
                    found.append(Definition(qualname, "class", start, child.end_lineno or child.lineno, ()))
                else:
                    arguments = child.args
                    names = [a.arg for a in arguments.posonlyargs + arguments.args]
                    names += ["*" + arguments.vararg.arg] if arguments.vararg else (["*"] if arguments.kwonlyargs else [])
                    names += [a.arg for a in arguments.kwonlyargs]
                    names += ["**" + arguments.kwarg.arg] if arguments.kwarg else []
                    found.append(Definition(qualname, "def", start, child.end_lineno or child.lineno, tuple(names)))
                # As Python's __qualname__ says it: a method "C.m", a function's inner one "f.<locals>.g".
                visit(child, qualname + ("." if isinstance(child, ast.ClassDef) else ".<locals>."))
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def changed_lines(hunk: unidiff.Hunk) -> set[int]:
    """The lines of the old file a hunk changes: each removed line, and for each insertion the old
    lines on either side of it (an insertion belongs to what surrounds it)."""
    lines: set[int] = set()
    last = None
    inserting = False
    for line in hunk:
        if line.is_added:
            if not inserting and last is not None:
                lines.add(last)
            inserting = True
            continue
        if line.source_line_no is None:
            continue  # "\ No newline at end of file"
        if line.is_removed:
            lines.add(line.source_line_no)
        if inserting:
            lines.add(line.source_line_no)
            inserting = False
        last = line.source_line_no
    return lines


def enclosing(found: list[Definition], lines: set[int]) -> Definition | None:
    """The innermost definition whose span holds every one of ``lines`` (None: module level)."""
    around = [d for d in found if lines and all(d.start <= n <= d.end for n in lines)]
    return min(around, key=lambda d: d.end - d.start, default=None)


def _text(repo: Path, commit: str, path: str) -> str:
    """The file's text in ``commit`` ("" where it has none), bytes git cannot decode kept as they are."""
    return (file_at(repo, commit, path) or b"").decode(errors="surrogateescape")


def find_in_release(repo: Path, onto: str, wanted: Definition, top: str) -> tuple[str, Definition | None, str]:
    """(path, definition, "") of the one definition in the release's ``top/**.py`` with the qualified
    name, kind and parameters of ``wanted``; else ("", None, why not)."""
    name = wanted.qualname.rsplit(".", 1)[-1]
    grep = run_git(["grep", "-l", "-w", "-F", "-e", name, onto, "--", f"{top}/*.py" if top else "*.py"], repo, check=False)
    same_name, same_signature = [], []
    for line in grep.stdout.decode(errors="replace").splitlines():
        path = line.split(":", 1)[1]
        for found in definitions(_text(repo, onto, path)):
            if found.qualname == wanted.qualname and found.kind == wanted.kind:
                same_name.append((path, found))
                if found.params == wanted.params:
                    same_signature.append((path, found))
    if len(same_signature) == 1:
        return same_signature[0][0], same_signature[0][1], ""
    if len(same_signature) > 1:
        return "", None, f"{wanted.qualname} is defined in {len(same_signature)} places: " + ", ".join(p for p, _ in same_signature)
    if same_name:
        path, found = same_name[0]
        return "", None, f"{wanted.qualname} is in {path}, but its signature changed: {wanted.signature()} -> {found.signature()}"
    return "", None, f"no {wanted.kind} {wanted.qualname} in the release's {top or 'tree'}"


@dataclass
class _Placed:
    """One hunk at the file and old line where it goes on the release."""

    path: str
    source_start: int
    hunk: unidiff.Hunk
    note: str = ""

    def text(self, target_start: int) -> str:
        head = f"@@ -{self.source_start},{self.hunk.source_length} +{target_start},{self.hunk.target_length} @@"
        if self.hunk.section_header:
            head += " " + self.hunk.section_header
        return head + "\n" + "".join(str(line) for line in self.hunk)


def _single(path: str, hunk: unidiff.Hunk) -> str:
    return f"--- a/{path}\n+++ b/{path}\n{_Placed(path, hunk.source_start, hunk).text(hunk.target_start)}"


def retarget(repo: Path, base: str, diff: str, onto: str, scratch: Path, *, use_wiggle: bool = True) -> Proposal:
    """The rendition ``diff`` (made on ``base``) with every hunk that does not apply on ``onto``
    moved to where ``onto`` defines the function or class it changes, applied there; or no tree and
    why. A hunk that applies where it is stays."""
    env = {"GIT_INDEX_FILE": str(scratch / "index-moved")}
    run_git(["read-tree", onto], repo, env=env)
    placed: list[_Placed] = []
    added: dict[str, str] = {}
    base_definitions: dict[str, list[Definition]] = {}
    for patched in unidiff.PatchSet(diff):
        path = patched.path
        if patched.is_added_file:
            added[path] = "".join(line.value for hunk in patched for line in hunk if not line.is_removed)
            continue
        if patched.is_removed_file:
            return Proposal(detail=f"{path}: the patch deletes the file; a deletion is not followed")
        exists = run_git(["cat-file", "-e", f"{onto}:{path}"], repo, check=False).returncode == 0
        for number, hunk in enumerate(patched, 1):
            where = f"hunk {number} of {path}"
            if exists and _applies(repo, env, _single(path, hunk)):
                placed.append(_Placed(path, hunk.source_start, hunk))
                continue
            if not path.endswith(".py"):
                return Proposal(detail=f"{where}: does not apply, and the file is no Python module")
            if path not in base_definitions:
                base_definitions[path] = definitions(_text(repo, base, path))
            around = enclosing(base_definitions[path], changed_lines(hunk))
            if around is None:
                return Proposal(detail=f"{where}: does not apply and changes module-level lines, in no def or class to follow")
            target, found, why = find_in_release(repo, onto, around, path.split("/", 1)[0] if "/" in path else "")
            if found is None:
                return Proposal(detail=f"{where} (in {around.signature()}): {why}")
            if target == path:
                return Proposal(detail=f"{where}: {around.qualname} is still in {path}; the hunk fails there for another reason")
            start = hunk.source_start + found.start - around.start
            placed.append(_Placed(target, start, hunk, f"{where} ({around.qualname}) -> {target} line {start}"))
    moved = [p.note for p in placed if p.note]
    if not moved:
        return Proposal(detail="every hunk applies where it is: no definition to follow")
    by_file: dict[str, list[_Placed]] = {}
    for hunk in placed:
        by_file.setdefault(hunk.path, []).append(hunk)
    notes = list(moved)
    work = Path(tempfile.mkdtemp(dir=scratch, prefix="moved-"))
    for number, (path, hunks) in enumerate(sorted(by_file.items())):
        hunks.sort(key=lambda h: h.source_start)
        for earlier, later in zip(hunks, hunks[1:]):
            if later.source_start < earlier.source_start + earlier.hunk.source_length:
                return Proposal(detail=f"{path}: two hunks land on the same lines ({earlier.note or 'in place'}; {later.note})")
        parts, shift = [], 0
        for hunk in hunks:
            parts.append(hunk.text(hunk.source_start + shift))
            shift += hunk.hunk.target_length - hunk.hunk.source_length
        text = f"--- a/{path}\n+++ b/{path}\n" + "".join(parts)
        if _applies(repo, env, text):
            run_git(["apply", "--cached", "--whitespace=nowarn", "-"], repo, env=env, input=text.encode())
            continue
        merged, why = _wiggle_file(work, number, _text(repo, onto, path), text) if use_wiggle else (None, "wiggle is not installed")
        if merged is None:
            return Proposal(detail="; ".join(notes) + f"; {path}: the re-targeted hunks do not apply ({why})")
        stage_file(repo, env, path, merged, onto)
        notes.append(f"{path}: merged by wiggle")
    for path, text in added.items():
        if run_git(["cat-file", "-e", f"{onto}:{path}"], repo, check=False).returncode == 0:
            return Proposal(detail=f"{path}: the patch creates it, and the release has one")
        stage_file(repo, env, path, text.encode(errors="surrogateescape"), None)
    tree = git_out(["write-tree"], repo, env=env)
    changed = [p for p in git_out(["diff", "--name-only", "--no-renames", onto, tree], repo).splitlines() if p]
    return Proposal(tree, changed, "; ".join(notes))


def _applies(repo: Path, env: dict[str, str], diff: str) -> bool:
    return check_exact(repo, env, diff).applies


def _wiggle_file(work: Path, number: int, release_text: str, diff: str) -> tuple[bytes | None, str]:
    (work / f"{number}.release").write_text(release_text, errors="surrogateescape")
    (work / f"{number}.patch").write_text(diff, errors="surrogateescape")
    done = run_tool(["wiggle", "--merge", str(work / f"{number}.release"), str(work / f"{number}.patch")], "wiggle",
                    WIGGLE_TIMEOUT_S, unavailable=True, env=declared_env(), input=b"")
    if done.returncode != 0:
        return None, (done.stderr.decode(errors="replace") or "").strip() or f"wiggle: exit status {done.returncode}"
    return done.stdout, ""
