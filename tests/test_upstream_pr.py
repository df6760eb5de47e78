"""Preparing a patch as an upstream PR against a git base made in the test."""

from __future__ import annotations

import pytest

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import TEST_WITNESSES, TextWitness, example_lines, format_patch, git, tree_files
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.upstream import upstream_commit, upstream_plain_run, upstream_pr
from sglpatch.witnesses import answer_cache, registry
from sglpatch.witnesses.results import BUG, CLEAN, WitnessResult
from sglpatch.witnesses.upstream_test import UpstreamTestWitness

KERNEL = "python/sglang/jit_kernel/csrc/kernel.cuh"
BODY = """Problem: the kernel does not build on ROCm.

Cause: it includes the CUDA runtime unconditionally.

Fix: guard the include.

Testing: python3 test/registered/unit/jit_kernel/test_kernel_rocm_guard.py on CPU.

Related: builds on https://github.com/sgl-project/sglang/pull/23456, which guarded the other
kernels; sgl-project/sglang#24680 reports this one."""

SECTIONS_WITH_RELATED = ["## Motivation", "## Modifications", "## Related upstream work", "## Accuracy Tests",
                         "## Speed Tests and Profiling", "## Checklist"]


def _export(project, repo, tmp_path, **kwargs):
    # sglang's pre-commit hooks are tested on their own below (they install from the package index).
    return upstream_pr.export(project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out",
                              hooks=kwargs.pop("hooks", False), **kwargs)


def _base_repo(tmp_path, kernel_text=None):
    repo = tmp_path / "my-sglang"
    files = tree_files("0.1.0")
    if kernel_text is not None:
        files[KERNEL] = kernel_text
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=u", "-c", "user.email=u@e", "commit", "-q", "-m", "upstream main")
    return repo


@pytest.fixture
def guard_project(fake_project, tmp_path):
    files = tree_files("0.1.0")
    guarded = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    patch = format_patch(
        tmp_path, files, {KERNEL: guarded}, "kernel: guard the CUDA runtime include", trailers={"Witness": "guard-text"}, body=BODY
    )
    fake_project.set_patches([("0001-guard.patch", patch)])
    return fake_project


def test_export_makes_a_branch_an_mbox_and_the_pr_body(guard_project, tmp_path):
    repo = _base_repo(tmp_path)
    [result] = _export(guard_project.project, repo, tmp_path)
    assert git(repo, "rev-parse", "sglpatch-upstream/0001-guard").strip() == result.commit
    assert git(repo, "log", "-1", "--format=%s%n%an <%ae>", result.commit).splitlines() == [
        "kernel: guard the CUDA runtime include",
        "Patch Author <author@example.com>",
    ]
    assert "#ifndef USE_ROCM" in git(repo, "show", f"{result.commit}:{KERNEL}")
    assert result.mbox.read_text().startswith("From " + result.commit)
    body = result.body.read_text()
    assert [line for line in body.splitlines() if line.startswith("## ")] == SECTIONS_WITH_RELATED
    motivation = body.split("## Modifications")[0]
    # The message's words as written: no paragraph is re-cased.
    assert "the kernel does not build on ROCm." in motivation and "it includes the CUDA runtime unconditionally." in motivation
    assert "guard the include." in body.split("## Modifications")[1].split("## Related upstream work")[0]
    assert "python3 test/registered/unit/jit_kernel/test_kernel_rocm_guard.py on CPU." in body
    related = body.split("## Related upstream work\n\n")[1].split("## ")[0]
    assert related.split() == ("builds on #23456, which guarded the other kernels; #24680 reports this one.").split()
    assert "Without the change it fails:\n\n```\n'#ifndef USE_ROCM' in python/sglang/jit_kernel/csrc/kernel.cuh\n```" in body
    assert "With the change it passes:" in body and "Not measured on MI355X." in body
    assert "Upstream-Status" not in body and "Applies-To" not in body and "witness" not in body.lower()
    assert max(len(line) for line in body.splitlines()) <= 140


def test_export_refuses_a_base_that_already_has_the_patch(guard_project, tmp_path):
    guarded = tree_files("0.1.0")[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    repo = _base_repo(tmp_path, guarded)
    with pytest.raises(SglpatchError, match="already upstream at main .* reverse-applies"):
        _export(guard_project.project, repo, tmp_path)
    assert "sglpatch-upstream" not in git(repo, "branch")


def test_export_refuses_a_base_where_the_witness_already_passes(guard_project, tmp_path):
    fixed_differently = "#pragma once\n#include <algorithm>\n#include <cuda_runtime.h>\n\nvoid f();\n// #ifndef USE_ROCM handled elsewhere\n"
    repo = _base_repo(tmp_path, fixed_differently)
    with pytest.raises(SglpatchError, match="not needed at main .* witness guard-text already passes"):
        _export(guard_project.project, repo, tmp_path)


def test_range_diff_is_included_in_the_body_when_asked(guard_project, tmp_path):
    repo = _base_repo(tmp_path)
    [result] = upstream_pr.export(guard_project.project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out",
                                  hooks=False, range_diff="series v1 -> v2 on sglang 0.1.0\n1:  abc ! 1:  def kernel: guard")
    body = result.body.read_text()
    assert body.endswith("## Changes since the previous version of this series\n\n```\nseries v1 -> v2 on sglang 0.1.0\n"
                         "1:  abc ! 1:  def kernel: guard\n```\n")


def test_open_pr_refuses_plainly_without_gh(guard_project, tmp_path, monkeypatch):
    repo = _base_repo(tmp_path)
    [result] = _export(guard_project.project, repo, tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(SglpatchError, match="gh CLI is not installed"):
        upstream_commit.open_pull_request(result)


def test_open_pr_hands_title_body_and_branch_to_gh(guard_project, tmp_path, monkeypatch):
    # A stand-in for GitHub's gh CLI, which cannot reach GitHub from here: it records its arguments.
    fake_bin = tmp_path / "fake-gh-bin"
    fake_bin.mkdir()
    record = tmp_path / "gh-args"
    (fake_bin / "gh").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\necho https://github.com/o/r/pull/1\n')
    (fake_bin / "gh").chmod(0o755)
    repo = _base_repo(tmp_path)
    [result] = _export(guard_project.project, repo, tmp_path)
    monkeypatch.setenv("PATH", f"{fake_bin}:/usr/bin:/bin")
    assert upstream_commit.open_pull_request(result, "me:sglpatch-upstream/0001-guard") == "https://github.com/o/r/pull/1"
    assert record.read_text().splitlines() == [
        "pr", "create", "--repo", "sgl-project/sglang", "--base", "main", "--title", "kernel: guard the CUDA runtime include", "--body-file", str(result.body),
        "--head", "me:sglpatch-upstream/0001-guard",
    ]


def _trailered_project(fake_project, tmp_path):
    files = tree_files("0.1.0")
    guarded = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    trailers = {"Witness": "guard-text", "Bug": "https://example.com/issue/1", "Fixed-Upstream-In": "0.9 (not yet)",
                "Origin": "sglpatch; written for a bring-up"}
    patch = format_patch(tmp_path, files, {KERNEL: guarded}, "kernel: guard the CUDA runtime include", trailers=trailers, body=BODY)
    fake_project.set_patches([("0001-guard.patch", patch)])
    return fake_project


def test_upstream_sees_a_clean_commit_without_our_trailers(fake_project, tmp_path):
    project = _trailered_project(fake_project, tmp_path).project
    repo = _base_repo(tmp_path)
    [result] = _export(project, repo, tmp_path)
    message = git(repo, "log", "-1", "--format=%B", result.commit)
    mbox = result.mbox.read_text()
    for trailer in ("Upstream-Status", "Witness", "Applies-To", "Fixed-Upstream-In", "Origin", "Bug"):
        assert f"{trailer}:" not in message and f"{trailer}:" not in mbox
    assert message.startswith("kernel: guard the CUDA runtime include\n\nProblem: the kernel does not build on ROCm.")
    assert "Signed-off-by" not in message


def test_signoff_adds_the_users_own_identity(fake_project, tmp_path):
    project = _trailered_project(fake_project, tmp_path).project
    repo = _base_repo(tmp_path)
    git(repo, "config", "user.name", "Rocm Engineer")
    git(repo, "config", "user.email", "eng@example.com")
    [result] = upstream_pr.export(project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out", signoff=True,
                                  hooks=False)
    message = git(repo, "log", "-1", "--format=%B%n%cn <%ce>", result.commit)
    assert "Signed-off-by: Rocm Engineer <eng@example.com>" in message
    assert message.strip().endswith("Rocm Engineer <eng@example.com>")  # committed by the user too
    assert "Signed-off-by: Rocm Engineer <eng@example.com>" in result.mbox.read_text()


def test_an_existing_branch_with_other_content_is_refused_not_overwritten(guard_project, tmp_path):
    repo = _base_repo(tmp_path)
    git(repo, "branch", "sglpatch-upstream/0001-guard", "main")  # the user's own work under that name
    before = git(repo, "rev-parse", "sglpatch-upstream/0001-guard").strip()
    with pytest.raises(SglpatchError, match="already exists .* with other content; .* not overwritten"):
        _export(guard_project.project, repo, tmp_path)
    assert git(repo, "rev-parse", "sglpatch-upstream/0001-guard").strip() == before


def test_exporting_twice_keeps_the_branch(guard_project, tmp_path):
    repo = _base_repo(tmp_path)
    [first] = _export(guard_project.project, repo, tmp_path)
    [second] = _export(guard_project.project, repo, tmp_path)
    assert git(repo, "rev-parse", "sglpatch-upstream/0001-guard").strip() == first.commit == second.commit


def test_export_refuses_when_the_witness_cannot_run(fake_project, tmp_path):
    files = tree_files("0.1.0")
    guarded = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    patch = format_patch(tmp_path, files, {KERNEL: guarded}, "kernel: guard", body=BODY)  # fixture-unwitnessed
    fake_project.set_patches([("0001-guard.patch", patch)])
    repo = _base_repo(tmp_path)
    with pytest.raises(SglpatchError, match="could not run at main .* nothing was exported"):
        _export(fake_project.project, repo, tmp_path)
    assert "sglpatch-upstream" not in git(repo, "branch")


@pytest.mark.parametrize("asked", ["0001", "1", "0001-guard", "0001-guard.patch"])
def test_upstream_takes_a_patch_by_its_number_or_its_name(guard_project, tmp_path, asked, capsys):
    from sglpatch import cli

    repo = _base_repo(tmp_path)
    argv = ["--root", str(guard_project.root), "upstream", asked, "--base", "main", "--base-repo", str(repo),
            "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 0, capsys.readouterr()
    assert git(repo, "rev-parse", "--verify", "sglpatch-upstream/0001-guard").strip()


def test_upstream_without_a_patch_lists_the_series_patch_names_and_exits_0(guard_project, capsys):
    from sglpatch import cli

    assert cli.main(["--root", str(guard_project.root), "upstream"]) == 0
    assert "  0001-guard.patch" in capsys.readouterr().out


def test_a_patch_already_upstream_is_nothing_to_send_and_exits_0(guard_project, tmp_path, capsys):
    from sglpatch import cli

    guarded = tree_files("0.1.0")[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    repo = _base_repo(tmp_path, guarded)
    argv = ["--root", str(guard_project.root), "upstream", "0001", "--base", "main", "--base-repo", str(repo)]
    assert cli.main(argv) == 0
    said = capsys.readouterr()
    assert "0001-guard.patch: already upstream at main" in said.out and "nothing to send" in said.out
    assert "sglpatch-upstream" not in git(repo, "branch")


def test_a_message_without_a_related_paragraph_is_refused_naming_the_patch(fake_project, tmp_path):
    files = tree_files("0.1.0")
    guarded = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    body = BODY.split("\n\nRelated:")[0]
    patch = format_patch(tmp_path, files, {KERNEL: guarded}, "kernel: guard", trailers={"Witness": "guard-text"}, body=body)
    fake_project.set_patches([("0001-guard.patch", patch)])
    repo = _base_repo(tmp_path)
    with pytest.raises(SglpatchError, match=r"^0001-guard.patch: its message has no 'Related:' paragraph .*add one after 'Testing:'$"):
        _export(fake_project.project, repo, tmp_path)
    assert "sglpatch-upstream" not in git(repo, "branch") and not (tmp_path / "out").exists()


def test_a_patch_number_that_names_none_or_several_is_refused_naming_the_series(fake_project, tmp_path):
    files = tree_files("0.1.0")
    one = format_patch(tmp_path, files, {KERNEL: files[KERNEL] + "// one\n"}, "kernel: one")
    fake_project.set_patches([("0001-one.patch", one), ("01-again.patch", one), ("0002-two.patch", one)])
    series = fake_project.project.series()
    assert series.get("2").name == series.get("0002").name == "0002-two.patch"
    with pytest.raises(SglpatchError, match="'1' names several patches: 0001-one.patch, 01-again.patch"):
        series.get("1")
    with pytest.raises(SglpatchError, match="no patch named '7'; the series has 0001-one.patch, 01-again.patch, 0002-two.patch"):
        series.get("7")


TEST_FILE = "test/registered/unit/jit_kernel/test_kernel_rocm_guard.py"
TEST_TEXT = """import unittest


class TestGuard(unittest.TestCase):
    def test_the_cuda_runtime_include_is_guarded(self):
        with open("python/sglang/jit_kernel/csrc/kernel.cuh") as f:
            self.assertIn("#ifndef USE_ROCM", f.read())


if __name__ == "__main__":
    unittest.main()
"""


class PlainUnittest(UpstreamTestWitness):
    """Test double for the ``upstream-test`` witness on the fake releases, which are no sglang (no
    CPU Python, no CI collector): the patch's real test files, each run by ``python3 FILE`` at the
    tree's root; bug when one fails, clean when all pass."""

    version = "test-double"
    probe_request = None  # not a CPU probe: answer_cache calls run()

    def fingerprint(self, pin) -> str:
        return "plain-" + "-".join(f"{t.path}:{hash(t.file.read_text())}" for t in self.tests)

    def run(self, tree, pin) -> WitnessResult:
        said = []
        for test in self.tests:
            done = subprocess.run([sys.executable, str(test.file)], cwd=tree, capture_output=True, text=True,
                                  env={"PATH": os.environ["PATH"]})
            if done.returncode:
                raised = [line for line in done.stderr.splitlines() if line.startswith(("AssertionError", "FileNotFound"))]
                said.append(f"{Path(test.path).name}: " + (raised or done.stderr.strip().splitlines())[-1])
        if said:
            return WitnessResult(self.name, BUG, "unittest", "; ".join(said))
        return WitnessResult(self.name, CLEAN, "unittest", f"{len(self.tests)} file(s) passed")


def this_python_for_the_fake_releases(pin) -> upstream_plain_run.Interpreter:
    """Test double for a release's CPU Python: the fake releases are no sglang and have none, so
    the command shown runs in the interpreter running the tests (the real one: the network tests)."""
    return upstream_plain_run.Interpreter(Path(sys.executable).parent, f"Python {sys.version_info.major}."
                                          f"{sys.version_info.minor}", f"test-double-{sys.executable}")


@pytest.fixture
def plain_unittest(monkeypatch):
    monkeypatch.setattr(registry, "UpstreamTestWitness", PlainUnittest)
    monkeypatch.setattr(upstream_plain_run, "release_interpreter", this_python_for_the_fake_releases)


def _block_after(body: str, label: str) -> list[str]:
    """The lines of the code block that follows the paragraph ending in ``label ...:``."""
    after = body.split(label, 1)[1].split("```\n", 1)[1]
    return after.split("\n```", 1)[0].splitlines()


def test_the_branch_sits_on_the_clones_later_commit_and_carries_the_patchs_test(guard_project, tmp_path, plain_unittest):
    # A clone with real history: the release's files as a tagged commit, then a later upstream
    # commit that touches the very file the patch edits.
    repo = _base_repo(tmp_path)
    git(repo, "tag", "v0.1.0")
    kernel = repo / KERNEL
    kernel.write_text(kernel.read_text() + "// a later upstream change\n")
    git(repo, "-c", "user.name=u", "-c", "user.email=u@e", "commit", "-q", "-am", "later upstream work")
    later = git(repo, "rev-parse", "main").strip()
    tests = guard_project.project.patches_dir / "tests" / "0001-guard"
    (tests / TEST_FILE).parent.mkdir(parents=True)
    (tests / TEST_FILE).write_text(TEST_TEXT)
    [result] = _export(guard_project.project, repo, tmp_path)
    assert git(repo, "rev-parse", f"{result.commit}^").strip() == later
    assert git(repo, "merge-base", "--is-ancestor", "v0.1.0", result.commit) == ""
    shown = git(repo, "show", f"{result.commit}:{KERNEL}")
    assert "#ifndef USE_ROCM" in shown and "// a later upstream change" in shown
    assert git(repo, "show", f"{result.commit}:{TEST_FILE}") == TEST_TEXT
    assert git(repo, "diff", "--name-status", later, result.commit).splitlines() == [f"M\t{KERNEL}", f"A\t{TEST_FILE}"]
    body = result.body.read_text()
    assert f"```bash\npython3 {TEST_FILE}\n```" in body and f"- `{TEST_FILE}` (new regression test)" in body
    assert result.tests == (TEST_FILE,)
    # Under the command, what that command printed: unittest's own words, failing without the
    # change and passing with it; the run the export judged by is a line of its own.
    without = _block_after(body, "without the change it printed")
    assert without[-1] == "FAILED (failures=1)" and any("AssertionError: '#ifndef USE_ROCM' not found" in l for l in without)
    assert _block_after(body, "With the change it printed")[-1] == "OK"
    assert "(excerpt of its 13 lines: each failed test's line and its assertion, then the last 3)" in " ".join(body.split())
    assert "The verdicts here rest on the same tests run in-process, on CPU:" in body
    assert "without the change: fails: test_kernel_rocm_guard.py: AssertionError: '#ifndef USE_ROCM' not found" in body
    assert "with the change: passes: 1 file(s) passed" in body
    assert "replayed" not in body


SPLIT_BODY = """Two changes.

== guard: [AMD] Guard the CUDA runtime include ==

Problem: the kernel does not build on ROCm.

Fix: guard the include.

Related: #23456 guarded the other kernels.

== note: [AMD] Say why in a comment ==

Problem: nobody knows why.

Fix: a comment.

Related: none found upstream."""


def _split_project(fake_project, tmp_path, trailers):
    files = tree_files("0.1.0")
    guarded = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    readme = "python/sglang/NOTE.md"
    patch = format_patch(tmp_path, files, {KERNEL: guarded, readme: "Why: ROCm.\n"}, "kernel: guard and say why",
                         trailers={"Witness": "guard-text", **trailers}, body=SPLIT_BODY)
    fake_project.set_patches([("0001-guard.patch", patch)])
    return fake_project.project, readme


def test_a_pr_split_patch_leaves_as_one_pull_request_per_part(fake_project, tmp_path):
    project, readme = _split_project(fake_project, tmp_path, {"PR-Split": f"guard: {KERNEL}"})
    # git interpret-trailers keeps one key per line: the second part is added by hand below.
    path = project.patches_dir / "0001-guard.patch"
    path.write_text(path.read_text().replace(f"PR-Split: guard: {KERNEL}\n", f"PR-Split: guard: {KERNEL}\nPR-Split: note: {readme}\n"))
    repo = _base_repo(tmp_path)
    guard, note = _export(project, repo, tmp_path)
    assert (guard.part, guard.title, note.part, note.title) == ("guard", "[AMD] Guard the CUDA runtime include",
                                                                 "note", "[AMD] Say why in a comment")
    base = git(repo, "rev-parse", "main").strip()
    assert git(repo, "diff", "--name-only", base, guard.commit).split() == [KERNEL]
    assert git(repo, "diff", "--name-only", base, note.commit).split() == [readme]
    # A part's branch is the patch's number and the part's name: a stem never repeats a part's words.
    assert (guard.branch, note.branch) == ("sglpatch-upstream/0001-guard", "sglpatch-upstream/0001-note")
    assert git(repo, "log", "-1", "--format=%B", note.commit).startswith("[AMD] Say why in a comment\n\nProblem: nobody knows why.")
    assert "PR-Split" not in guard.mbox.read_text() and "== guard" not in guard.mbox.read_text()
    assert "The test ran with the whole change applied, this pull request and: [AMD] Say why" in guard.body.read_text()
    [only] = upstream_pr.export(project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "o2", hooks=False,
                                part="note")
    assert only.commit == note.commit


NOTE_TEST = "test/registered/unit/test_note.py"
NOTE_TEXT = """import os
import unittest


class TestNote(unittest.TestCase):
    def test_the_note_says_why(self):
        self.assertTrue(os.path.exists("python/sglang/NOTE.md"), "no NOTE.md")


if __name__ == "__main__":
    unittest.main()
"""


def test_each_pr_split_part_carries_and_shows_its_own_test_run_on_its_own_commit(fake_project, tmp_path, plain_unittest):
    project, readme = _split_project(fake_project, tmp_path, {"PR-Split": f"guard: {KERNEL}, {TEST_FILE}"})
    path = project.patches_dir / "0001-guard.patch"
    path.write_text(path.read_text().replace(f"PR-Split: guard: {KERNEL}, {TEST_FILE}\n",
                                             f"PR-Split: guard: {KERNEL}, {TEST_FILE}\nPR-Split: note: {readme}, {NOTE_TEST}\n"))
    for name, text in ((TEST_FILE, TEST_TEXT), (NOTE_TEST, NOTE_TEXT)):
        (project.patches_dir / "tests" / "0001-guard" / name).parent.mkdir(parents=True, exist_ok=True)
        (project.patches_dir / "tests" / "0001-guard" / name).write_text(text)
    repo = _base_repo(tmp_path)
    guard, note = _export(project, repo, tmp_path)
    base = git(repo, "rev-parse", "main").strip()
    assert git(repo, "diff", "--name-only", base, guard.commit).split() == [KERNEL, TEST_FILE]
    assert git(repo, "diff", "--name-only", base, note.commit).split() == [readme, NOTE_TEST]
    assert (guard.tests, note.tests) == ((TEST_FILE,), (NOTE_TEST,))
    for result, test, other, needle in ((guard, TEST_FILE, NOTE_TEST, "'#ifndef USE_ROCM' not found"), (note, NOTE_TEST, TEST_FILE, "False is not true : no NOTE.md")):
        body = result.body.read_text()
        assert f"```bash\npython3 {test}\n```" in body and other not in body
        assert _block_after(body, "without the change it printed")[-1] == "FAILED (failures=1)"
        assert any(needle in line for line in _block_after(body, "without the change it printed"))
        assert _block_after(body, "With the change it printed")[-1] == "OK"
        assert f"without the change: fails: {Path(test).name}: AssertionError: {needle}" in body
        assert "whole change applied" not in body  # each part's test ran on that part's own commit


def test_a_pr_whose_test_already_passes_without_the_change_is_refused(guard_project, tmp_path, plain_unittest):
    tests = guard_project.project.patches_dir / "tests" / "0001-guard"
    (tests / TEST_FILE).parent.mkdir(parents=True)
    (tests / TEST_FILE).write_text(TEST_TEXT.replace('self.assertIn("#ifndef USE_ROCM", f.read())', "f.read()"))
    repo = _base_repo(tmp_path)
    with pytest.raises(SglpatchError, match=r"^0001-guard.patch: its regression test \(test_kernel_rocm_guard.py\) passes "
                                            r"without the change at main .*so it shows no bug there"):
        _export(guard_project.project, repo, tmp_path)
    assert "sglpatch-upstream" not in git(repo, "branch")


def test_a_file_in_no_pr_split_part_is_refused_in_one_line(fake_project, tmp_path):
    project, readme = _split_project(fake_project, tmp_path, {"PR-Split": f"guard: {KERNEL}"})
    repo = _base_repo(tmp_path)
    with pytest.raises(SglpatchError, match=r"^0001-guard.patch: section '== note: \.\.\. ==' has no PR-Split trailer$"):
        _export(project, repo, tmp_path)
    assert "sglpatch-upstream" not in git(repo, "branch")


@pytest.mark.network
def test_without_a_clone_config_the_pinned_formatters_refuse_a_misspelt_unformatted_line_and_pass_a_clean_one(fake_project, tmp_path,
                                                                                             monkeypatch):
    from conftest import _import_with_this_python
    from sglpatch.rebase.trial import Trial

    # The hooks need the network (the test is marked so); the fake release is no sglang, so the
    # judge's import smoke is the fake releases' test double, as in the tests without network.
    monkeypatch.setattr(Trial, "import_smoke", _import_with_this_python)
    files = tree_files("0.1.0")
    module = "python/sglang/srt/layers/new_module.py"
    bad = 'import os\nimport sys\n\n\ndef f( x ):\n    # recieve it\n    return x\n'
    guarded = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    patch = format_patch(tmp_path, files, {KERNEL: guarded, module: bad}, "add a module", trailers={"Witness": "guard-text"},
                         body=BODY)
    fake_project.set_patches([("0001-guard.patch", patch)])
    repo = _base_repo(tmp_path)
    with pytest.raises(SglpatchError) as refused:
        _export(fake_project.project, repo, tmp_path, hooks=True)
    lines = str(refused.value).splitlines()
    assert lines[0].startswith("0001-guard.patch: the pre-commit hooks refuse it")
    assert f"black: {module}:5: would reformat this line" in lines
    assert any(line.startswith(f"codespell: {module}:6: recieve ==> receive") for line in lines)
    assert "sglpatch-upstream" not in git(repo, "branch")
    fixed = 'import os\nimport sys\n\n\ndef f(x):\n    # receive it\n    return x\n'
    patch = format_patch(tmp_path, files, {KERNEL: guarded, module: fixed}, "add a module", trailers={"Witness": "guard-text"},
                         body=BODY)
    fake_project.set_patches([("0001-guard.patch", patch)])
    [result] = _export(fake_project.project, repo, tmp_path, hooks=True)
    # No clone config: the pinned formatters ran, and the body says which; the box stays empty.
    assert result.hooks.startswith("clean (isort, black, codespell, clang-format")
    assert ("- [ ] Format your code according to pre-commit (isort, black, codespell and clang-format at the versions "
            "sglang's `.pre-commit-config.yaml` names, on the lines this PR changes; its other hooks not run: the base has "
            "no `.pre-commit-config.yaml`).") in " ".join(result.body.read_text().split())


def test_a_clone_where_no_port_is_accepted_is_refused_with_the_hand_port_tree(fake_project, tmp_path, monkeypatch):
    example = "python/sglang/srt/layers/example.py"
    witness = TextWitness("example-patched", example, "patched")
    monkeypatch.setattr(registry, "registry", lambda: {**TEST_WITNESSES, witness.name: witness})
    patch = format_patch(tmp_path, tree_files("0.1.0"), {example: example_lines({20: "patched\n"})}, "example: patch line 20",
                         trailers={"Witness": witness.name}, body=BODY)
    fake_project.set_patches([("0001-guard.patch", patch)])
    # Upstream rewrote the very line the patch changes: every merge conflicts there.
    repo = _base_repo(tmp_path)
    (repo / example).write_text(example_lines({20: "upstream rewrote line 20\n"}))
    git(repo, "-c", "user.name=u", "-c", "user.email=u@e", "commit", "-q", "-am", "rewrite line 20")
    before = git(repo, "for-each-ref")
    with pytest.raises(SglpatchError, match=r"no port onto main .* finish it by hand in .*port/upstream-0001-guard"):
        _export(fake_project.project, repo, tmp_path)
    assert git(repo, "for-each-ref") == before and not (tmp_path / "out").exists()
    port = fake_project.project.build_dir / "port" / "upstream-0001-guard"
    assert "upstream rewrote line 20" in (port / example).read_text()


def test_a_split_part_is_named_by_the_patchs_number_and_the_parts_name_never_twice():
    stem = "0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default"
    assert upstream_commit.branch_name(stem, "fp8-kv-default") == "sglpatch-upstream/0003-fp8-kv-default"
    assert upstream_commit.branch_name(stem, "inert-fusion-warning") == "sglpatch-upstream/0003-inert-fusion-warning"
    assert upstream_commit.branch_name(stem) == f"sglpatch-upstream/{stem}"


def _placeholder_author(project) -> None:
    path = project.patches_dir / "0001-guard.patch"
    path.write_text(path.read_text().replace("From: Patch Author <author@example.com>", "From: sglpatch <sglpatch@localhost>"))


def test_a_series_patch_is_authored_and_committed_by_the_user_as_the_guide_says(guard_project, tmp_path):
    _placeholder_author(guard_project.project)
    repo = _base_repo(tmp_path)
    git(repo, "config", "user.name", "Rocm Engineer")
    git(repo, "config", "user.email", "eng@example.com")
    [result] = _export(guard_project.project, repo, tmp_path)
    assert git(repo, "log", "-1", "--format=%an <%ae>|%cn <%ce>", result.commit).strip() == (
        "Rocm Engineer <eng@example.com>|Rocm Engineer <eng@example.com>")


def test_without_a_git_identity_the_placeholder_author_is_refused_not_committed(guard_project, tmp_path, monkeypatch):
    _placeholder_author(guard_project.project)
    repo = _base_repo(tmp_path)
    home = tmp_path / "empty-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    with pytest.raises(SglpatchError, match=r"needs your git identity as its author and committer \(git -C .* config user.name"):
        _export(guard_project.project, repo, tmp_path)
    assert "sglpatch-upstream" not in git(repo, "branch")


def _report(project, digest: str) -> None:
    project.build_dir.mkdir(parents=True, exist_ok=True)
    (project.build_dir / "apply-report.json").write_text(json.dumps({
        "series": {"version": "1", "digest": digest},
        "pins": [{"version": "0.1.0", "patches": [{"name": "0001-guard.patch", "witness_before": "bug [text]",
                                                   "witness_after": "clean [text]"}]}]}))


def test_the_release_table_comes_only_from_an_apply_of_the_same_series(guard_project, tmp_path):
    project = guard_project.project
    repo = _base_repo(tmp_path)
    _report(project, project.series().digest())
    [same] = _export(project, repo, tmp_path)
    assert "| 0.1.0 | fails [text] | passes [text] |" in same.body.read_text()
    assert not any("table" in note for note in same.notes)
    _report(project, "0" * 64)  # an apply of another state of the series
    [other] = upstream_pr.export(project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "o2", hooks=False)
    assert "| 0.1.0 |" not in other.body.read_text() and "| sglang | without | with |" not in other.body.read_text()
    assert other.notes == ("the table of released versions is left out: build/apply-report.json is from another state "
                           "of the series (run sglpatch apply to make one of this state)",)


def test_a_test_whose_shown_command_passes_without_the_change_is_refused(guard_project, tmp_path, plain_unittest):
    # The in-process run (the double runs the file without HOME) fails without the change; the
    # command as shown (with a home of its own) passes there: the body would show a pass before.
    tests = guard_project.project.patches_dir / "tests" / "0001-guard"
    (tests / TEST_FILE).parent.mkdir(parents=True)
    (tests / TEST_FILE).write_text(TEST_TEXT.replace("        with open(", "        if 'HOME' in __import__('os').environ:\n"
                                                     "            return\n        with open("))
    repo = _base_repo(tmp_path)
    with pytest.raises(SglpatchError, match=rf"^0001-guard.patch: its regression test, run as `python3 {TEST_FILE}`, "
                                            r"passes without the change at main .*must fail before it$"):
        _export(guard_project.project, repo, tmp_path)
    assert "sglpatch-upstream" not in git(repo, "branch")


@pytest.fixture
def answers_marked_as_stored(monkeypatch):
    """Test double for the answer cache's replay mark (branch i35-witness makes answer_cache set
    ``WitnessResult.replayed`` on an answer kept by another process; until that is merged, and
    for a second export made in this same process, this wraps the lookup so a kept answer comes
    back marked, as a second ``sglpatch upstream`` gets it)."""
    real = answer_cache._load

    def marked(*args, **kwargs):
        found = real(*args, **kwargs)
        if found is not None and not found.replayed:
            return dataclasses.replace(found, replayed="stored answer of 2026-12-01T10:00:00Z")
        return found

    monkeypatch.setattr(answer_cache, "_load", marked)


def test_a_second_export_marks_every_block_it_did_not_run_again(guard_project, tmp_path, plain_unittest,
                                                                answers_marked_as_stored):
    tests = guard_project.project.patches_dir / "tests" / "0001-guard"
    (tests / TEST_FILE).parent.mkdir(parents=True)
    (tests / TEST_FILE).write_text(TEST_TEXT)
    repo = _base_repo(tmp_path)
    [first] = _export(guard_project.project, repo, tmp_path)
    assert "replayed" not in first.body.read_text() and not any("replayed" in n for n in first.notes)
    [second] = upstream_pr.export(guard_project.project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "o2",
                                  hooks=False)
    body = " ".join(second.body.read_text().split())
    assert second.commit == first.commit
    # What the command printed, and the in-process run: both blocks say they were not run again.
    assert "without the change it printed (excerpt of its 13 lines: each failed test's line and its assertion, then the last 3) (replayed: a stored result of " in body
    assert "With the change it printed (all 5 lines) (replayed: a stored result of " in body
    assert ("without the change (replayed: a stored result of 2026-12-01T10:00:00Z, not run again): fails: "
            "test_kernel_rocm_guard.py") in body
    assert "with the change (replayed: a stored result of 2026-12-01T10:00:00Z, not run again): passes" in body
    assert "4 of the results shown were replayed from stored runs (marked so in the body)" in second.notes
