"""`sglpatch apply --into CHECKOUT`: the series applied to a user's own sglang checkout, or refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import format_patch, git, tree_files
from sglpatch.errors import SglpatchError
from sglpatch.into import apply_into, checkout_version

KERNEL = "python/sglang/jit_kernel/csrc/kernel.cuh"
EXAMPLE = "python/sglang/srt/layers/example.py"
USER = ["-c", "user.name=Rocm User", "-c", "user.email=user@example.com"]


@pytest.fixture
def guarded(fake_project, tmp_path):
    files = tree_files("0.1.0")
    guard = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    first = format_patch(tmp_path, files, {KERNEL: guard}, "kernel: guard the include", trailers={"Witness": "guard-text"})
    files = {**files, KERNEL: guard}
    second = format_patch(tmp_path, files, {KERNEL: guard + "// fused\n"}, "kernel: note", trailers={"Witness": "guard-text"})
    fake_project.set_patches([("0001-guard.patch", first), ("0002-note.patch", second)])
    return fake_project


def _pristine_files(project, dest):
    from sglpatch import sources

    pin = project.pins().select(["0.1.0"])[0]
    pristine = sources.pristine_from_index(pin)
    archive = subprocess.run(["git", "archive", pristine.commit], cwd=pristine.repo, capture_output=True, check=True).stdout
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _git_checkout(project, dest):
    _pristine_files(project, dest)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, *USER, "commit", "-q", "-m", "sglang 0.1.0 as in the image")
    git(dest, "tag", "v0.1.0")
    return dest


def _patched(project):
    tree = project.build_dir / "trees" / "0.1.0"
    return (tree / KERNEL).read_text()


def test_a_git_checkout_gets_one_commit_per_patch_on_its_branch(guarded, tmp_path):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    git(checkout, "config", "user.name", "Rocm User")
    git(checkout, "config", "user.email", "user@example.com")
    assert checkout_version(checkout) == ("0.1.0", "the git tag at HEAD")
    done = apply_into(guarded.project, checkout)
    assert done.how == "git commits" and len(done.commits) == 2
    log = git(checkout, "log", "--format=%s|%an|%cn", "main").splitlines()
    assert log[:2] == ["kernel: note|Patch Author|Rocm User", "kernel: guard the include|Patch Author|Rocm User"]
    assert (checkout / KERNEL).read_text() == _patched(guarded.project)
    assert git(checkout, "status", "--porcelain").strip() == ""


def test_a_plain_folder_gets_its_files_rewritten(guarded, tmp_path):
    folder = _pristine_files(guarded.project, tmp_path / "plain")
    (folder / "python" / "sglang" / "_version.py").write_text("__version__ = version = '0.1.0'\n")
    done = apply_into(guarded.project, folder)
    assert done.how == "files rewritten" and done.files == [KERNEL]
    assert (folder / KERNEL).read_text() == _patched(guarded.project)


def test_a_checkout_that_is_not_the_pins_release_is_refused_and_left_alone(guarded, tmp_path):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    (checkout / KERNEL).write_text((checkout / KERNEL).read_text() + "// a local fix\n")
    git(checkout, *USER, "commit", "-qam", "local fix")
    head = git(checkout, "rev-parse", "HEAD")
    git(checkout, "tag", "-f", "v0.1.0")
    with pytest.raises(SglpatchError, match=rf"{checkout / KERNEL}: differs from sglang 0.1.0's pristine file"):
        apply_into(guarded.project, checkout)
    assert git(checkout, "rev-parse", "HEAD") == head and (checkout / KERNEL).read_text().endswith("// a local fix\n")


def test_local_changes_in_the_files_the_series_changes_are_refused(guarded, tmp_path):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    (checkout / EXAMPLE).write_text("mine\n")  # not touched by the series: fine
    (checkout / KERNEL).write_text((checkout / KERNEL).read_text())  # same bytes: fine
    done = apply_into(guarded.project, checkout)
    assert (checkout / EXAMPLE).read_text() == "mine\n" and len(done.commits) == 2


def test_an_unknown_version_is_refused_until_the_pin_is_named(guarded, tmp_path):
    folder = _pristine_files(guarded.project, tmp_path / "plain")
    with pytest.raises(SglpatchError, match="cannot tell its sglang version .* --pin"):
        apply_into(guarded.project, folder)
    (folder / "python" / "sglang" / "_version.py").write_text("__version__ = version = '9.9.9'\n")
    with pytest.raises(SglpatchError, match=r"sglang 9.9.9 .* is not pinned; pinned: 0.1.0, 0.2.0"):
        apply_into(guarded.project, folder)
    assert apply_into(guarded.project, folder, "0.1.0").files == [KERNEL]


def test_the_cli_applies_into_a_checkout(fake_project, tmp_path):
    # The CLI runs in its own process, without the test witnesses: rocm-guard finds nothing to
    # compile in this small tree, so the run must say it is unproven.
    files = tree_files("0.1.0")
    guard = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    fake_project.set_patches([("0001-guard.patch", format_patch(tmp_path, files, {KERNEL: guard}, "kernel: guard",
                                                                  trailers={"Witness": "rocm-guard"}))])
    folder = _pristine_files(fake_project.project, tmp_path / "plain")
    command = [sys.executable, "-m", "sglpatch", "--root", str(fake_project.root), "apply", "--into", str(folder), "0.1.0"]
    refused = subprocess.run(command, capture_output=True, text=True)
    assert refused.returncode == 2 and "witness-unavailable" in refused.stderr and "Traceback" not in refused.stderr
    assert (folder / KERNEL).read_text() == files[KERNEL]
    done = subprocess.run([*command, "--allow-unavailable"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "applied as files rewritten" in done.stdout and (folder / KERNEL).read_text() == guard
