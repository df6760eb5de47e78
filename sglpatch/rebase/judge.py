"""The judge of a port: stricter than the patch's witness.

A candidate port (a tree made by a merge tool on the new release) is accepted only when all three
parts agree:

1. ``names``: no name its added or changed Python lines use is missing from the release -- an
   undefined name (pyflakes, on the whole file, counting only what the pristine file did not
   already have), an imported name or module the release does not define, a ``ServerArgs`` field
   it does not have (``server_args.x``, ``get_server_args().x``, ``self.x`` in ``ServerArgs``), or a
   namespaced setting (``get_exec().comm.x``) no field declares with that ``NS(...)``. Static, on
   the release's own code (``ast`` and pyflakes), so it needs nothing installed. What a name is
   checked against is the release's tree (with the patches accepted before this one) plus exactly
   what the port itself adds, and a name only the port defines is reported as such (``Verdict.
   added``). A star import of another sglang module is followed; where the part cannot look -- the
   release's own file does not parse here, a module takes names by a star import from outside the
   release or makes them at import time (a module ``__getattr__``), ``ServerArgs`` takes fields
   from a base class -- that is a finding ("could not check ..."), never a silent pass;
2. ``witness``: the patch's witness says bug on the pristine release and clean on the port, and
   the patch's regression tests in sglang's layout pass on the port (``upstream-test``; the
   caller runs them: the one part cached per tree);
3. ``imports``: every module the port touches imports in the pin's CPU Python on the emulated
   MI355X box (the witnesses' ``import_smoke`` probe). A port that touches a file no module of the
   release loads, or a Python file the release's own copy of which does not parse, has nothing to
   import: that is a finding too.

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
    # Names the port's lines use that only the port itself defines (checked against the port's own
    # text, not the release's): not a refusal, said beside the verdict.
    added: list[str] = field(default_factory=list)

    @property
    def accepted(self) -> bool:
        return set(self.checked) >= {"names", "witness", "imports"} and not (self.names or self.witness or self.imports)

    def findings(self) -> list[str]:
        return ([f"names: {f}" for f in self.names] + [f"witness: {f}" for f in self.witness]
                + [f"imports: {f}" for f in self.imports] + [f"the port adds: {f}" for f in self.added])

    def summary(self) -> str:
        if self.accepted:
            adds = f"; {len(self.added)} name(s) the port itself adds" if self.added else ""
            return f"accepted (names, witness, imports{adds})"
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
    folder): which modules exist, what they define, ``ServerArgs``'s fields and namespaces.
    ``port``: the candidate's tree, as another ``Release``: what the port itself adds, consulted
    only where the release lacks a name (``names_findings`` says so)."""

    def __init__(self, read, exists, port: "Release | None" = None):
        self._read = read
        self._exists = exists
        self.port = port
        self.added: list[str] = []  # what ``names_findings`` found only in ``port``
        self._defs: dict[str, tuple[set[str], list[str]] | None] = {}
        self._server_args = None

    def module_path(self, module: str) -> str | None:
        base = "python/" + module.replace(".", "/")
        for path in (base + ".py", base + "/__init__.py"):
            if self._exists(path):
                return path
        return None

    def defines(self, module: str) -> set[str] | None:
        """Top-level names of ``module`` (None when it is not in the release or does not parse)."""
        found = self.names_of(module)
        return None if found is None or found[0] is None else found[0]

    def names_of(self, module: str, _seen: frozenset = frozenset()) -> tuple[set[str] | None, list[str]] | None:
        """(the names ``module`` defines at its top level, star imports of other sglang modules
        followed; why that set may be short of what it makes at import time) -- the names None where
        the module does not parse -- or None where the release has no such module."""
        if module in self._defs:
            return self._defs[module]
        path = self.module_path(module)
        text = self._read(path) if path else None
        if text is None:
            self._defs[module] = None
            return None
        try:
            tree = ast.parse(text)
        except SyntaxError as exc:
            self._defs[module] = (None, [f"{path} does not parse here (line {exc.lineno}: {exc.msg})"])
            return self._defs[module]
        names = _top_level_names(tree) - {"*"}
        blind = []
        if "__getattr__" in names:
            blind.append(f"{module} makes names at import time (a module __getattr__)")
        package = module if path.endswith("/__init__.py") else module.rpartition(".")[0]
        for source in _star_sources(tree, package):
            if not source.startswith("sglang") or source in _seen:
                if source not in _seen:
                    blind.append(f"{module} takes names by a star import from {source}, outside the release")
                continue
            found = self.names_of(source, _seen | {module})
            if found is None or found[0] is None:
                blind.append(f"{module} takes names by a star import from {source}, which "
                             + ("the release does not have" if found is None else "does not parse here"))
                continue
            names |= {name for name in found[0] if not name.startswith("_")}
            blind += found[1]
        self._defs[module] = (names, blind)
        return self._defs[module]

    def server_args(self) -> tuple[set[str], dict[str, set[str]]] | str | None:
        """(every attribute ``ServerArgs`` has, {namespace: field names}); None without the class;
        why its fields cannot be read, where they cannot (its file does not parse, a base class)."""
        if self._server_args is None:
            text = self._read(SERVER_ARGS)
            self._server_args = _server_args_fields(text) if text else ()
        return self._server_args or None


def _star_sources(tree: ast.Module, package: str) -> list[str]:
    """The modules ``tree`` star-imports at its top level (relative ones made absolute)."""
    found = []
    for node in _top_level_statements(tree.body):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                found.append(".".join([*base, *([node.module] if node.module else [])]))
            else:
                found.append(node.module or "")
    return found


def _top_level_statements(body: list) -> list:
    out = []
    for node in body:
        out.append(node)
        if isinstance(node, (ast.If, ast.Try)):
            out += _top_level_statements([*node.body, *getattr(node, "orelse", []),
                                          *[h for handler in getattr(node, "handlers", []) for h in handler.body],
                                          *getattr(node, "finalbody", [])])
    return out


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
    except SyntaxError as exc:
        return f"{SERVER_ARGS} does not parse here (line {exc.lineno}: {exc.msg})"
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"), None)
    if cls is None:
        return ()
    if cls.bases:
        return "ServerArgs takes fields from a base class"
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
        except SyntaxError as exc:
            # Nothing to compare against: the part could not look, and says so.
            return [f"{path}: could not check the names its lines use: the release's own file does not parse here"
                    f" (line {exc.lineno}: {exc.msg})"]
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
    port = release.port
    fields = release.server_args()
    port_fields = port.server_args() if port is not None else None
    in_class = _in_server_args_class(tree) if path == SERVER_ARGS else set()
    seen_nodes = set()

    def port_adds(what: str) -> None:
        release.added.append(f"{path}:{line}: {what}")

    for node in ast.walk(tree):
        line = getattr(node, "lineno", None)
        if line not in touched:
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("sglang"):
            findings += _import_from_findings(path, line, node, release, port_adds)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sglang") and release.module_path(alias.name) is None:
                    if port is not None and port.module_path(alias.name) is not None:
                        port_adds(f"imports {alias.name}, a module the port itself adds")
                    else:
                        findings.append(f"{path}:{line}: imports {alias.name}, which the release does not have")
        elif isinstance(node, ast.Attribute) and fields and id(node) not in seen_nodes:
            found = _chain(node)
            if not found:
                continue
            for inner in ast.walk(node):
                seen_nodes.add(id(inner))
            root, attrs = found
            if isinstance(fields, str):
                if root in ("get_server_args()", "server_args") and attrs:
                    findings.append(f"{path}:{line}: could not check the ServerArgs field {attrs[0]!r}: {fields}")
                continue
            names, namespaces = fields
            if root in ("get_server_args()", "server_args") or (root == "self" and line in in_class):
                if attrs and attrs[0] not in names:
                    if isinstance(port_fields, tuple) and attrs[0] in port_fields[0]:
                        port_adds(f"reads ServerArgs field {attrs[0]!r}, which the port itself adds")
                        continue
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
                        if isinstance(port_fields, tuple) and _declares(port_fields[1], space, attrs):
                            port_adds(f"reads setting {'.'.join(attrs)} under NS({space!r}...), which the port itself adds")
                            continue
                        findings.append(f"{path}:{line}: no setting {'.'.join(attrs)} under NS({space!r}...) (read as {root}.{'.'.join(attrs)})")
    return findings


def _declares(namespaces: dict[str, set[str]], space: str, attrs: list[str]) -> bool:
    for cut in range(len(attrs), 0, -1):
        if attrs[cut - 1] in namespaces.get(".".join([space, *attrs[: cut - 1]]), ()):
            return True
    prefix = ".".join([space, *attrs])
    return any(ns == prefix or ns.startswith(prefix + ".") for ns in namespaces)


def _import_from_findings(path: str, line: int, node: ast.ImportFrom, release: Release, port_adds) -> list[str]:
    """What ``from <sglang module> import a, b`` on a touched line uses that the release lacks."""
    module, port = node.module, release.port
    known = release.names_of(module)
    if known is None:
        if port is not None and port.module_path(module) is not None:
            port_adds(f"imports {module}, a module the port itself adds")
            return []
        return [f"{path}:{line}: imports {module}, which the release does not have"]
    defined, blind = known
    if defined is None:
        return [f"{path}:{line}: could not check what it imports from {module}: {blind[0]}"]
    findings = []
    for alias in node.names:
        if alias.name == "*":
            findings.append(f"{path}:{line}: could not check the names a star import of {module} brings")
            continue
        if alias.name in defined or release.module_path(f"{module}.{alias.name}") is not None:
            continue
        ported = port.names_of(module) if port is not None else None
        if (ported is not None and ported[0] is not None and alias.name in ported[0]) or (
                port is not None and port.module_path(f"{module}.{alias.name}") is not None):
            port_adds(f"imports {alias.name} from {module}, which the port itself adds")
        elif blind:
            findings.append(f"{path}:{line}: could not check whether {module} defines {alias.name}: {blind[0]}")
        else:
            findings.append(f"{path}:{line}: {module} defines no {alias.name}")
    return findings
