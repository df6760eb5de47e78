"""The house's joints: sglpatch's own import graph, counted from the source with ``ast`` (every
import, those inside functions too, and the package ``__init__`` each import runs), has no cycle;
a package's ``__init__`` holds no logic and imports nothing; the top level holds only packages and
the CLI's entry points; imports inside functions are kept for the CLI's lazy verbs; no module
grows past what a reader takes in at once."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "sglpatch"
MAX_LINES = 500
MAX_IMPORTS_INSIDE_FUNCTIONS = 5
CLI = ("sglpatch.cli", "sglpatch.cli_options", "sglpatch.__main__", "sglpatch.commands")
# The CLI's entry points and what ``sglpatch --help`` needs without importing ``commands/``.
ENTRY_POINTS = {"__init__.py", "__main__.py", "cli.py", "cli_options.py", "exitcodes.py"}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _targets(module: str, node: ast.Import | ast.ImportFrom, is_package: bool, modules) -> set[str]:
    """The sglpatch modules an import statement names: ``from a import b`` names ``a.b`` where
    that is a module, else ``a``."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = module.split(".") if is_package else module.split(".")[:-1]
        if node.level:
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source for alias in node.names]
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        # Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first: each is a module too.
        while name:
            if name != module:
                found.add(name)
            name = name.rpartition(".")[0]
    return found


def import_graph() -> tuple[dict[str, set[str]], list[tuple[str, int, str]]]:
    """Every module's sglpatch imports, and the imports made inside a function (module, line, target)."""
    modules = _modules()
    edges: dict[str, set[str]] = {name: set() for name in modules}
    inside: list[tuple[str, int, str]] = []
    for module, path in modules.items():
        is_package = path.name == "__init__.py"

        def walk(node, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _targets(module, child, is_package, modules):
                        edges[module].add(target)
                        if in_function:
                            inside.append((module, child.lineno, target))
                walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        walk(ast.parse(path.read_text(), str(path)), False)
    return edges, inside


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and self-loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_counting_sees_an_import_inside_a_function_and_a_cycle_through_it():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    graph, inside = import_graph()
    assert "sglpatch.plumbing.errors" in graph["sglpatch.cli"]
    assert all(isinstance(line, int) for _, line, _ in inside)


def test_the_counting_sees_the_package_init_an_import_of_a_submodule_runs():
    graph, _ = import_graph()
    assert {"sglpatch.rebase", "sglpatch.rebase.onto"} <= graph["sglpatch.commands.rebase"]
    assert "sglpatch.rebase" in graph["sglpatch.rebase.trial"]  # from sglpatch.rebase import merge_tools
    assert cycles({"pkg": {"pkg.impl"}, "pkg.impl": {"pkg"}}) == [["pkg", "pkg.impl"]]


def test_sglpatchs_import_graph_has_no_cycle():
    edges, _ = import_graph()
    assert cycles(edges) == []


def test_at_most_five_sglpatch_imports_inside_functions_outside_the_cli():
    _, inside = import_graph()
    outside_cli = sorted(
        f"{module}:{line} -> {target}" for module, line, target in inside
        if not any(module == cli or module.startswith(cli + ".") for cli in CLI)
    )
    assert len(outside_cli) <= MAX_IMPORTS_INSIDE_FUNCTIONS, "\n".join(outside_cli)


def test_no_module_is_over_500_lines():
    long = {str(path.relative_to(PACKAGE.parent)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_no_package_init_imports_or_defines_anything():
    """An ``__init__`` is its package's docstring (the root's also ``__version__``): nothing its
    modules would import from it, nothing that runs whenever one of them is imported."""
    holding = {}
    for path in PACKAGE.rglob("__init__.py"):
        body = ast.parse(path.read_text()).body
        logic = [type(node).__name__ for node in body
                 if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
                 and not (path.parent == PACKAGE and isinstance(node, ast.Assign)
                          and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__version__"])]
        if logic:
            holding[str(path.relative_to(PACKAGE.parent))] = logic
    assert holding == {}


def test_the_top_level_holds_only_packages_and_the_clis_entry_points():
    loose = sorted(path.name for path in PACKAGE.iterdir()
                   if path.name != "__pycache__" and not (path.is_dir() and (path / "__init__.py").is_file())
                   and path.name not in ENTRY_POINTS)
    assert loose == []
    assert all(any(path.rglob("*.py")) for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__")
