"""The judge of a port: stricter than the patch's witness.

A candidate port (a tree made by a merge tool on the new release) is accepted only when all three
parts agree:

1. ``names``: no name its added or changed Python lines use is missing from the release -- an
   undefined name (pyflakes, on the whole file, counting only what the pristine file did not
   already have), an imported name or module the release does not define, a ``ServerArgs`` field
   it does not have (``server_args.x``, ``get_server_args().x``, ``self.x`` in ``ServerArgs``), or a
   namespaced setting (``get_exec().comm.x``) no field declares with that ``NS(...)``. Static, on
   the release's own code (``ast`` and pyflakes), so it needs nothing installed;
2. ``witness``: the patch's witness says bug on the pristine release and clean on the port, and
   the patch's regression tests in sglang's layout pass on the port (``upstream-test``; the
   caller runs them: the one part cached per tree);
3. ``imports``: every module the port touches imports in the pin's CPU Python on the emulated
   MI355X box (the witnesses' ``import_smoke`` probe).

Each part answers with findings; an empty list is a pass. ``unavailable`` (no CPU Python here) is a
finding too: a port the judge could not fully see is never accepted.
"""

from __future__ import annotations

import ast
import collections
from dataclasses import dataclass, field

from pyflakes import api as pyflakes_api
from pyflakes import messages as pyflakes_messages
from pyflakes import reporter as pyflakes_reporter

# pyflakes findings that mean "this name is not there"; unused imports and the like are style.
_MISSING = (pyflakes_messages.UndefinedName, pyflakes_messages.UndefinedExport, pyflakes_messages.UndefinedLocal,
            pyflakes_messages.ImportStarUsage)
SERVER_ARGS = "python/sglang/srt/server_args.py"


@dataclass
class Verdict:
    """What the judge said about one candidate: per part, its findings (empty = passed)."""

    names: list[str] = field(default_factory=list)
    witness: list[str] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)  # the parts that ran

    @property
    def accepted(self) -> bool:
        return set(self.checked) >= {"names", "witness", "imports"} and not (self.names or self.witness or self.imports)

    def findings(self) -> list[str]:
        return [f"names: {f}" for f in self.names] + [f"witness: {f}" for f in self.witness] + [f"imports: {f}" for f in self.imports]

    def summary(self) -> str:
        if self.accepted:
            return "accepted (names, witness, imports)"
        parts = []
        for part in ("names", "witness", "imports"):
            found = getattr(self, part)
            if part not in self.checked:
                parts.append(f"{part} not checked")
            elif found:
                parts.append(f"{part}: {found[0]}" + (f" (+{len(found) - 1} more)" if len(found) > 1 else ""))
        return "refused: " + "; ".join(parts)


# -- names -----------------------------------------------------------------------------------------


class _Collect(pyflakes_reporter.Reporter):
    def __init__(self):
        self.found: list = []
        self.broken: list[str] = []

    def flake(self, message):
        self.found.append(message)

    def syntaxError(self, filename, msg, lineno, offset, text):  # noqa: N802 - pyflakes' interface
        self.broken.append(f"{filename}:{lineno}: syntax error: {msg}")

    def unexpectedError(self, filename, msg):  # noqa: N802
        self.broken.append(f"{filename}: {msg}")


def _flakes(path: str, text: str) -> tuple[list, list[str]]:
    collect = _Collect()
    pyflakes_api.check(text, path, collect)
    return [m for m in collect.found if isinstance(m, _MISSING)], collect.broken


def _message_key(message) -> str:
    return message.message % message.message_args


def changed_lines(old: str, new: str) -> set[int]:
    """The line numbers of ``new`` that are added or changed against ``old``."""
    import difflib

    lines = set()
    matcher = difflib.SequenceMatcher(a=old.splitlines(), b=new.splitlines(), autojunk=False)
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            lines.update(range(j1 + 1, j2 + 1))
    return lines


class Release:
    """The release's own code, read from its tree as ``read(path) -> text | None`` (a git tree or a
    folder): which modules exist, what they define, ``ServerArgs``'s fields and namespaces."""

    def __init__(self, read, exists):
        self._read = read
        self._exists = exists
        self._defs: dict[str, set[str] | None] = {}
        self._server_args = None

    def module_path(self, module: str) -> str | None:
        base = "python/" + module.replace(".", "/")
        for path in (base + ".py", base + "/__init__.py"):
            if self._exists(path):
                return path
        return None

    def defines(self, module: str) -> set[str] | None:
        """Top-level names of ``module`` (None when it is not in the release or does not parse)."""
        if module not in self._defs:
            path = self.module_path(module)
            text = self._read(path) if path else None
            try:
                self._defs[module] = _top_level_names(ast.parse(text)) if text is not None else None
            except SyntaxError:
                self._defs[module] = None
        return self._defs[module]

    def server_args(self) -> tuple[set[str], dict[str, set[str]]] | None:
        """(every attribute ``ServerArgs`` has, {namespace: field names}) or None without the class."""
        if self._server_args is None:
            text = self._read(SERVER_ARGS)
            self._server_args = _server_args_fields(text) if text else ()
        return self._server_args or None


def _top_level_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            names |= _top_level_names(ast.Module(body=[*node.body, *getattr(node, "orelse", []),
                                                        *[h for handler in getattr(node, "handlers", []) for h in handler.body],
                                                        *getattr(node, "finalbody", [])], type_ignores=[]))
        else:
            for target in ast.walk(node) if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) else []:
                if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store):
                    names.add(target.id)
    return names


def _ns_of(annotation) -> str | None:
    for node in ast.walk(annotation):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "NS" and node.args:
            value = node.args[0]
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                return value.value
    return None


def _server_args_fields(text: str):
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return ()
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"), None)
    if cls is None or cls.bases:
        return ()  # fields from elsewhere: not checked rather than wrongly refused
    names: set[str] = set()
    namespaces: dict[str, set[str]] = collections.defaultdict(set)
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
            ns = _ns_of(node.annotation)
            if ns:
                namespaces[ns].add(node.target.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and getattr(node.value, "id", None) == "self":
            names.add(node.attr)
    return names, dict(namespaces)


def _in_server_args_class(tree: ast.Module) -> set[int]:
    lines = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def _chain(node) -> tuple[str, list[str]] | None:
    """``get_exec().comm.x`` -> ("get_exec", ["comm", "x"]); ``server_args.x`` -> ("server_args", ["x"])."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    attrs.reverse()
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
        return node.func.id + "()", attrs
    if isinstance(node, ast.Name):
        return node.id, attrs
    return None


def names_findings(path: str, old: str | None, new: str, release: Release) -> list[str]:
    """What ``new`` (the ported text of ``path``) uses on its added or changed lines that the release
    does not define. ``old``: the file on the pristine release (None for a new file)."""
    findings: list[str] = []
    if old is not None:
        try:
            ast.parse(old)
        except SyntaxError:
            return []  # the release's own file is no Python we can read: nothing to compare against
    try:
        tree = ast.parse(new)
    except SyntaxError as exc:
        return [f"{path}:{exc.lineno}: does not parse: {exc.msg}"]
    touched = changed_lines(old or "", new)
    new_flakes, broken = _flakes(path, new)
    findings += broken
    old_keys = collections.Counter(_message_key(m) for m in _flakes(path, old)[0]) if old else collections.Counter()
    for message in new_flakes:
        key = _message_key(message)
        if old_keys[key] > 0:
            old_keys[key] -= 1
            continue
        findings.append(f"{path}:{message.lineno}: {key}")
    fields = release.server_args()
    in_class = _in_server_args_class(tree) if path == SERVER_ARGS else set()
    seen_nodes = set()
    for node in ast.walk(tree):
        line = getattr(node, "lineno", None)
        if line not in touched:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("sglang"):
            defined = release.defines(node.module)
            if defined is None:
                findings.append(f"{path}:{line}: imports {node.module}, which the release does not have")
                continue
            if "*" in defined or "__getattr__" in defined:
                continue  # names made at import time (a star import, a module __getattr__): not static
            for alias in node.names:
                sub = release.module_path(f"{node.module}.{alias.name}")
                if alias.name != "*" and alias.name not in defined and sub is None:
                    findings.append(f"{path}:{line}: {node.module} defines no {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sglang") and release.module_path(alias.name) is None:
                    findings.append(f"{path}:{line}: imports {alias.name}, which the release does not have")
        elif isinstance(node, ast.Attribute) and fields and id(node) not in seen_nodes:
            found = _chain(node)
            if not found:
                continue
            for inner in ast.walk(node):
                seen_nodes.add(id(inner))
            root, attrs = found
            names, namespaces = fields
            if root in ("get_server_args()", "server_args") or (root == "self" and line in in_class):
                if attrs and attrs[0] not in names:
                    findings.append(f"{path}:{line}: ServerArgs has no field {attrs[0]!r} (read as {root}.{attrs[0]})")
            elif root.startswith("get_") and root.endswith("()"):
                space = root[4:-2]
                if not any(ns == space or ns.startswith(space + ".") for ns in namespaces):
                    continue  # not a namespace of this release's settings: its own object
                for cut in range(len(attrs), 0, -1):
                    ns = ".".join([space, *attrs[: cut - 1]])
                    if attrs[cut - 1] in namespaces.get(ns, ()):
                        break
                else:
                    prefix = ".".join([space, *attrs])
                    if not any(ns == prefix or ns.startswith(prefix + ".") for ns in namespaces):
                        findings.append(f"{path}:{line}: no setting {'.'.join(attrs)} under NS({space!r}...) (read as {root}.{'.'.join(attrs)})")
    return findings
