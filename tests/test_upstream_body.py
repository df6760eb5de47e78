"""A pull request's body in sglang's template, from a patch message's labelled paragraphs, and the
PR-Split parts of a patch."""

from __future__ import annotations

import pytest

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.upstream import upstream_body, upstream_split
from sglpatch.upstream.upstream_plain_run import PlainRun
from sglpatch.witnesses.results import BUG, CLEAN, WitnessResult

MESSAGE = """Problem: the draft fails to load.

Cause: the exclude list is not remapped.

Fix: remap it.

Testing: on CPU with gfx950 emulated.

Related: builds on #30265 (the exact-name remap); https://github.com/sgl-project/sglang/issues/39779
tracks the same lookup.

Bench: serve it twice and measure:

    python -m sglang.benchmark.serving --backend sglang \\
        --max-concurrency 1"""


HOOKS_RAN = upstream_body.HooksSaid("the repository's `.pre-commit-config.yaml`, every hook it lists", complete=True)


def _run():
    long_line = "; ".join(f"case {n}: module {n} QuarkW4A4MXFP4/shape-mismatch" for n in range(40))
    return upstream_body.TestRun("python3 test/registered/unit/test_x.py",
                                 WitnessResult("mtp", BUG, "build", long_line + " [doubles: stand-ins aiter]"),
                                 WitnessResult("mtp", CLEAN, "build", "every module unquantized"))


def test_the_body_has_the_templates_sections_filled_from_the_labelled_paragraphs():
    body = upstream_body.render_body(MESSAGE, files=["python/sglang/a.py"], tests=["test/registered/unit/test_x.py"],
                                     run=_run(), matrix=["| 0.5.23 | bug [x] | clean [x] |"], hooks=HOOKS_RAN)
    sections = [line for line in body.splitlines() if line.startswith("## ")]
    assert sections == ["## Motivation", "## Modifications", "## Related upstream work", "## Accuracy Tests",
                        "## Speed Tests and Profiling", "## Checklist"]
    motivation, rest = body.split("## Modifications")
    assert "the draft fails to load." in motivation and "the exclude list is not remapped." in motivation
    assert "remap it." in rest.split("## Related upstream work")[0]
    related = rest.split("## Related upstream work\n\n")[1].split("\n\n## ")[0]
    assert related.split() == "builds on #30265 (the exact-name remap); #39779 tracks the same lookup.".split()
    assert "```bash\npython -m sglang.benchmark.serving --backend sglang \\\n    --max-concurrency 1\n```" in body
    assert "| 0.5.23 | fails [x] | passes [x] |" in body
    assert "Not measured on MI355X." in body and "- [x] Add unit tests" in body
    checklist = " ".join(body.split("## Checklist")[1].split())
    assert f"- [x] Format your code according to pre-commit ({HOOKS_RAN.said})." in checklist


def test_a_checks_long_output_is_shown_short_and_in_upstreams_words():
    body = upstream_body.render_body(MESSAGE, files=[], tests=[], run=_run(), matrix=[], hooks=None)
    fenced = body.split("Without the change it fails:\n\n```\n")[1].split("```")[0].splitlines()
    assert len(fenced) == upstream_body.OUTPUT_LINES and fenced[-1].startswith("... (")
    assert max(len(line) for line in body.splitlines() if not line.startswith("- [")) <= upstream_body.OUTPUT_WIDTH
    assert "stand-in" not in body and "- [ ] Format your code according to pre-commit (not run)." in body


@pytest.mark.parametrize("word", ["witness", "rendition", "pin", "stand-in", "lock", "sglpatch", "nox"])
def test_a_body_in_this_projects_words_is_refused(word):
    with pytest.raises(SglpatchError, match=f"'{word}' is this project's word"):
        upstream_body.render_body(f"Problem: the {word} says so.", files=[], tests=[], run=None, matrix=[], hooks=HOOKS_RAN)


SPLIT = """Two things.

== a: [AMD] First ==

Problem: one.

== b: [AMD] Second ==

Problem: two."""


def test_pr_split_trailers_cut_a_patch_into_its_parts_by_file():
    parts = upstream_split.pr_parts("p.patch", "subject", SPLIT, [("PR-Split", "a: x.py, test/t.py"), ("PR-Split", "b: y.py")],
                                    ["x.py", "y.py"], ["test/t.py"])
    assert [(p.name, p.title, p.text, p.paths) for p in parts] == [
        ("a", "[AMD] First", "Problem: one.", ("x.py", "test/t.py")), ("b", "[AMD] Second", "Problem: two.", ("y.py",))]
    diff = "diff --git a/x.py b/x.py\n+1\ndiff --git a/y.py b/y.py\n+2\n"
    assert upstream_split.part_diff(diff, parts[1]) == "diff --git a/y.py b/y.py\n+2\n"
    assert upstream_split.select_parts("p.patch", parts, "b") == [parts[1]]
    with pytest.raises(SglpatchError, match=r"^p.patch: no pull request part 'c' \(its parts: a, b\)$"):
        upstream_split.select_parts("p.patch", parts, "c")


@pytest.mark.parametrize("trailers, problem", [
    ([("PR-Split", "a: x.py")], "section '== b: ... ==' has no PR-Split trailer"),
    ([("PR-Split", "a: x.py"), ("PR-Split", "b: x.py")], "x.py is in both PR-Split a and b"),
    ([("PR-Split", "a: x.py"), ("PR-Split", "b: z.py")], "y.py is in no PR-Split part"),
    ([("PR-Split", "a x.py")], "is not 'NAME: PATH"),
])
def test_a_malformed_split_is_one_line_naming_the_patch(trailers, problem):
    with pytest.raises(SglpatchError, match=r"^p\.patch: .*" + problem.replace("(", r"\(").replace(".", r"\.")):
        upstream_split.pr_parts("p.patch", "subject", SPLIT, trailers, ["x.py", "y.py"], [])


def test_an_unsplit_patch_is_one_pull_request_with_its_subject():
    [part] = upstream_split.pr_parts("p.patch", "[Quark] Fix", "Problem: x.", [("Witness", "w")], ["x.py"], ["t.py"])
    assert (part.name, part.title, part.carries("anything")) == ("", "[Quark] Fix", True)


def test_what_a_cpu_run_rested_on_is_said_in_plain_words():
    said = upstream_body.short_output("3 passed (test_x.py 3 run) [doubles: emulated gfx950 node; stand-ins aiter, "
                                      "sgl_kernel; called: none]")
    assert " ".join(said) == ("3 passed (test_x.py 3 run) (on CPU with gfx950 emulated and test doubles for aiter, "
                              "sgl_kernel (none of them called))")


def test_no_paragraph_is_re_cased_a_name_or_a_path_stays_as_written():
    message = ("Problem: parse_connector_type(\"s3://bucket\") returns the scheme only.\n\n"
               "Testing: test/registered/unit/utils/test_connector.py fails before, passes after.\n\nRelated: none.")
    parts = upstream_body.paragraphs(message)
    assert parts["Problem"] == ['parse_connector_type("s3://bucket") returns the scheme only.']
    assert parts["Testing"] == ["test/registered/unit/utils/test_connector.py fails before, passes after."]
    body = upstream_body.render_body(message, files=[], tests=[], run=None, matrix=[], hooks=None)
    assert "Parse_connector_type" not in body and "Test/registered" not in body


def test_a_message_without_related_work_is_refused_in_one_line_naming_it():
    with pytest.raises(SglpatchError, match=r"^0002-x.patch \(fp8\): its message has no 'Related:' paragraph"):
        upstream_body.require_related("0002-x.patch (fp8)", "Problem: a.\n\nFix: b.\n\nTesting: c.")
    upstream_body.require_related("0002-x.patch", MESSAGE)


def _plain(output: str, code: int, replayed: str = "") -> PlainRun:
    return PlainRun("python3 test/registered/unit/test_x.py", code, output, "Python 3.11, torch 2.13.0+cpu", replayed)


IMPORT_ERROR = "\n".join([f"  File \"python/sglang/m{n}.py\", line {n}, in <module>" for n in range(20)]
                         + ["ModuleNotFoundError: No module named 'torchvision'"]) + "\n"


def test_what_the_command_printed_is_shown_trimmed_and_said_so_with_the_emulated_run_labelled_apart():
    run = upstream_body.TestRun("python3 test/registered/unit/test_x.py",
                                WitnessResult("t", BUG, "unittest gfx950", "1 failed assertion(s) in 3 tests (test_x.py 3 run): "
                                              "T.test_a: AssertionError: 'bfloat16' != 'fp8_e4m3' [doubles: emulated "
                                              "gfx950 node; stand-ins torchvision, sgl_kernel; called: none]"),
                                WitnessResult("t", CLEAN, "unittest gfx950", "3 passed (test_x.py 3 run) [doubles: emulated "
                                              "gfx950 node; stand-ins torchvision, sgl_kernel; called: none]"),
                                plain_before=(_plain(IMPORT_ERROR, 1),), plain_after=(_plain(IMPORT_ERROR, 1),))
    body = upstream_body.render_body(MESSAGE, files=[], tests=["test/registered/unit/test_x.py"], run=run, matrix=[],
                                     hooks=HOOKS_RAN)
    said = " ".join(body.split("```bash\npython3 test/registered/unit/test_x.py\n```\n\n")[1].split("\n\n```")[0].split())
    assert said == ("Run as shown from the repository root on a CPU-only machine (Python 3.11, torch 2.13.0+cpu; "
                    "`python/` on `PYTHONPATH` in place of `pip install -e python`), it printed the same without and "
                    "with the change (trimmed: the last 8 of its 21 lines):")
    shown = body.split(said.split()[-1] + "\n\n```\n")[1].split("\n```")[0].splitlines()
    assert shown == IMPORT_ERROR.splitlines()[-8:] and shown[-1] == "ModuleNotFoundError: No module named 'torchvision'"
    label = ("The command stopped before running the tests here, so the verdicts rest on the same test file run "
             "in-process, on CPU with gfx950 emulated and test doubles for torchvision, sgl_kernel (none of them called):")
    assert label in " ".join(body.split())
    assert "without the change: fails: 1 failed assertion(s) in 3 tests" in body
    assert "with the change: passes: 3 passed (test_x.py 3 run)" in body and "[doubles" not in body


def test_a_command_that_ran_shows_its_own_before_and_after_and_replays_are_marked():
    failed = "F..\n" + "-" * 70 + "\nRan 3 tests in 0.010s\n\nFAILED (failures=1)\n"
    passed = "...\n" + "-" * 70 + "\nRan 3 tests in 0.010s\n\nOK\n"
    run = upstream_body.TestRun("python3 test/registered/unit/test_x.py",
                                WitnessResult("t", BUG, "unittest", "1 failed assertion(s) in 3 tests",
                                              replayed="answer stored 2026-12-01T10:00:00Z"),
                                WitnessResult("t", CLEAN, "unittest", "3 passed"),
                                plain_before=(_plain(failed, 1, "a stored run of 2026-12-01 10:00 UTC"),),
                                plain_after=(_plain(passed, 0),))
    assert run.plain_before[0].ran_tests and not run.plain_before[0].passed and run.plain_after[0].passed
    body = upstream_body.render_body(MESSAGE, files=[], tests=["t.py"], run=run, matrix=[], hooks=None)
    flat = " ".join(body.split())
    assert ("without the change it printed (all 5 lines) (replayed: a stored result of 2026-12-01 10:00 UTC, not run "
            "again):") in flat
    assert "With the change it printed (all 5 lines):" in flat
    assert body.count("FAILED (failures=1)") == 1 and "\nOK\n```" in body
    assert "The verdicts here rest on the same tests run in-process, on CPU:" in flat
    assert ("without the change (replayed: a stored result of 2026-12-01T10:00:00Z, not run again): fails: 1 failed "
            "assertion(s) in 3 tests") in flat
    assert "with the change: passes: 3 passed" in flat


def _unittest_report(failed: int, passed: int) -> str:
    """What unittest prints for ``failed`` tests that raised and ``passed`` that did not, each
    failure's traceback twenty lines long, as sglang's CustomTestCase retries print them."""
    out = ["E" * failed + "." * passed]
    for n in range(failed):
        out += ["=" * 70, f"ERROR: test_{n} (__main__.T.test_{n})", "-" * 70, "Traceback (most recent call last):",
                *[f'  File "python/sglang/m{k}.py", line {k}, in f' for k in range(18)],
                f"AssertionError: case {n} is wrong", "", "During handling of the above exception, another exception "
                "occurred:", "", "Exception: retry() exceed maximum number of retries.", ""]
    out += ["-" * 70, f"Ran {failed + passed} tests in 0.300s", "", f"FAILED (errors={failed})"]
    return "\n".join(out) + "\n"


def test_a_long_failed_run_shows_each_failed_test_and_its_assertion_then_the_summary():
    run = upstream_body.TestRun("python3 t.py", None, None, plain_before=(_plain(_unittest_report(2, 5), 1),),
                                plain_after=(_plain("...\n" + "-" * 70 + "\nRan 7 tests in 0.1s\n\nOK\n", 0),))
    body = upstream_body.render_body(MESSAGE, files=[], tests=["t.py"], run=run, matrix=[], hooks=None)
    flat = " ".join(body.split())
    assert ("without the change it printed (excerpt of its 61 lines: each failed test's line and its assertion, "
            "then the last 3):") in flat
    shown = body.split("then the last 3):\n\n```\n")[1].split("\n```")[0].splitlines()
    assert shown == ["ERROR: test_0 (__main__.T.test_0)", "AssertionError: case 0 is wrong",
                     "ERROR: test_1 (__main__.T.test_1)", "AssertionError: case 1 is wrong",
                     "Ran 7 tests in 0.300s", "", "FAILED (errors=2)"]


def test_a_run_with_more_failures_than_the_body_holds_says_how_many_it_shows():
    run = upstream_body.TestRun("python3 t.py", None, None, plain_before=(_plain(_unittest_report(14, 6), 1),),
                                plain_after=(_plain("OK\n", 0),))
    body = upstream_body.render_body(MESSAGE, files=[], tests=["t.py"], run=run, matrix=[], hooks=None)
    assert "the first 8 of 14 failed tests' lines and their assertions, then the last 3" in " ".join(body.split())
    assert "AssertionError: case 7 is wrong" in body and "case 8 is wrong" not in body


def test_a_printed_line_too_long_for_the_body_is_cut_and_said_so():
    long = "AssertionError: " + "x" * 400
    run = upstream_body.TestRun("python3 t.py", None, None, plain_before=(_plain(long + "\n", 1),),
                                plain_after=(_plain("OK\n", 0),))
    body = upstream_body.render_body(MESSAGE, files=[], tests=["t.py"], run=run, matrix=[], hooks=None)
    assert "without the change it printed (its one line; long lines cut at 200 characters):" in " ".join(body.split())
    assert max(len(line) for line in body.splitlines()) <= upstream_body.PLAIN_WIDTH


VERBOSE_REPORT = """check for broken symlinks............................(no files to check)Skipped
- hook id: check-symlinks
trim trailing whitespace.................................................Failed
- hook id: trailing-whitespace
- duration: 0.1s
- exit code: 1
- files were modified by this hook

Fixing test/registered/unit/test_x.py

codespell................................................................Failed
- hook id: codespell
- duration: 0.2s
- exit code: 65

test/registered/unit/test_x.py:6: recieve ==> receive
fmt..................................................(no files to check)Skipped
- hook id: fmt
"""


def test_pre_commits_verbose_report_is_read_hook_by_hook():
    from sglpatch.upstream.upstream_precommit import parse_run, rewritten_lines

    results = parse_run(VERBOSE_REPORT)
    assert [(r.id, r.status, r.modified) for r in results] == [
        ("check-symlinks", "Skipped", False), ("trailing-whitespace", "Failed", True), ("codespell", "Failed", False),
        ("fmt", "Skipped", False)]
    assert results[2].output == ["test/registered/unit/test_x.py:6: recieve ==> receive"]
    # git diff -U0: a changed line counts, an insertion counts at the lines either side of it.
    assert rewritten_lines("@@ -6 +6 @@\n-a  \n+a\n@@ -9,0 +10,2 @@\n+x\n+y\n") == {6, 9, 10}


def test_what_a_command_printed_is_never_reworded_nor_refused_for_its_words():
    printed = "Traceback (most recent call last):\nRuntimeError: the lock on pin 3 is held\n"
    run = upstream_body.TestRun("python3 t.py", None, None, plain_before=(_plain(printed, 1),),
                                plain_after=(_plain(printed, 1),))
    body = upstream_body.render_body(MESSAGE, files=[], tests=["t.py"], run=run, matrix=[], hooks=None)
    assert "RuntimeError: the lock on pin 3 is held" in body
    with pytest.raises(SglpatchError, match="'lock' is this project's word"):
        upstream_body.render_body(MESSAGE.replace("remap it.", "remap it under the lock."), files=[], tests=["t.py"],
                                  run=run, matrix=[], hooks=None)
