"""Preparing a patch as an upstream PR against a git base made in the test."""

from __future__ import annotations

import pytest

from conftest import format_patch, git, tree_files
from sglpatch import upstream_pr
from sglpatch.errors import SglpatchError

KERNEL = "python/sglang/jit_kernel/csrc/kernel.cuh"
BODY = """Problem: the kernel does not build on ROCm.

Cause: it includes the CUDA runtime unconditionally.

Fix: guard the include."""

GOLDEN = """# kernel: guard the CUDA runtime include

Problem: the kernel does not build on ROCm.

Cause: it includes the CUDA runtime unconditionally.

Fix: guard the include.

## How it was tested

Witness `guard-text` on main ({commit}) of {repo}: without the patch bug [text] ('#ifndef USE_ROCM' in python/sglang/jit_kernel/csrc/kernel.cuh); with it clean [text] ('#ifndef USE_ROCM' in python/sglang/jit_kernel/csrc/kernel.cuh).
"""


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
    result = upstream_pr.export(guard_project.project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out")
    assert git(repo, "rev-parse", "sglpatch-upstream/0001-guard").strip() == result.commit
    assert git(repo, "log", "-1", "--format=%s%n%an <%ae>", result.commit).splitlines() == [
        "kernel: guard the CUDA runtime include",
        "Patch Author <author@example.com>",
    ]
    assert "#ifndef USE_ROCM" in git(repo, "show", f"{result.commit}:{KERNEL}")
    assert result.mbox.read_text().startswith("From " + result.commit)
    commit = git(repo, "rev-parse", "main").strip()[:12]
    assert result.body.read_text() == GOLDEN.format(commit=commit, repo=repo)
    assert "Upstream-Status" not in result.body.read_text() and "Applies-To" not in result.body.read_text()


def test_export_refuses_a_base_that_already_has_the_patch(guard_project, tmp_path):
    guarded = tree_files("0.1.0")[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    repo = _base_repo(tmp_path, guarded)
    with pytest.raises(SglpatchError, match="already upstream at main .* reverse-applies"):
        upstream_pr.export(guard_project.project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out")
    assert "sglpatch-upstream" not in git(repo, "branch")


def test_export_refuses_a_base_where_the_witness_already_passes(guard_project, tmp_path):
    fixed_differently = "#pragma once\n#include <algorithm>\n#include <cuda_runtime.h>\n\nvoid f();\n// #ifndef USE_ROCM handled elsewhere\n"
    repo = _base_repo(tmp_path, fixed_differently)
    with pytest.raises(SglpatchError, match="not needed at main .* witness guard-text already passes"):
        upstream_pr.export(guard_project.project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out")


def test_range_diff_is_included_in_the_body_when_asked(guard_project, tmp_path):
    repo = _base_repo(tmp_path)
    result = upstream_pr.export(guard_project.project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out",
                                range_diff="series v1 -> v2 on sglang 0.1.0\n1:  abc ! 1:  def kernel: guard")
    body = result.body.read_text()
    assert body.endswith("## Changes since the previous version of this series\n\n```\nseries v1 -> v2 on sglang 0.1.0\n"
                         "1:  abc ! 1:  def kernel: guard\n```\n")


def test_open_pr_refuses_plainly_without_gh(guard_project, tmp_path, monkeypatch):
    repo = _base_repo(tmp_path)
    result = upstream_pr.export(guard_project.project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(SglpatchError, match="gh CLI is not installed"):
        upstream_pr.open_pull_request(result)


def test_open_pr_hands_title_body_and_branch_to_gh(guard_project, tmp_path, monkeypatch):
    # A stand-in for GitHub's gh CLI, which cannot reach GitHub from here: it records its arguments.
    fake_bin = tmp_path / "fake-gh-bin"
    fake_bin.mkdir()
    record = tmp_path / "gh-args"
    (fake_bin / "gh").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\necho https://github.com/o/r/pull/1\n')
    (fake_bin / "gh").chmod(0o755)
    repo = _base_repo(tmp_path)
    result = upstream_pr.export(guard_project.project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out")
    monkeypatch.setenv("PATH", f"{fake_bin}:/usr/bin:/bin")
    assert upstream_pr.open_pull_request(result, "me:sglpatch-upstream/0001-guard") == "https://github.com/o/r/pull/1"
    assert record.read_text().splitlines() == [
        "pr", "create", "--title", "kernel: guard the CUDA runtime include", "--body-file", str(result.body),
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
    result = upstream_pr.export(project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out")
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
    result = upstream_pr.export(project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out", signoff=True)
    message = git(repo, "log", "-1", "--format=%B%n%cn <%ce>", result.commit)
    assert "Signed-off-by: Rocm Engineer <eng@example.com>" in message
    assert message.strip().endswith("Rocm Engineer <eng@example.com>")  # committed by the user too
    assert "Signed-off-by: Rocm Engineer <eng@example.com>" in result.mbox.read_text()


def test_an_existing_branch_with_other_content_is_refused_not_overwritten(guard_project, tmp_path):
    repo = _base_repo(tmp_path)
    git(repo, "branch", "sglpatch-upstream/0001-guard", "main")  # the user's own work under that name
    before = git(repo, "rev-parse", "sglpatch-upstream/0001-guard").strip()
    with pytest.raises(SglpatchError, match="already exists .* with other content; .* not overwritten"):
        upstream_pr.export(guard_project.project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out")
    assert git(repo, "rev-parse", "sglpatch-upstream/0001-guard").strip() == before


def test_exporting_twice_keeps_the_branch(guard_project, tmp_path):
    repo = _base_repo(tmp_path)
    first = upstream_pr.export(guard_project.project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out")
    second = upstream_pr.export(guard_project.project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out")
    assert git(repo, "rev-parse", "sglpatch-upstream/0001-guard").strip() == first.commit == second.commit


def test_export_refuses_when_the_witness_cannot_run(fake_project, tmp_path):
    files = tree_files("0.1.0")
    guarded = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    patch = format_patch(tmp_path, files, {KERNEL: guarded}, "kernel: guard", body=BODY)  # fixture-unwitnessed
    fake_project.set_patches([("0001-guard.patch", patch)])
    repo = _base_repo(tmp_path)
    with pytest.raises(SglpatchError, match="could not run at main .* nothing was exported"):
        upstream_pr.export(fake_project.project, "0001-guard", base="main", base_repo=repo, out=tmp_path / "out")
    assert "sglpatch-upstream" not in git(repo, "branch")


@pytest.mark.parametrize("asked", ["0001", "1", "0001-guard", "0001-guard.patch"])
def test_upstream_takes_a_patch_by_its_number_or_its_name(guard_project, tmp_path, asked, capsys):
    from sglpatch import cli

    repo = _base_repo(tmp_path)
    argv = ["--root", str(guard_project.root), "upstream", asked, "--base", "main", "--base-repo", str(repo),
            "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 0, capsys.readouterr()
    assert git(repo, "rev-parse", "--verify", "sglpatch-upstream/0001-guard").strip()


def test_upstream_without_a_patch_lists_the_series_patch_names(guard_project, capsys):
    from sglpatch import cli

    assert cli.main(["--root", str(guard_project.root), "upstream"]) == 2
    assert "  0001-guard.patch" in capsys.readouterr().out


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
