"""Regression tests that read sglang's source text instead of running it: refused, as sglang's
reviewers would (a test judges the code's behaviour, not its wording).

Read with ``ast``, never run: a call that opens or reads a file (``open``, ``io.open``,
``codecs.open``, ``tokenize.open``, ``Path.read_text`` / ``read_bytes`` / ``open``,
``importlib.resources`` / ``pkgutil`` on an ``sglang`` package) whose file comes from sglang's
code (a module's ``__file__`` or ``__path__``, a spec's ``origin``, ``inspect.getfile``, a path
naming ``sglang/``, or a name assigned from one of these), and every call of
``inspect.getsource`` and its kin or of ``linecache``, which read nothing but source text.
"""

from __future__ import annotations

import ast
from pathlib import Path

from sglpatch.series.patches import Problem

# Calls that read source text whatever they are given.
ALWAYS = {("inspect", name) for name in ("getsource", "getsourcelines", "findsource", "getcomments")} | {
    ("linecache", name) for name in ("getline", "getlines", "updatecache", "lazycache", "checkcache")}
# Calls whose first argument (or ``file=``) is the file opened.
OPENERS = {("", "open"), ("io", "open"), ("codecs", "open"), ("tokenize", "open"), ("builtins", "open")}
# Methods of a path that read or open the file they are called on.
PATH_READERS = {"read_text", "read_bytes", "open"}
# Calls that read a package's data by its name (``importlib.resources.read_text("sglang.srt", ...)``).
PACKAGE_READERS = {"read_text", "read_binary", "open_text", "open_binary", "get_data", "files"}
# What names a file of sglang's code.
SOURCE_ATTRIBUTES = {"__file__", "__path__", "origin", "__spec__"}
SOURCE_CALLS = {"getfile", "getsourcefile", "getabsfile", "find_spec"}

WHY = "a test judges the code's behaviour, not its wording; sglang's reviewers would refuse it"


def source_reading_problems(path: Path) -> list[Problem]:
    """Each place the test file reads source text, with its line; none for a file that does not
    parse (``check`` says that on its own)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    tainted = _names_of_source_files(tree)
    problems = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        what = _reads_source(node, tainted)
        if what:
            shown = ast.unparse(node)
            shown = shown if len(shown) <= 90 else shown[:87] + "..."
            problems.append(Problem(path, node.lineno, f"reads source text ({what}: {shown}): {WHY}"))
    return sorted(problems, key=lambda problem: problem.line)


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for a chain of names and attributes; "" for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _callee(node: ast.Call) -> tuple[str, str]:
    """(module or receiver, name) of a call: ``inspect.getsource`` -> ("inspect", "getsource")."""
    if isinstance(node.func, ast.Name):
        return "", node.func.id
    if isinstance(node.func, ast.Attribute):
        return _dotted(node.func.value).rsplit(".", 1)[-1], node.func.attr
    return "", ""


def _names_source(node: ast.AST, tainted: set[str]) -> bool:
    """Whether the expression names a file of sglang's code."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Attribute) and inner.attr in SOURCE_ATTRIBUTES:
            return True
        if isinstance(inner, ast.Call) and _callee(inner)[1] in SOURCE_CALLS:
            return True
        if isinstance(inner, ast.Constant) and isinstance(inner.value, str) and "sglang/" in inner.value.replace("\\", "/"):
            return True
        if isinstance(inner, (ast.Name, ast.Attribute)) and _dotted(inner) in tainted:
            return True
    return False


def _names_of_source_files(tree: ast.AST) -> set[str]:
    """Names (and ``self.x``-style attributes) assigned, looped over or bound by ``with`` from an
    expression that names sglang's source: as far as one file can tell, where its paths flow."""
    tainted: set[str] = set()
    bindings = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            bindings += [(target, node.value) for target in node.targets]
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
            bindings.append((node.target, node.value))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            bindings.append((node.target, node.iter))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            bindings.append((node.optional_vars, node.context_expr))
    changed = True
    while changed:
        changed = False
        for target, value in bindings:
            if not _names_source(value, tainted):
                continue
            for name in _bound(target):
                if name not in tainted:
                    tainted.add(name)
                    changed = True
    return tainted


def _bound(target: ast.AST) -> list[str]:
    """The names a binding target binds: ``x``, ``self.x``, each of ``a, (b, *c)``."""
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for item in target.elts for name in _bound(item)]
    if isinstance(target, ast.Starred):
        return _bound(target.value)
    name = _dotted(target)
    return [name] if name else []


def _reads_source(node: ast.Call, tainted: set[str]) -> str:
    """What reading of source text the call is, or ""."""
    owner, name = _callee(node)
    if (owner, name) in ALWAYS:
        return f"{owner}.{name}"
    if (owner, name) in OPENERS or (owner == "" and name == "open"):
        opened = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "file"), None)
        if opened is not None and _names_source(opened, tainted):
            return f"{owner + '.' if owner else ''}{name} on sglang's file"
        return ""
    if name in PATH_READERS and isinstance(node.func, ast.Attribute) and _names_source(node.func.value, tainted):
        return f".{name}() on sglang's file"
    if name in PACKAGE_READERS and node.args:
        package = node.args[0]
        if isinstance(package, ast.Constant) and isinstance(package.value, str) and package.value.split(".")[0] == "sglang":
            return f"{owner + '.' if owner else ''}{name} of sglang's package data"
    return ""
