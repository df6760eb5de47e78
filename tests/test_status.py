"""`sglpatch status --write`: apply's Upstream-Status suggestions written into the patch trailers,
with Fixed-Upstream-In and its evidence, the lock re-recorded, and the change left for review."""

from __future__ import annotations

import shutil

import pytest

from conftest import BASE_FILES, format_patch, git, make_wheel, pin_entry, tree_files
from sglpatch import cli
from sglpatch.apply.apply_pins import apply_series
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.series.lock import read_lock
from sglpatch.series.patches import parse_patch_file
from sglpatch.upstream import suggest, suggest_write

KERNEL = "python/sglang/jit_kernel/csrc/kernel.cuh"


def _guarded(text):
    return text.replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")


@pytest.fixture
def upstreamed(fake_project, tmp_path):
    """A Pending guard patch (main file for 0.2.0 and 0.3.0, the newest; a rendition for 0.1.0)
    that 0.3.0 already holds, applied to every pin, in a git repository holding the project."""
    files = tree_files("0.1.0")
    artifact = make_wheel(fake_project.index, "0.3.0", {**BASE_FILES, "sglang/jit_kernel/csrc/kernel.cuh": _guarded(BASE_FILES["sglang/jit_kernel/csrc/kernel.cuh"])})
    pins = fake_project.root / "upstream" / "pins.toml"
    pins.write_text(pins.read_text() + pin_entry("0.3.0", artifact))
    rendition = format_patch(tmp_path, files, {KERNEL: _guarded(files[KERNEL])}, "kernel: guard", trailers={"Witness": "guard-text", "Applies-To": "==0.1.0"})
    main = format_patch(
        tmp_path, tree_files("0.2.0"), {KERNEL: _guarded(files[KERNEL])}, "kernel: guard",
        trailers={"Witness": "guard-text", "Applies-To": ">=0.2.0,<=0.3.0"},
    )
    fake_project.set_patches([("0001-guard.patch", main)], {"0001-guard": [("0.1.0.patch", rendition)]})
    report = apply_series(fake_project.project)
    assert report.ok, report.to_json()
    git(fake_project.root, "init", "-q")
    (fake_project.root / ".gitignore").write_text("build/\n*.lock.lock\n")
    git(fake_project.root, "add", "-A")
    git(fake_project.root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "project")
    return fake_project


def test_status_write_puts_the_suggestion_and_its_evidence_into_every_rendition(upstreamed, capsys):
    root = upstreamed.root
    lock_before = read_lock(root / "series.lock")
    assert cli.main(["--root", str(root), "status", "--write"]) == 0
    out = capsys.readouterr().out
    assert "Pending -> Accepted [0.3.0]" in out and "review the change with `git diff`" in out
    for path in (root / "patches" / "0001-guard.patch", root / "patches" / "renditions" / "0001-guard" / "0.1.0.patch"):
        patch = parse_patch_file(path)
        assert patch.trailer("Upstream-Status") == "Accepted [0.3.0]"
        assert patch.trailer("Fixed-Upstream-In") == (
            "0.3.0 (the patch reverse-applies, guard-text passes on the pristine 0.3.0, fails on 0.2.0)"
        )
        # The new trailer sits with the others, before Applies-To.
        names = [name for name, _ in patch.trailers]
        assert names.index("Fixed-Upstream-In") == names.index("Applies-To") - 1
    # Only the two trailers changed in the patch files, and the lock followed the new messages.
    diff = git(root, "diff", "--unified=0", "--", "patches")
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert sorted(line[1:].split(":")[0] for line in changed) == sorted(["Upstream-Status", "Upstream-Status", "Upstream-Status", "Upstream-Status", "Fixed-Upstream-In", "Fixed-Upstream-In"])
    lock_after = read_lock(root / "series.lock")
    assert set(lock_after["pins"]) == set(lock_before["pins"])
    assert all(lock_after["pins"][v]["commit"] != lock_before["pins"][v]["commit"] for v in ("0.1.0", "0.2.0"))
    assert lock_after["pins"]["0.3.0"] == lock_before["pins"]["0.3.0"]  # not applied there: nothing to re-hash
    # Everyone who applies the series now reproduces the re-recorded lock.
    again = apply_series(upstreamed.project)
    assert again.ok and {result.lock for result in again.results} == {"matches"}
    # The status is settled now: no more suggestions.
    assert again.suggestions == []


def test_status_without_write_only_prints(upstreamed, capsys):
    before = git(upstreamed.root, "status", "--porcelain")
    assert cli.main(["--root", str(upstreamed.root), "status"]) == 0
    assert "Accepted [0.3.0]" in capsys.readouterr().out
    assert git(upstreamed.root, "status", "--porcelain") == before


def test_status_refuses_a_report_of_another_state_of_the_series(upstreamed):
    path = upstreamed.root / "patches" / "0001-guard.patch"
    path.write_text(path.read_text().replace("kernel: guard", "kernel: guard the include", 1))
    with pytest.raises(SglpatchError, match="another state of the series.*sglpatch apply"):
        suggest.read_suggestions(upstreamed.root / "build" / "apply-report.json", upstreamed.project.series())


def test_status_write_changes_nothing_when_the_staged_apply_fails(upstreamed, cache_dir):
    # 0.1.0's artifact and pristine tree are gone: the staged re-apply of 0.1.0 cannot run.
    (upstreamed.index / "sglang-0.1.0.tar.gz").unlink()
    for entry in (cache_dir / "pristine").glob("0.1.0-*"):
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for entry in (cache_dir / "artifacts").glob("sglang-0.1.0*"):
        entry.unlink()
    before = git(upstreamed.root, "status", "--porcelain")
    with pytest.raises(SglpatchError, match="does not apply to 0.1.0.*nothing written"):
        suggest_write.write_suggestions(upstreamed.project, suggest.read_suggestions(upstreamed.root / "build" / "apply-report.json", upstreamed.project.series()))
    assert git(upstreamed.root, "status", "--porcelain") == before


def test_trailers_are_rewritten_in_the_commit_message_only():
    text = (
        "From 0 Mon Sep 17 00:00:00 2001\nSubject: x\n\nBody.\n\nUpstream-Status: Pending\nWitness: w\n"
        "Applies-To: ==1.0\n---\n a | 1 +\n\ndiff --git a/a b/a\n+Upstream-Status: Pending\n+Applies-To: x\n"
    )
    new = suggest.with_trailers(text, "Accepted [1.1]", "1.1 (evidence)")
    message, diff = new.split("\n---\n", 1)
    assert "Upstream-Status: Accepted [1.1]\nWitness: w\nFixed-Upstream-In: 1.1 (evidence)\nApplies-To: ==1.0" in message
    assert diff.endswith("+Upstream-Status: Pending\n+Applies-To: x\n")
    again = suggest.with_trailers(new, "Accepted [1.1]", "1.1 (other evidence)")
    assert again.count("Fixed-Upstream-In:") == 1 and "1.1 (other evidence)" in again
