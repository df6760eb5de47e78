"""A patch's own witness and its regression tests never disagree silently (issue 34 item 3): each
witness case is matched to the tests that judge it by ``patches/tests/<stem>/cases.toml``, and on
every tree where both ran a ``bug`` case must be failed by each of its tests, a ``clean`` one passed.

Fast tests: the comparison itself on answers, and what ``sglpatch check`` finds in a case map
without running anything. Network tests: a real test of a real bug on the real 0.5.23 tree, beside
a test double of a witness (``CiExportsTextDouble``, named so: it reads the tree's text, which a
real witness must not), through ``apply``.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from conftest import REAL_PINS, require_witness
from sglpatch.series.check import check_series
from sglpatch.witnesses import agreement, registry
from sglpatch.witnesses.agreement import CaseMap, disagreements
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE, WitnessResult
from test_witness_upstream_test import GOOD_TEST, NEW_STEM, NEW_TEST, _new_patch, _project_with_tests

MAP = CaseMap(Path("patches/tests/0002-x/cases.toml"), {
    "exact": ("TestX.test_exact",), "unfused": ("TestX.test_unfused",), "control": ("TestX.test_control",)})
TREE = "the pristine tree of 0.5.23"


def _witness(**cases) -> WitnessResult:
    state = BUG if BUG in cases.values() else CLEAN
    return WitnessResult("mtp-quark-exclude", state, "build+load gfx950", "per case", cases=cases)


def _tests(**cases) -> WitnessResult:
    state = BUG if BUG in cases.values() else CLEAN
    return WitnessResult("upstream-test:0002-x", state, "unittest gfx950", "tests",
                         cases={f"TestX.test_{name}": verdict for name, verdict in cases.items()})


def test_a_witness_and_tests_that_agree_case_by_case_pass():
    assert disagreements(_witness(exact=BUG, unfused=CLEAN, control=CLEAN),
                         _tests(exact=BUG, unfused=CLEAN, control=CLEAN), MAP, TREE) == []


def test_a_test_that_fails_a_case_the_witness_finds_clean_is_refused_naming_case_test_tree_and_verdicts():
    # The 0002 "unfused" case of issue 34: its test fails for a reason production never meets.
    [found] = disagreements(_witness(exact=BUG, unfused=CLEAN, control=CLEAN),
                            _tests(exact=BUG, unfused=BUG, control=CLEAN), MAP, TREE)
    assert found == ("case 'unfused' on the pristine tree of 0.5.23: mtp-quark-exclude says clean, but "
                     "TestX.test_unfused says bug (patches/tests/0002-x/cases.toml)")


def test_a_test_that_passes_where_the_witness_finds_the_bug_is_refused():
    [found] = disagreements(_witness(exact=BUG, unfused=CLEAN, control=CLEAN),
                            _tests(exact=CLEAN, unfused=CLEAN, control=CLEAN), MAP, TREE)
    assert "case 'exact'" in found and "mtp-quark-exclude says bug, but TestX.test_exact says clean" in found


def test_a_skipped_test_does_not_stand_for_a_bug_case():
    [found] = disagreements(_witness(exact=BUG, unfused=CLEAN, control=CLEAN),
                            _tests(exact=UNAVAILABLE, unfused=CLEAN, control=CLEAN), MAP, TREE)
    assert "TestX.test_exact says unavailable" in found


def test_a_bug_case_no_test_judges_is_refused():
    case_map = CaseMap(MAP.path, {**MAP.cases, "exact": ()})
    found = disagreements(_witness(exact=BUG, unfused=CLEAN, control=CLEAN),
                          _tests(exact=BUG, unfused=CLEAN, control=CLEAN), case_map, TREE)
    assert "case 'exact' on the pristine tree of 0.5.23: mtp-quark-exclude says bug, and no test judges it" in found[0]
    assert "TestX.test_exact judge(s) no case of mtp-quark-exclude" in found[1]


def test_a_listed_test_that_did_not_run_and_a_case_the_witness_does_not_check_are_refused():
    case_map = CaseMap(MAP.path, {**MAP.cases, "unfused": ("TestX.test_unfused", "TestX.test_gone"), "typo": ()})
    found = "\n".join(disagreements(_witness(exact=BUG, unfused=CLEAN, control=CLEAN),
                                    _tests(exact=BUG, unfused=CLEAN, control=CLEAN), case_map, TREE))
    assert "lists TestX.test_gone, which is no test that ran" in found
    assert "names case(s) typo, which mtp-quark-exclude does not check" in found


def test_a_witness_with_cases_needs_a_case_map():
    [found] = disagreements(_witness(exact=BUG), _tests(exact=BUG), None, TREE)
    assert "no tests/<patch>/cases.toml says which tests judge which" in found


def test_a_witness_without_cases_is_held_to_the_tests_as_a_whole():
    whole = WitnessResult("rocm-flags", BUG, "server-args-cpu", "bug")
    assert disagreements(whole, _tests(a=BUG, b=CLEAN), None, TREE) == []
    [found] = disagreements(whole, _tests(a=CLEAN, b=CLEAN), None, TREE)
    assert "rocm-flags finds the bug but every test passes" in found
    clean = WitnessResult("rocm-flags", CLEAN, "server-args-cpu", "clean")
    assert "rocm-flags finds no bug but a test fails" in disagreements(clean, _tests(a=BUG), None, TREE)[0]


def test_nothing_is_compared_where_either_could_not_run():
    assert disagreements(WitnessResult("w", UNAVAILABLE), _tests(exact=CLEAN), MAP, TREE) == []
    assert disagreements(_witness(exact=BUG), WitnessResult("t", UNAVAILABLE), MAP, TREE) == []


def test_tests_that_pass_on_the_release_the_fix_was_written_for_are_refused_only_there():
    passing = _tests(a=CLEAN)
    tests = registry.UpstreamTestWitness("0004-x", ())
    said = agreement.refusals([tests], {tests.name: passing}, "pristine", "0.5.23", "0.5.23", None)
    assert said and said[0].startswith("its test does not find the bug on 0.5.23, the release the fix was written for")
    assert agreement.refusals([tests], {tests.name: passing}, "pristine", "0.5.22", "0.5.23", None) == []
    assert agreement.refusals([tests], {tests.name: _tests(a=BUG)}, "pristine", "0.5.23", "0.5.23", None) == []


# -- what check finds without running anything -------------------------------------------------------

TWO_TESTS = GOOD_TEST.replace("    def test_it(self):\n        self.assertTrue(True)\n",
                              "    def test_it(self):\n        self.assertTrue(True)\n\n"
                              "    def test_other(self):\n        self.assertTrue(True)\n")


def _with_cases(fake_project, tmp_path, cases: str | None, witness: str = "guard-text", test: str = TWO_TESTS):
    project = _project_with_tests(fake_project, tmp_path, test, witness=witness)
    if cases is not None:
        (project.patches_dir / "tests" / "0001-fix-example" / "cases.toml").write_text(cases)
    return project, [str(p) for p in check_series(project.patches_dir, project.pins())]


def test_check_accepts_a_case_map_naming_every_test_once(fake_project, tmp_path):
    _, found = _with_cases(fake_project, tmp_path, '[cases]\nguarded = ["TestExample.test_it"]\n'
                                                   'other = ["TestExample.test_other"]\n')
    assert found == []


@pytest.mark.parametrize("cases, problem", [
    ('[cases]\nguarded = ["TestExample.test_it"]\n', "TestExample.test_other judges no case of the witness"),
    ('[cases]\nguarded = ["TestExample.test_it", "TestExample.test_other", "TestExample.test_gone"]\n',
     "cases.guarded lists TestExample.test_gone, which no test file of 0001-fix-example defines"),
    ("[cases]\nguarded = \"TestExample.test_it\"\n", "must be a list of test ids"),
    ("cases = 1\n", "no [cases] table"),
    ("[cases\n", "not TOML"),
    ('[tests]\nguarded = ["TestExample.test_it"]\n', "unknown key(s) tests"),
])
def test_check_refuses_a_case_map_that_does_not_name_the_tests_there_are(fake_project, tmp_path, cases, problem):
    _, found = _with_cases(fake_project, tmp_path, cases)
    assert any(problem in line for line in found), found


def test_check_refuses_a_case_map_beside_a_patch_whose_witness_is_its_tests(fake_project, tmp_path):
    _, found = _with_cases(fake_project, tmp_path, '[cases]\na = ["TestExample.test_it", "TestExample.test_other"]\n',
                           witness="upstream-test")
    assert any("the patch's witness is its tests" in line for line in found), found


def test_the_case_map_is_no_test_and_is_in_the_series_digest(fake_project, tmp_path):
    project, _ = _with_cases(fake_project, tmp_path, '[cases]\na = ["TestExample.test_it", "TestExample.test_other"]\n')
    series = project.series()
    assert [t.path for t in series.patches[0].tests] == ["test/registered/unit/layers/test_example.py"]
    before = series.digest()
    (project.patches_dir / "tests" / "0001-fix-example" / "cases.toml").write_text('[cases]\na = ["TestExample.test_it"]\n'
                                                                                  'b = ["TestExample.test_other"]\n')
    assert project.series().digest() != before


# -- a real test on the real 0.5.23, beside a witness of the test's own ------------------------------

class CiExportsTextDouble:
    """Test double of a witness with cases (the real ones are mtp-quark-exclude and rocm-flags): it
    reads ``__all__`` of the tree's ``sglang/test/ci/ci_register.py`` as text, which a real witness
    must not (it would judge wording). Case ``musa-once``: ``register_musa_ci`` listed once; case
    ``cpu-listed``: ``register_cpu_ci`` listed."""

    name = "ci-exports-text-double"
    version = "1"

    def run(self, tree: Path, pin) -> WitnessResult:
        module = ast.parse((tree / "python/sglang/test/ci/ci_register.py").read_text())
        names = next(ast.literal_eval(node.value) for node in module.body
                     if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__")
        cases = {"musa-once": CLEAN if names.count("register_musa_ci") == 1 else BUG,
                 "cpu-listed": CLEAN if "register_cpu_ci" in names else BUG}
        return WitnessResult(self.name, BUG if BUG in cases.values() else CLEAN, "text (test double)",
                             f"__all__: {cases}", cases=cases)


# The new fix's real test, and a second one that judges the other case.
TWO_REAL_TESTS = NEW_TEST.replace(
    "        self.assertEqual(len(names), len(set(names)), sorted(names))\n",
    "        self.assertEqual(len(names), len(set(names)), sorted(names))\n\n"
    "    def test_register_cpu_ci_is_exported(self):\n"
    "        self.assertIn(\"register_cpu_ci\", ci_register.__all__)\n")
assert TWO_REAL_TESTS != NEW_TEST
ONCE, CPU = "TestCiRegisterExports.test_all_names_each_export_once", "TestCiRegisterExports.test_register_cpu_ci_is_exported"


@pytest.mark.network
@pytest.mark.parametrize("cases, refused", [
    (f'[cases]\nmusa-once = ["{ONCE}"]\ncpu-listed = ["{CPU}"]\n', []),
    (f'[cases]\nmusa-once = ["{CPU}"]\ncpu-listed = ["{ONCE}"]\n',
     [f"case 'musa-once' on the pristine tree of 0.5.23: ci-exports-text-double says bug, but {CPU} says clean",
      f"case 'cpu-listed' on the pristine tree of 0.5.23: ci-exports-text-double says clean, but {ONCE} says bug"]),
    (f'[cases]\nmusa-once = []\ncpu-listed = ["{ONCE}", "{CPU}"]\n',
     ["case 'musa-once' on the pristine tree of 0.5.23: ci-exports-text-double says bug, and no test judges it"]),
], ids=["agreeing", "swapped", "bug-case-without-a-test"])
def test_apply_refuses_a_witness_and_tests_that_disagree_on_the_real_tree(project_copy, tmp_path, monkeypatch,
                                                                          cases, refused):
    from sglpatch.apply.apply_pins import apply_series

    double = CiExportsTextDouble()
    real_registry = registry.registry
    monkeypatch.setattr(registry, "registry", lambda: {**real_registry(), double.name: double})
    project = project_copy
    _new_patch(project, tmp_path, TWO_REAL_TESTS, witness=double.name)
    (project.patches_dir / "tests" / NEW_STEM / "cases.toml").write_text(cases)
    assert [str(p) for p in check_series(project.patches_dir, project.pins())] == []
    lock = (project.root / "series.lock").read_bytes()
    report = apply_series(project, ["0.5.23"], update_lock=True, out_dir=project.root / "build")
    [result] = report.results
    outcome = next(o for o in result.patches if o.name == f"{NEW_STEM}.patch")
    print(outcome)
    if "unavailable" in outcome.tests_before:
        require_witness(WitnessResult("upstream-test", UNAVAILABLE, detail=outcome.detail))
    if not refused:
        assert result.ok, result.error
        assert (outcome.status, outcome.witness_before, outcome.witness_after) == (
            "applied", "bug [text (test double)]", "clean [text (test double)]")
        assert (outcome.tests_before, outcome.tests_after) == ("bug [unittest gfx950]", "clean [unittest gfx950]")
        entry = next(p for p in json.loads((project.root / "series.lock").read_text())["pins"]["0.5.23"]["patches"]
                     if p["name"] == f"{NEW_STEM}.patch")
        assert entry["tests"] == {"pristine": "bug [unittest gfx950]", "patched": "clean [unittest gfx950]"}
        return
    assert not result.ok and outcome.status == "witness-refused"
    for words in refused:
        assert words in outcome.detail, outcome.detail
    assert (project.root / "series.lock").read_bytes() == lock
    assert report.suggestions == []


# Patch 0002's regression test as it stood before issue 34 (this repository at b5a2d5c), kept as a
# fixture: its "unfused_names" subtest built the Quark config without the loader's packed mapping,
# so it failed on pristine 0.5.23 for a shape mismatch production never meets.
OLD_0002_TEST = Path(__file__).parent / "fixtures_0002_old_unfused" / "test_quark_nextn_exclude.py.txt"
STEM_0002 = "0002-quark-keep-mtp-draft-excluded-modules-unquantized"


@pytest.mark.network
def test_check_refuses_0002_with_its_old_unfused_case_beside_the_witness_that_finds_it_clean(project_copy, capsys):
    from sglpatch import cli

    project = project_copy
    tests = project.patches_dir / "tests" / STEM_0002
    old = tests / "test" / "registered" / "unit" / "layers" / "quantization" / "test_quark_nextn_exclude.py"
    old.parent.mkdir(parents=True)
    old.write_text(OLD_0002_TEST.read_text())
    # Where its author would list it: the unfused gate_proj/up_proj names are the ones Quark writes,
    # the witness's "exact" spelling.
    cases = (tests / "cases.toml").read_text()
    cases = cases.replace('"exact/shared-expert-unquantized" = [', '"exact/shared-expert-unquantized" = '
                          '["TestQuarkNextnExclude.test_mtp_exclusions_keep_draft_modules_unquantized", ')
    cases = cases.replace('"control/not-excluded-quantized" = [', '"control/not-excluded-quantized" = '
                          '["TestQuarkNextnExclude.test_modules_not_excluded_stay_quantized", '
                          '"TestQuarkNextnExclude.test_target_config_is_left_as_it_was", ')
    (tests / "cases.toml").write_text(cases)
    lock = (project.root / "series.lock").read_bytes()
    status = cli.main(["--root", str(project.root), "check"])
    said = capsys.readouterr()
    print(said.out, said.err)
    if status == 4:
        require_witness(WitnessResult("upstream-test", UNAVAILABLE, detail=said.out + said.err))
    assert status == 1
    assert (f"refused: {STEM_0002}.patch on 0.5.23, the release the fix was written for: witness-refused: "
            "case 'exact/shared-expert-unquantized' on the pristine tree of 0.5.23: mtp-quark-exclude says clean, but "
            "TestQuarkNextnExclude.test_mtp_exclusions_keep_draft_modules_unquantized says bug") in said.out
    assert (project.root / "series.lock").read_bytes() == lock
    assert not (project.root / "build").exists()
