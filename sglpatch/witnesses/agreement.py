"""A witness and a patch's tests never disagree silently, and a test must find the bug where its fix
was written.

A patch that keeps a witness of its own (``mtp-quark-exclude``, ``rocm-flags``) and has regression
tests is judged by both on every tree where both ran. The witness answers per case
(``WitnessResult.cases``: case -> bug, clean or unavailable); beside the tests,
``patches/tests/<stem>/cases.toml`` says which tests judge which case::

    [cases]
    exact = ["TestQuarkNextnExclude.test_exact_excludes_keep_the_shared_expert_bf16"]
    re-pattern = ["TestQuarkNextnExclude.test_re_excludes_keep_the_draft_unquantized"]
    control = []

A test is named ``Class.test_method``, as ``unittest`` names it without its module. On a tree
where both ran, a case the witness finds ``bug`` must be failed by each of its tests, and a case
it finds ``clean`` passed by each; a ``bug`` case with no test, a test listed under no case, a
listed test that does not exist and a case the witness does not check are refused
(``disagreements``; ``case_map_problems`` is what ``sglpatch check`` can tell without running
anything). A witness that answers no cases is held to the tests as a whole: where it finds the bug
some test must fail, where it finds none every test must pass.

Apart from any witness, a patch's tests must fail on the release the fix was written for
(``upstream_test.release_written_for``): a test that passes there proves nothing about the fix
(``not_found_where_written``).
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.series.patches import CASES_FILE, TESTS_DIR, Problem, RegressionTest
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE, WitnessResult
from sglpatch.witnesses.upstream_test import UpstreamTestWitness

_TEST_ID = re.compile(r"^[A-Za-z_]\w*\.test\w*$")


@dataclass(frozen=True)
class CaseMap:
    """``cases.toml`` read: each witness case and the test ids (``Class.test_method``) that judge it."""

    path: Path
    cases: dict[str, tuple[str, ...]]

    @property
    def shown(self) -> str:
        """The file as the project names it: ``patches/tests/<stem>/cases.toml``."""
        return "/".join(self.path.parts[-4:]) if len(self.path.parts) >= 4 else str(self.path)

    @property
    def listed(self) -> set[str]:
        return {test for tests in self.cases.values() for test in tests}


def case_map_path(patches_dir: Path, stem: str) -> Path:
    return patches_dir / TESTS_DIR / stem / CASES_FILE


def read_case_map(patches_dir: Path, stem: str) -> CaseMap | None:
    """The patch's ``cases.toml``; None where it has none; ``SglpatchError`` naming the file where
    it is not a ``[cases]`` table of lists of test ids."""
    path = case_map_path(patches_dir, stem)
    if not path.is_file():
        return None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SglpatchError(f"{path}: not TOML: {exc}") from None
    other = sorted(set(data) - {"cases"})
    if other:
        raise SglpatchError(f"{path}: unknown key(s) {', '.join(other)}: only a [cases] table belongs here")
    table = data.get("cases")
    if not isinstance(table, dict) or not table:
        raise SglpatchError(f'{path}: no [cases] table (each witness case = ["Class.test_method", ...])')
    cases = {}
    for case, tests in table.items():
        if not isinstance(tests, list) or not all(isinstance(t, str) and _TEST_ID.match(t) for t in tests):
            raise SglpatchError(f'{path}: cases.{case} must be a list of test ids like "Class.test_method", '
                                f"got {tests!r}")
        cases[case] = tuple(tests)
    return CaseMap(path, cases)


# -- what check can tell without running anything ------------------------------------------------


def defined_tests(tests: tuple[RegressionTest, ...]) -> dict[str, list[tuple[Path, int]]]:
    """Every test the files define, read with ``ast``: ``Class.test_method`` -> (file, line) of
    each definition. A test class is one whose bases (or an ancestor's in the same file) include a
    ``...TestCase``; its tests are its methods named ``test*`` and those it inherits from the file's
    own classes. A file that does not parse defines none (``check`` says so elsewhere)."""
    found: dict[str, list[tuple[Path, int]]] = {}
    for test in tests:
        try:
            tree = ast.parse(test.file.read_text(encoding="utf-8"), filename=str(test.file))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}

        def ancestry(node: ast.ClassDef, seen: frozenset = frozenset()) -> list[ast.ClassDef]:
            chain = [node]
            for base in node.bases:
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if name in classes and name not in seen:
                    chain += ancestry(classes[name], seen | {node.name})
            return chain

        def base_names(node: ast.ClassDef) -> list[str]:
            return [base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "") for base in node.bases]

        for node in classes.values():
            chain = ancestry(node)
            if not any(name.endswith("TestCase") for klass in chain for name in base_names(klass)):
                continue
            for klass in chain:
                for item in klass.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test"):
                        places = found.setdefault(f"{node.name}.{item.name}", [])
                        if (test.file, item.lineno) not in places and not any(p[0] == test.file for p in places):
                            places.append((test.file, item.lineno))
    return found


def case_map_problems(patches_dir: Path, stem: str, tests: tuple[RegressionTest, ...], own_witness: bool) -> list[Problem]:
    """What ``sglpatch check`` finds in a patch's ``cases.toml`` and tests without running them: a
    file that is no case map, a listed test no file defines, a test listed under no case, one
    test id defined by two files, a case map beside a patch whose only witness is its tests."""
    path = case_map_path(patches_dir, stem)
    try:
        case_map = read_case_map(patches_dir, stem)
    except SglpatchError as exc:
        return [Problem(path, 1, str(exc).removeprefix(f"{path}: "))]
    if case_map is None:
        return []
    if not own_witness:
        return [Problem(path, 1, "maps a witness's cases to tests, but the patch's witness is its tests "
                                 "(Witness: upstream-test): remove it")]
    text = path.read_text(encoding="utf-8")
    defined = defined_tests(tests)
    problems = []
    for test_id, places in sorted(defined.items()):
        if len(places) > 1:
            problems.append(Problem(places[1][0], places[1][1], f"{test_id} is defined in {len(places)} files of the "
                                                                 "patch's tests: a test id names one test"))
    for case, listed in case_map.cases.items():
        for test_id in listed:
            if test_id not in defined:
                problems.append(Problem(path, _line_of(text, test_id), f"cases.{case} lists {test_id}, which no test "
                                                                       f"file of {stem} defines"))
    for test_id in sorted(set(defined) - case_map.listed):
        where, line = defined[test_id][0]
        problems.append(Problem(where, line, f"{test_id} judges no case of the witness: list it in "
                                             f"{path.relative_to(patches_dir.parent)} under the case it judges"))
    return problems


def _line_of(text: str, needle: str) -> int:
    for number, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return number
    return 1


# -- on a tree where both ran ------------------------------------------------------------------


def disagreements(witness: WitnessResult, tests: WitnessResult, case_map: CaseMap | None, where: str) -> list[str]:
    """Where ``witness`` and the patch's ``tests`` disagree on one tree (``where``: "the pristine
    tree of 0.5.23"), one line each naming the case, the tests, the tree and both verdicts; none
    where either could not run (that answer is the outcome's own failure)."""
    if UNAVAILABLE in (witness.state, tests.state):
        return []
    name, ran = witness.witness, tests.cases
    if not witness.cases:
        if case_map is not None:
            return [f"{case_map.shown} maps cases of {name}, which gave no per-case verdicts on {where}"]
        if witness.state == BUG and tests.state != BUG:
            return [f"on {where} {name} finds the bug but every test passes ({tests.witness}: {tests.detail})"[:900]]
        if witness.state == CLEAN and tests.state == BUG:
            return [f"on {where} {name} finds no bug but a test fails ({tests.witness}: {tests.detail})"[:900]]
        return []
    if case_map is None:
        return [f"{name} judges {len(witness.cases)} cases ({', '.join(witness.cases)}) on {where} but no "
                f"{TESTS_DIR}/<patch>/{CASES_FILE} says which tests judge which (docs/writing-a-fix.md)"]
    found = []
    unknown = sorted(set(case_map.cases) - set(witness.cases))
    if unknown:
        found.append(f"{case_map.shown} names case(s) {', '.join(unknown)}, which {name} does not check on {where} "
                     f"(its cases: {', '.join(witness.cases)})")
    for case, state in witness.cases.items():
        listed = case_map.cases.get(case, ())
        absent = [test for test in listed if test not in ran]
        if absent:
            found.append(f"case {case!r}: {case_map.shown} lists {', '.join(absent)}, which is no test that ran on {where}")
        if state == BUG and not listed:
            found.append(f"case {case!r} on {where}: {name} says bug, and no test judges it ({case_map.shown} lists none)")
        if state in (BUG, CLEAN):
            wrong = [test for test in listed if test in ran and ran[test] != state]
            if wrong:
                said = ", ".join(f"{test} says {ran[test]}" for test in wrong)
                found.append(f"case {case!r} on {where}: {name} says {state}, but {said} ({case_map.shown})")
    unlisted = sorted(set(ran) - case_map.listed)
    if unlisted:
        found.append(f"{', '.join(unlisted)} judge(s) no case of {name}: list each in {case_map.shown} under the "
                     "case it judges")
    return found


def not_found_where_written(tests: WitnessResult, version: str) -> str | None:
    """The refusal of tests that pass on the pristine release the fix was written for; None where
    they find the bug there (or could not run: that is the outcome's own failure)."""
    if tests.state != CLEAN:
        return None
    return (f"its test does not find the bug on {version}, the release the fix was written for "
            f"({tests.witness} passes on the pristine tree: {tests.detail}); a test that passes on the released "
            "code proves nothing about the fix: make it fail there")[:1500]


def together(results: list[WitnessResult]) -> WitnessResult:
    """One patch's witnesses on one tree as one answer: unavailable when any could not run, the
    bug when any finds it, clean when all pass."""
    if len(results) == 1:
        return results[0]
    for state in (UNAVAILABLE, BUG):
        some = [r for r in results if r.state == state]
        if some:
            return WitnessResult(", ".join(r.witness for r in some), state, some[0].level,
                                 "; ".join(f"{r.witness}: {r.detail}" for r in some))
    return WitnessResult(", ".join(r.witness for r in results), CLEAN, results[0].level,
                         "; ".join(f"{r.witness}: {r.detail}" for r in results))


def refusals(witnesses: list, answers: dict[str, WitnessResult], tree: str, version: str,
             written_for: str | None, case_map: CaseMap | None) -> list[str]:
    """Why one patch's answers on one of a pin's trees (``tree``: "pristine" or "patched") cannot
    stand: its tests pass on the pristine release the fix was written for, or they and the patch's
    own witness disagree (``disagreements``). ``witnesses``: the patch's, as
    ``registry.witnesses_for`` gives them (its own first, its tests as ``upstream-test``)."""
    tests = [w for w in witnesses if isinstance(w, UpstreamTestWitness)]
    own = [w for w in witnesses if not isinstance(w, UpstreamTestWitness)]
    found = []
    if tests and tree == "pristine" and version == written_for:
        found += [reason for reason in [not_found_where_written(answers[tests[0].name], version)] if reason]
    if tests and own:
        found += disagreements(answers[own[0].name], answers[tests[0].name], case_map, f"the {tree} tree of {version}")
    return found
