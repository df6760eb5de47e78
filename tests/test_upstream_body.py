"""A pull request's body in sglang's template, from a patch message's labelled paragraphs, and the
PR-Split parts of a patch."""

from __future__ import annotations

import pytest

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.upstream import upstream_body, upstream_split
from sglpatch.witnesses.results import BUG, CLEAN, WitnessResult

MESSAGE = """Problem: the draft fails to load.

Cause: the exclude list is not remapped.

Fix: remap it.

Testing: on CPU with gfx950 emulated.

Bench: serve it twice and measure:

    python -m sglang.benchmark.serving --backend sglang \\
        --max-concurrency 1"""


def _run():
    long_line = "; ".join(f"case {n}: module {n} QuarkW4A4MXFP4/shape-mismatch" for n in range(40))
    return upstream_body.TestRun("python3 test/registered/unit/test_x.py",
                                 WitnessResult("mtp", BUG, "build", long_line + " [doubles: stand-ins aiter]"),
                                 WitnessResult("mtp", CLEAN, "build", "every module unquantized"))


def test_the_body_has_the_templates_sections_filled_from_the_labelled_paragraphs():
    body = upstream_body.render_body(MESSAGE, files=["python/sglang/a.py"], tests=["test/registered/unit/test_x.py"],
                                     run=_run(), matrix=["| 0.5.23 | bug [x] | clean [x] |"], hooks_clean=True)
    sections = [line for line in body.splitlines() if line.startswith("## ")]
    assert sections == ["## Motivation", "## Modifications", "## Accuracy Tests", "## Speed Tests and Profiling", "## Checklist"]
    motivation, rest = body.split("## Modifications")
    assert "The draft fails to load." in motivation and "The exclude list is not remapped." in motivation
    assert "Remap it." in rest.split("## Accuracy Tests")[0]
    assert "```bash\npython -m sglang.benchmark.serving --backend sglang \\\n    --max-concurrency 1\n```" in body
    assert "| 0.5.23 | fails [x] | passes [x] |" in body
    assert "Not measured on MI355X." in body and "- [x] Add unit tests" in body and "- [x] Format your code" in body


def test_a_checks_long_output_is_shown_short_and_in_upstreams_words():
    body = upstream_body.render_body(MESSAGE, files=[], tests=[], run=_run(), matrix=[], hooks_clean=False)
    fenced = body.split("Without the change it fails:\n\n```\n")[1].split("```")[0].splitlines()
    assert len(fenced) == upstream_body.OUTPUT_LINES and fenced[-1].startswith("... (")
    assert max(len(line) for line in body.splitlines() if not line.startswith("- [")) <= upstream_body.OUTPUT_WIDTH
    assert "stand-in" not in body and "- [ ] Format your code" in body


@pytest.mark.parametrize("word", ["witness", "rendition", "pin", "stand-in", "lock", "sglpatch", "nox"])
def test_a_body_in_this_projects_words_is_refused(word):
    with pytest.raises(SglpatchError, match=f"'{word}' is this project's word"):
        upstream_body.render_body(f"Problem: the {word} says so.", files=[], tests=[], run=None, matrix=[], hooks_clean=True)


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
