"""The upstream-test witness: a patch's regression tests in sglang's own layout
(``patches/tests/<patch>/test/registered/unit/...``), run on a tree in the pin's CPU Python.

Fast tests: how the probe's answer is judged, how the series finds and checks the tests, which
witnesses judge which rendition, what the cache key covers. Network tests: each test the series
sends upstream fails on the pristine 0.5.23 and passes with the patch.
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import REAL_PINS, REPO_ROOT, format_patch, require_witness, witnessed
from sglpatch.series.check import check_series
from sglpatch.series.lock import result_of
from sglpatch.series.patches import load_series
from sglpatch.witnesses import registry, upstream_test
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE

TEST_PATH = "test/registered/unit/layers/test_example.py"
GOOD_TEST = '''import unittest

from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=1, suite="base-a-test-cpu")


class TestExample(CustomTestCase):
    def test_it(self):
        self.assertTrue(True)


if __name__ == "__main__":
    unittest.main()
'''


def _answer(**files) -> dict:
    return {"emulated_gpu": "gfx950:sramecc+:xnack-", "standins": [], "files": files}


def test_a_failed_assertion_is_the_bug():
    result = upstream_test.judge(_answer(**{TEST_PATH: {
        "tests_run": 2, "errors": [], "skipped": [],
        "failures": [{"test": "m.TestX.test_y (case='a')", "detail": "Traceback\nAssertionError: 'bfloat16' != 'fp8_e4m3'"}],
    }}))
    assert result.state == BUG
    assert result.level == "unittest gfx950"
    assert "TestX.test_y (case='a'): AssertionError: 'bfloat16' != 'fp8_e4m3'" in result.detail


def test_every_test_passing_is_clean():
    result = upstream_test.judge(_answer(**{TEST_PATH: {"tests_run": 3, "failures": [], "errors": [], "skipped": []}}))
    assert result.state == CLEAN and "3 passed" in result.detail


@pytest.mark.parametrize("found, why", [
    ({"tests_run": 1, "failures": [], "errors": [{"test": "m.T.t", "detail": "ImportError: no name x"}]}, "ImportError: no name x"),
    ({"refused": "sglang's CI collector would refuse it: no register_cpu_ci(...) call at the top"}, "no register_cpu_ci"),
    ({"unavailable": "the release has no CI collector (sglang.test.ci.ci_register): No module named"}, "no CI collector"),
    ({"tests_run": 0, "failures": [], "errors": []}, "no test ran"),
])
def test_what_is_no_verdict_is_unavailable_with_the_reason(found, why):
    # A test that errors (not a failed assertion) says nothing about the bug, even beside a failure.
    failing = {"tests_run": 1, "errors": [], "failures": [{"test": "m.T.u", "detail": "AssertionError"}]}
    result = upstream_test.judge(_answer(**{TEST_PATH: found, "test/registered/unit/test_other.py": failing}))
    assert result.state == UNAVAILABLE
    assert why in result.detail


@pytest.mark.parametrize("found, words", [
    ({"tests": ["m.T.a", "m.T.b"], "tests_run": 2, "failures": [], "errors": [],
      "skipped": [{"test": "m.T.a", "reason": "not on this release"}, {"test": "m.T.b", "reason": "nor this"}]},
     ["every test skipped (T.a: not on this release"]),
    ({"tests": ["m.T.a", "m.T.b"], "tests_run": 2, "failures": [], "errors": [],
      "skipped": [{"test": "m.T.b", "reason": "needs a GPU"}]},
     ["2 ran", "skipped: T.b: needs a GPU"]),
    ({"tests": ["m.T.a"], "tests_run": 1, "failures": [], "errors": [], "skipped": [],
      "expected_failures": [{"test": "m.T.a", "detail": "AssertionError: 2 != 1"}]},
     ["expected failure (judges nothing): T.a"]),
    ({"tests": ["m.T.a"], "tests_run": 1, "failures": [], "errors": [], "skipped": [], "unexpected_successes": ["m.T.a"]},
     ["T.a: an unexpected success"]),
    ({"tests": ["m.T.a"], "tests_run": 1, "failures": [{"test": "m.T.a", "detail": "AssertionError"}], "errors": [],
      "skipped": [], "unexpected_successes": ["m.T.b"]},
     ["T.b: an unexpected success"]),
    ({"tests": ["m.T.a"], "tests_run": 1, "failures": [{"test": "m.T.a", "detail": "AssertionError"}], "errors": [],
      "skipped": [], "tree_changed": ["python/sglang/test/ci/__init__.py"]},
     ["the tests changed the tree they judge (python/sglang/test/ci/__init__.py)"]),
], ids=["all-skipped", "one-skipped-rest-passed", "expected-failure", "unexpected-success",
        "unexpected-success-beside-a-failure", "wrote-to-the-tree"])
def test_a_skip_an_expected_failure_or_an_unexpected_success_is_never_clean(found, words):
    result = upstream_test.judge(_answer(**{TEST_PATH: found}))
    assert result.state == UNAVAILABLE, result
    for word in words:
        assert word in result.detail, result.detail


def test_a_failed_assertion_beside_a_skip_is_the_bug_and_names_the_skip():
    result = upstream_test.judge(_answer(**{TEST_PATH: {
        "tests": ["m.T.a", "m.T.b"], "tests_run": 2, "errors": [], "skipped": [{"test": "m.T.b", "reason": "no GPU"}],
        "failures": [{"test": "m.T.a", "detail": "AssertionError: 2 != 1"}]}}))
    assert result.state == BUG and "not verdicts: skipped: T.b: no GPU" in result.detail


def test_each_test_is_a_case_with_its_own_verdict():
    result = upstream_test.judge(_answer(**{TEST_PATH: {
        "tests": ["m.TestX.test_fails", "m.TestX.test_passes", "m.TestY.test_skips", "m.TestY.test_subtests"],
        "tests_run": 4, "errors": [], "skipped": [{"test": "m.TestY.test_skips", "reason": "r"}],
        "failures": [{"test": "m.TestX.test_fails", "detail": "AssertionError"},
                     {"test": "m.TestY.test_subtests (spelling='regex')", "detail": "AssertionError"}]}}))
    assert result.cases == {"TestX.test_fails": BUG, "TestX.test_passes": CLEAN, "TestY.test_skips": UNAVAILABLE,
                            "TestY.test_subtests": BUG}


def _rendition(tmp_path, name: str, trailers: dict):
    from sglpatch.series.patches import parse_patch_file

    text = format_patch(tmp_path / "src", {"a.py": "a\n"}, {"a.py": "b\n"}, "Fix a", trailers)
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return parse_patch_file(path)


@pytest.mark.parametrize("name, trailers, written_for", [
    ("0004-fix-a.patch", {"Applies-To": "==0.5.23"}, "0.5.23"),  # patch refresh 0.5.23 writes this
    ("0004-fix-a.patch", {"Applies-To": ">=0.5.20"}, "0.5.23"),  # the newest release it covers
    ("renditions/0004-fix-a/0.5.16.patch", {"Applies-To": ">=0.5.16,<=0.5.19"}, "0.5.16"),  # named after its pin
    ("0001-guard.patch", {"Applies-To": ">=0.5.12,<=0.5.23", "Fixed-Upstream-In": "0.5.15 (same guard)"}, "0.5.14"),
    ("0001-guard.patch", {"Applies-To": ">=0.5.17,<=0.5.23", "Fixed-Upstream-In": "0.5.15 (same guard)"}, None),
])
def test_the_release_a_fix_was_written_for(tmp_path, name, trailers, written_for):
    rendition = _rendition(tmp_path, name, {"Witness": "upstream-test", **trailers})
    assert upstream_test.release_written_for(rendition, REAL_PINS.pins) == written_for


@pytest.mark.parametrize("runs, suggested", [
    ({"0.5.21": True, "0.5.22": False}, "Inappropriate [fixed upstream differently in 0.5.22]"),
    ({"0.5.22": False}, None),  # nothing in the run found the bug on an older release
    ({"0.5.21": True, "0.5.23": False}, None),  # the release the fix was written for
], ids=["found-before-gone-after", "never-found", "on-the-release-written-for"])
def test_fixed_upstream_differently_is_said_only_after_the_bug_was_found_and_not_where_the_fix_was_written(
        tmp_path, runs, suggested):
    from types import SimpleNamespace

    from sglpatch.apply.one_pin import PatchOutcome, PinResult
    from sglpatch.upstream.suggest import status_suggestions

    main = _rendition(tmp_path, "0004-fix-a.patch", {"Witness": "upstream-test", "Applies-To": ">=0.5.22,<=0.5.23",
                                                     "Upstream-Status": "Pending"})
    older = _rendition(tmp_path, "renditions/0004-fix-a/0.5.21.patch",
                       {"Witness": "upstream-test", "Applies-To": "==0.5.21", "Upstream-Status": "Pending"})
    patch = SimpleNamespace(name="0004-fix-a.patch", main=main, for_version=lambda v: older if v == "0.5.21" else main)
    results = [PinResult(version, "/t", patches=[PatchOutcome("0004-fix-a.patch", "applied" if needed else "not-needed",
                                                             needed=needed)])
               for version, needed in runs.items()]
    found = status_suggestions(SimpleNamespace(patches=[patch]), results, REAL_PINS.pins)
    assert [s.suggested for s in found] == ([suggested] if suggested else [])


def _project_with_tests(fake_project, tmp_path, test_text: str | None, witness: str = "guard-text",
                        test_path: str = TEST_PATH):
    files = {"python/sglang/srt/layers/example.py": "".join(f"line {n}\n" for n in range(1, 41))}
    patch = format_patch(tmp_path / "src", files, {"python/sglang/srt/layers/example.py": "fixed\n"},
                         "[AMD] Fix the example", {"Witness": witness})
    fake_project.set_patches([("0001-fix-example.patch", patch)])
    if test_text is not None:
        target = fake_project.root / "patches" / "tests" / "0001-fix-example" / test_path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(test_text)
    return fake_project.project


def test_the_series_finds_a_patchs_tests_by_their_upstream_path(fake_project, tmp_path):
    project = _project_with_tests(fake_project, tmp_path, GOOD_TEST)
    series = project.series()
    [test] = series.patches[0].tests
    assert test.path == TEST_PATH
    assert test.file.read_text() == GOOD_TEST
    assert test.file in series.files  # the series digest covers the tests' bytes
    assert check_series(project.patches_dir, project.pins()) == []


@pytest.mark.parametrize("text, path, problem", [
    (GOOD_TEST.replace('register_cpu_ci(est_time=1, suite="base-a-test-cpu")\n', ""), TEST_PATH, "no register_cpu_ci"),
    (GOOD_TEST.split("if __name__")[0], TEST_PATH, 'no `if __name__ == "__main__": unittest.main()` block'),
    (GOOD_TEST, "tests/test_example.py", "not a test in sglang's layout"),
])
def test_check_refuses_a_test_upstreams_collector_would_not_run(fake_project, tmp_path, text, path, problem):
    project = _project_with_tests(fake_project, tmp_path, text, test_path=path)
    found = [str(p) for p in check_series(project.patches_dir, project.pins())]
    assert any(problem in line for line in found), found


def test_once_the_series_keeps_tests_a_patch_still_needed_must_have_one(fake_project, tmp_path):
    project = _project_with_tests(fake_project, tmp_path, None)
    (project.patches_dir / "tests").mkdir()
    found = [str(p) for p in check_series(project.patches_dir, project.pins())]
    assert any("0001-fix-example.patch" in line and "no regression test" in line for line in found), found


def test_a_patch_fixed_upstream_needs_no_test_and_the_real_series_says_which():
    series = load_series(REPO_ROOT / "patches")
    by_stem = {patch.stem[:4]: patch for patch in series.patches}
    # 0001 is upstream from 0.5.15: its Fixed-Upstream-In says so, and it has nothing to send.
    assert by_stem["0001"].tests == () and by_stem["0001"].main.trailer("Fixed-Upstream-In")
    assert [t.path for t in by_stem["0002"].tests] == ["test/registered/unit/models/test_glm4_moe_nextn_quark_exclude.py"]
    assert sorted(t.path for t in by_stem["0003"].tests) == [
        "test/registered/unit/server_args/test_aiter_allreduce_fusion_inert_warning.py",
        "test/registered/unit/server_args/test_glm5_gfx950_kv_cache_dtype.py",
    ]


def test_tests_judge_the_main_file_beside_the_patchs_own_witness():
    series = load_series(REPO_ROOT / "patches")
    patch = series.get("0002-quark-keep-mtp-draft-excluded-modules-unquantized")
    on_main = registry.witnesses_for(patch, patch.main)
    assert [w.name for w in on_main] == ["mtp-quark-exclude", f"upstream-test:{patch.stem}"]
    older = next(r for r in patch.renditions if r.path != patch.main.path)
    assert [w.name for w in registry.witnesses_for(patch, older)] == ["mtp-quark-exclude"]


def test_a_patch_whose_witness_is_its_tests_has_them_on_every_rendition(fake_project, tmp_path):
    project = _project_with_tests(fake_project, tmp_path, GOOD_TEST, witness="upstream-test")
    patch = project.series().patches[0]
    [witness] = registry.witnesses_for(patch, patch.main)
    assert witness.name == "upstream-test:0001-fix-example" and witness.tests == patch.tests
    # The trailer alone (as `sglpatch upstream` reads it) binds to the tests beside the file.
    assert registry.witness_for("upstream-test", str(patch.main.path)).tests == patch.tests


def test_the_cache_key_covers_the_tests_bytes(fake_project, tmp_path, monkeypatch):
    from sglpatch.witnesses import cpu_envs

    monkeypatch.setattr(cpu_envs, "env_fingerprint", lambda pin: "the pin's CPU environment")
    project = _project_with_tests(fake_project, tmp_path, GOOD_TEST)
    patch = project.series().patches[0]
    pin = REAL_PINS.newest
    witness = upstream_test.UpstreamTestWitness(patch.stem, patch.tests)
    before = witness.fingerprint(pin)
    patch.tests[0].file.write_text(GOOD_TEST.replace("assertTrue(True)", "assertTrue(1)"))
    assert upstream_test.UpstreamTestWitness(patch.stem, patch.tests).fingerprint(pin) != before


def test_the_lock_compares_results_not_how_the_tests_proved_them():
    entry = {"patches": [{"name": "p", "status": "applied", "commit": "c",
                          "witness": {"pristine": "bug", "patched": "clean"},
                          "tests": {"pristine": "bug [unittest gfx950]", "patched": "clean [unittest gfx950]"}}]}
    assert result_of(entry) == {"patches": [{"name": "p", "status": "applied", "commit": "c"}]}


# -- the series' own tests on the newest pin ---------------------------------------------------------

SERIES_TESTS = {
    "0002-quark-keep-mtp-draft-excluded-modules-unquantized": ["built with QuarkLinearMethod"],
    # The detail is cut after the first failures (16 of 25 tests fail): words from the warning file,
    # whose failures come first; the KV file's failures are counted in the state.
    "0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default": [
        "16 failed assertion(s) in 25 tests", "want one warning naming --enable-aiter-allreduce-fusion",
        "True is not false"],
}


@pytest.mark.network
@pytest.mark.parametrize("stem", sorted(SERIES_TESTS))
def test_each_patchs_upstream_test_fails_on_the_pristine_newest_pin_and_passes_patched(stem, tmp_path):
    patch = load_series(REPO_ROOT / "patches").get(stem)
    witness = upstream_test.UpstreamTestWitness(patch.stem, patch.tests)
    before = require_witness(witnessed(witness, "0.5.23", False, tmp_path / "pristine"))
    after = require_witness(witnessed(witness, "0.5.23", True, tmp_path / "patched"))
    print(f"pristine: {before}\npatched: {after}")
    assert before.state == BUG, before
    for words in SERIES_TESTS[stem]:
        assert words in before.detail
    assert after.state == CLEAN, after


# -- a fourth fix: a patch and its test, nothing else ---------------------------------------------------

NEW_STEM = "0004-ci-register-name-each-export-once"
NEW_TEST_PATH = "test/registered/unit/ci/test_ci_register_exports.py"
NEW_TEST = '''import unittest

from sglang.test.ci import ci_register
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=1, suite="base-a-test-cpu")


class TestCiRegisterExports(CustomTestCase):
    def test_all_names_each_export_once(self):
        names = ci_register.__all__
        self.assertEqual(len(names), len(set(names)), sorted(names))


if __name__ == "__main__":
    unittest.main()
'''


def _new_patch(project, tmp_path, test_text: str = NEW_TEST, witness: str = "upstream-test") -> None:
    """What the guide (docs/writing-a-fix.md) asks of a new fix: the patch, listed in the series,
    and its test beside it (``test_text``). The bug is real: 0.5.23's ci_register lists
    register_musa_ci twice in __all__."""
    from conftest import pristine_subtree

    released = pristine_subtree("0.5.23", tmp_path / "released", "python/sglang/test/ci")
    path = "python/sglang/test/ci/ci_register.py"
    text = (released / path).read_text()
    first = text.index('    "register_musa_ci",\n')
    second = text.index('    "register_musa_ci",\n', first + 1)
    fixed = text[:second] + text[second + len('    "register_musa_ci",\n'):]
    patch = format_patch(tmp_path / "src", {path: text}, {path: fixed}, "[CI] List each CI registration helper once in __all__",
                         {"Witness": witness, "Applies-To": "==0.5.23",
                          "Origin": "sglpatch; found while writing the guide to a new fix"},
                         body="Problem: register_musa_ci is listed twice in __all__.\n\nFix: list it once.\n\n"
                              "Testing: test/registered/unit/ci/test_ci_register_exports.py.\n\n"
                              "Related: none found; no upstream pull request touches this list.")
    (project.patches_dir / f"{NEW_STEM}.patch").write_text(patch)
    with (project.patches_dir / "series").open("a") as series:
        series.write(f"{NEW_STEM}.patch\n")
    target = project.patches_dir / "tests" / NEW_STEM / NEW_TEST_PATH
    target.parent.mkdir(parents=True)
    target.write_text(test_text)


@pytest.mark.network
def test_a_new_fix_with_only_a_test_is_witnessed_locked_and_exported(project_copy, tmp_path):
    from sglpatch import cli
    from sglpatch.apply.apply_pins import apply_series

    project = project_copy
    _new_patch(project, tmp_path)
    assert [str(p) for p in check_series(project.patches_dir, project.pins())] == []
    report = apply_series(project, ["0.5.23"], update_lock=True, out_dir=project.root / "build")
    [result] = report.results
    outcome = next(o for o in result.patches if o.name == f"{NEW_STEM}.patch")
    if "unavailable" in outcome.witness_before:
        require_witness(upstream_test.UpstreamTestWitness().judge_probe(None, outcome.detail, REAL_PINS.newest))
    print(outcome)
    assert result.ok, result.error
    assert outcome.status == "applied" and outcome.needed is True
    assert outcome.witness_before == "bug [unittest gfx950]" and outcome.witness_after == "clean [unittest gfx950]"
    locked = json.loads((project.root / "series.lock").read_text())["pins"]["0.5.23"]
    entry = next(p for p in locked["patches"] if p["name"] == f"{NEW_STEM}.patch")
    assert entry["status"] == "applied" and entry["commit"] == outcome.commit == locked["commit"]
    assert entry["witness"] == {"pristine": "bug [unittest gfx950]", "patched": "clean [unittest gfx950]"}
    # The patches before it keep their witnesses' verdicts.
    assert [p["witness"]["pristine"] for p in locked["patches"][1:3]] == ["bug [build+load gfx950]", "bug [server-args-cpu]"]

    out = tmp_path / "upstream"
    assert cli.main(["--root", str(project.root), "upstream", NEW_STEM, "--out", str(out)]) == 0
    mbox = (out / NEW_STEM / f"{NEW_STEM}.mbox").read_text()
    assert "register_musa_ci" in mbox and "Witness:" not in mbox
    body = (out / NEW_STEM / "PR.md").read_text()
    assert f"```bash\npython3 {NEW_TEST_PATH}\n```" in body
    # What the command printed, as printed; then the verdicts, labelled as what they rest on.
    assert "Run as shown from the repository root on a CPU-only machine" in body
    assert re.search(r"without the change[^\n]*: fails: 1\s+failed assertion", body), body
    assert re.search(r"with the change[^\n]*: passes: 1\s+passed", body), body


def test_the_tests_go_into_the_pull_requests_tree_at_their_upstream_paths(fake_project, tmp_path):
    from conftest import git
    from sglpatch.apply.index_apply import add_tests_to_index, apply_to_index
    from sglpatch.plumbing.gitcmd import run_git

    project = _project_with_tests(fake_project, tmp_path, GOOD_TEST)
    patch = project.series().patches[0]
    repo = tmp_path / "clone"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "python/sglang/srt/layers").mkdir(parents=True)
    (repo / "python/sglang/srt/layers/example.py").write_text("".join(f"line {n}\n" for n in range(1, 41)))
    git(repo, "add", "-A")
    env = {"GIT_INDEX_FILE": str(tmp_path / "pr-index")}
    run_git(["read-tree", git(repo, "write-tree").strip()], repo, env=env)
    apply_to_index(repo, env, patch.main.diff_text)
    tree = add_tests_to_index(repo, env, patch.tests)
    listed = git(repo, "ls-tree", "-r", "--name-only", tree).split()
    assert listed == ["python/sglang/srt/layers/example.py", TEST_PATH]
    assert git(repo, "show", f"{tree}:{TEST_PATH}") == GOOD_TEST
