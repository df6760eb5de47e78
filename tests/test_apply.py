"""Applying a series: classification, atomicity, the lock, and reproducible hashes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import example_lines, format_patch, git, tree_files
from sglpatch.apply import one_pin as apply_module
from sglpatch.apply import tree_repo
from sglpatch.apply.apply_pins import apply_series

# The text machinery (classification, atomicity, the lock, hashes) is proven without witnesses:
# classified by text alone, as `sglpatch apply --no-witnesses` does.
def apply_text(project, *args, **kwargs):
    return apply_series(project, *args, run_witnesses=False, **kwargs)

EXAMPLE = "python/sglang/srt/layers/example.py"
KERNEL = "python/sglang/jit_kernel/csrc/kernel.cuh"


def _guard_patch(tmp_path, version="0.1.0", **kwargs):
    files = tree_files(version)
    guarded = files[KERNEL].replace(
        "#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n"
    )
    return format_patch(tmp_path, files, {KERNEL: guarded}, "jit_kernel: guard the CUDA runtime include", **kwargs)


def _example_patch(tmp_path, line=20, text="line twenty, patched\n", **kwargs):
    files = tree_files("0.1.0")
    return format_patch(tmp_path, files, {EXAMPLE: example_lines({line: text})}, f"example: patch line {line}", **kwargs)


def _outcomes(report, version):
    result = next(r for r in report.results if r.version == version)
    return {outcome.name: outcome for outcome in result.patches}, result


def _head_and_files(tree):
    return git(tree, "rev-parse", "HEAD").strip(), git(tree, "status", "--porcelain").strip(), (tree / EXAMPLE).read_text()


def test_clean_patches_apply_as_one_commit_each_on_every_pin(fake_project, tmp_path):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path)), ("0002-example.patch", _example_patch(tmp_path))])
    report = apply_text(fake_project.project)
    assert report.ok, report.to_json()
    for version in fake_project.versions:
        outcomes, result = _outcomes(report, version)
        assert [o.status for o in outcomes.values()] == ["applied", "applied"]
        tree = fake_project.root / "build" / "trees" / version
        log = git(tree, "log", "--format=%s", "pristine..sglpatch").splitlines()
        assert log == ["example: patch line 20", "jit_kernel: guard the CUDA runtime include"]
        assert "#ifndef USE_ROCM" in (tree / KERNEL).read_text()
        assert git(tree, "status", "--porcelain").strip() == ""
        assert result.tree_path == str(tree)


def test_a_project_on_another_filesystem_than_the_cache_applies(fake_project, tmp_path, monkeypatch):
    # The pin's tree is cloned from the cached pristine repository: hardlinked on one filesystem,
    # copied across two (git clone --local refused there: "Invalid cross-device link").
    import shutil
    import tempfile

    from conftest import REPO_ROOT

    here = os.stat(tmp_path).st_dev
    other = next((Path(d) for d in ("/dev/shm", REPO_ROOT / "build", tempfile.gettempdir())
                  if Path(d).is_dir() and os.access(d, os.W_OK) and os.stat(d).st_dev != here), None)
    if other is None:
        pytest.skip(f"no writable folder on another filesystem than {tmp_path} to hold the cache")
    cache = Path(tempfile.mkdtemp(dir=other, prefix="sglpatch-test-cache-"))
    try:
        monkeypatch.setenv("SGLPATCH_CACHE_DIR", str(cache))
        fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path))])
        report = apply_text(fake_project.project)
        assert report.ok, report.to_json()
        for version in fake_project.versions:
            tree = fake_project.root / "build" / "trees" / version
            assert git(tree, "log", "--format=%s", "pristine..sglpatch").splitlines() == ["jit_kernel: guard the CUDA runtime include"]
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def test_commits_equal_what_plain_git_am_makes_with_the_same_committer(fake_project, tmp_path):
    patch = _guard_patch(tmp_path)
    fake_project.set_patches([("0001-guard.patch", patch)])
    report = apply_series(fake_project.project)
    _, result = _outcomes(report, "0.1.0")
    tree = fake_project.root / "build" / "trees" / "0.1.0"
    scratch = tmp_path / "am"
    git(tmp_path, "clone", "-q", str(tree), str(scratch))
    git(scratch, "checkout", "-q", "-b", "am", result.pristine)
    env = {"GIT_COMMITTER_NAME": "sglpatch", "GIT_COMMITTER_EMAIL": "sglpatch@localhost"}
    git(scratch, "am", "-q", "--committer-date-is-author-date", str(fake_project.root / "patches" / "0001-guard.patch"), env=env)
    assert git(scratch, "rev-parse", "HEAD").strip() == result.commit


def test_results_reproduce_bit_for_bit_in_a_fresh_cache_and_output(fake_project, tmp_path, monkeypatch):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path))])
    first = apply_text(fake_project.project)
    lock_before = (fake_project.root / "series.lock").read_text()
    monkeypatch.setenv("SGLPATCH_CACHE_DIR", str(tmp_path / "cache2"))
    second = apply_text(fake_project.project, out_dir=tmp_path / "elsewhere")
    assert [r.commit for r in first.results] == [r.commit for r in second.results]
    assert [r.lock for r in second.results] == ["matches", "matches"]
    assert (fake_project.root / "series.lock").read_text() == lock_before


def test_pins_applied_in_worker_processes_give_the_same_report_trees_and_lock(fake_project, tmp_path, monkeypatch):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path)), ("0002-example.patch", _example_patch(tmp_path))])
    alone = apply_text(fake_project.project)
    lock = (fake_project.root / "series.lock").read_text()
    monkeypatch.setenv("SGLPATCH_CACHE_DIR", str(tmp_path / "cache2"))
    together = apply_text(fake_project.project, out_dir=tmp_path / "elsewhere", jobs=2)
    assert together.ok, together.to_json()
    assert [r.version for r in together.results] == fake_project.versions  # in pin order, whoever finished first
    assert [(r.commit, r.tree, [(o.name, o.status, o.commit) for o in r.patches]) for r in together.results] == \
        [(r.commit, r.tree, [(o.name, o.status, o.commit) for o in r.patches]) for r in alone.results]
    assert [r.lock for r in together.results] == ["matches", "matches"]
    assert (fake_project.root / "series.lock").read_text() == lock
    for version in fake_project.versions:
        assert git(tmp_path / "elsewhere" / "trees" / version, "status", "--porcelain").strip() == ""


def test_a_new_lock_written_by_workers_at_once_holds_every_pin(fake_project, tmp_path):
    # Each worker records its pins in the same lock file: none may lose another's entry.
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path))])
    (fake_project.root / "series.lock").unlink(missing_ok=True)
    report = apply_text(fake_project.project, jobs=2)
    assert [r.lock for r in report.results] == ["recorded", "recorded"]
    assert sorted(json.loads((fake_project.root / "series.lock").read_text())["pins"]) == sorted(fake_project.versions)


def test_offset_hunks_are_classified_applied_with_offset(fake_project, tmp_path):
    files = tree_files("0.1.0")
    files[EXAMPLE] = example_lines(insert_top=3)  # the patch was made on a file with 3 more lines on top
    patch = format_patch(tmp_path, files, {EXAMPLE: example_lines({20: "patched\n"}, insert_top=3)}, "example: offset")
    fake_project.set_patches([("0001-offset.patch", patch)])
    outcomes, _ = _outcomes(apply_text(fake_project.project), "0.1.0")
    assert outcomes["0001-offset.patch"].status == "applied-with-offset"
    assert "offset -3" in outcomes["0001-offset.patch"].detail


def test_patch_already_in_the_pin_is_classified_already_upstream(fake_project, tmp_path):
    files = tree_files("0.1.0")
    files[KERNEL] = "#pragma once\n#include <algorithm>\n"
    patch = format_patch(tmp_path, files, {KERNEL: tree_files("0.1.0")[KERNEL]}, "kernel: add include upstream has")
    fake_project.set_patches([("0001-upstream.patch", patch)])
    report = apply_text(fake_project.project)
    outcomes, result = _outcomes(report, "0.1.0")
    assert outcomes["0001-upstream.patch"].status == "already-upstream"
    assert result.ok and result.commit == result.pristine


def test_conflict_names_the_file_and_shows_the_hunk_and_refuses_fuzz(fake_project, tmp_path):
    files = tree_files("0.1.0")
    files[EXAMPLE] = example_lines({19: "a line upstream changed\n"})  # one context line differs: fuzz would take it
    patch = format_patch(tmp_path, files, {EXAMPLE: example_lines({19: "a line upstream changed\n", 20: "patched\n"})}, "example: conflict")
    fake_project.set_patches([("0001-conflict.patch", patch)])
    report = apply_series(fake_project.project)
    outcomes, result = _outcomes(report, "0.1.0")
    outcome = outcomes["0001-conflict.patch"]
    assert outcome.status == "conflict"
    assert f"hunk 1 of {EXAMPLE}" in outcome.detail
    assert "+patched" in outcome.detail
    assert not result.ok and not report.ok


def test_patch_for_a_file_the_pin_lacks_is_missing_file(fake_project, tmp_path):
    files = {**tree_files("0.1.0"), "python/sglang/moved/elsewhere.py": "x = 1\n"}
    patch = format_patch(tmp_path, files, {"python/sglang/moved/elsewhere.py": "x = 2\n"}, "moved: edit")
    fake_project.set_patches([("0001-moved.patch", patch)])
    outcomes, result = _outcomes(apply_series(fake_project.project), "0.1.0")
    assert outcomes["0001-moved.patch"].status == "missing-file"
    assert "python/sglang/moved/elsewhere.py" in outcomes["0001-moved.patch"].detail
    assert not result.ok


def test_failure_leaves_the_tree_branch_and_lock_exactly_as_they_were(fake_project, tmp_path):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path))])
    assert apply_text(fake_project.project).ok
    tree = fake_project.root / "build" / "trees" / "0.1.0"
    before = _head_and_files(tree)
    lock_before = (fake_project.root / "series.lock").read_text()
    files = tree_files("0.1.0")
    files[EXAMPLE] = example_lines({19: "upstream\n"})
    bad = format_patch(tmp_path, files, {EXAMPLE: example_lines({19: "upstream\n", 20: "x\n"})}, "example: bad")
    fake_project.set_patches(
        [("0001-guard.patch", _guard_patch(tmp_path)), ("0002-example.patch", _example_patch(tmp_path)), ("0003-bad.patch", bad)]
    )
    report = apply_text(fake_project.project, ["0.1.0"])
    assert not report.ok
    assert _head_and_files(tree) == before
    assert (fake_project.root / "series.lock").read_text() == lock_before
    assert git(tree, "branch", "--list").split() == ["*", "sglpatch", "pristine"] or "sglpatch" in git(tree, "branch")


def test_lock_mismatch_is_an_error_until_update_lock_accepts_it(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    assert apply_text(fake_project.project).ok
    tree = fake_project.root / "build" / "trees" / "0.1.0"
    before = _head_and_files(tree)
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path, text="changed differently\n"))])
    report = apply_text(fake_project.project)
    _, result = _outcomes(report, "0.1.0")
    assert result.lock == "mismatch" and "--update-lock" in result.error and "commit: locked" in result.error
    assert _head_and_files(tree) == before
    report = apply_text(fake_project.project, update_lock=True)
    assert report.ok and {r.lock for r in report.results} == {"updated"}
    assert "changed differently" in (tree / EXAMPLE).read_text()
    lock = json.loads((fake_project.root / "series.lock").read_text())
    assert lock["pins"]["0.1.0"]["commit"] == report.results[0].commit


def test_apply_killed_half_way_changes_nothing_and_the_next_run_recovers(fake_project, tmp_path, monkeypatch):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path))])
    assert apply_text(fake_project.project).ok
    tree = fake_project.root / "build" / "trees" / "0.1.0"
    before = _head_and_files(tree)
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path)), ("0002-example.patch", _example_patch(tmp_path))])
    real_commit = apply_module.commit_patch
    calls = []

    def killed_after_first(*args, **kwargs):
        if calls:
            raise KeyboardInterrupt  # what a Ctrl-C or a signal does in the middle of the series
        calls.append(1)
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(apply_module, "commit_patch", killed_after_first)
    with pytest.raises(KeyboardInterrupt):
        apply_text(fake_project.project, ["0.1.0"])
    assert _head_and_files(tree) == before
    assert not list((tree / ".git").glob("sglpatch-index-*"))
    monkeypatch.setattr(apply_module, "commit_patch", real_commit)
    report = apply_text(fake_project.project, ["0.1.0"], update_lock=True)
    assert report.ok
    assert "line twenty, patched" in (tree / EXAMPLE).read_text()


def test_apply_killed_while_moving_the_tree_is_finished_by_the_next_run(fake_project, tmp_path, monkeypatch):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path))])
    assert apply_text(fake_project.project).ok
    tree = fake_project.root / "build" / "trees" / "0.1.0"
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path)), ("0002-example.patch", _example_patch(tmp_path))])
    real_run_git = tree_repo.run_git

    def dies_in_reset(args, *rest, **kwargs):
        if args[0] == "reset":
            (tree / EXAMPLE).write_text("half-written\n")
            raise KeyboardInterrupt
        return real_run_git(args, *rest, **kwargs)

    monkeypatch.setattr(tree_repo, "run_git", dies_in_reset)
    with pytest.raises(KeyboardInterrupt):
        apply_text(fake_project.project, ["0.1.0"], update_lock=True)
    monkeypatch.setattr(tree_repo, "run_git", real_run_git)
    report = apply_text(fake_project.project, ["0.1.0"], update_lock=True)
    assert report.ok, report.to_json()
    assert "line twenty, patched" in (tree / EXAMPLE).read_text()
    assert git(tree, "status", "--porcelain").strip() == ""


def test_local_changes_in_a_tree_are_never_overwritten(fake_project, tmp_path):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path))])
    assert apply_text(fake_project.project).ok
    tree = fake_project.root / "build" / "trees" / "0.1.0"
    (tree / EXAMPLE).write_text("my experiment\n")
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    report = apply_text(fake_project.project, ["0.1.0"], update_lock=True)
    assert not report.ok and "local changes" in report.results[0].error
    assert (tree / EXAMPLE).read_text() == "my experiment\n"


def test_renditions_are_selected_by_pin_version(fake_project, tmp_path):
    old = _example_patch(tmp_path, text="for 0.1\n", trailers={"Applies-To": "<0.2"})
    new = _example_patch(tmp_path, line=21, text="for 0.2\n", trailers={"Applies-To": ">=0.2"})
    fake_project.set_patches([("0001-example.patch", old)], renditions={"0001-example": [("0.2.patch", new)]})
    report = apply_text(fake_project.project)
    assert report.ok
    for version, text in (("0.1.0", "for 0.1"), ("0.2.0", "for 0.2")):
        assert text in (fake_project.root / "build" / "trees" / version / EXAMPLE).read_text()
    outcomes, _ = _outcomes(report, "0.2.0")
    assert outcomes["0001-example.patch"].rendition.endswith("renditions/0001-example/0.2.patch")


def test_pin_outside_every_rendition_is_not_applicable(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path, trailers={"Applies-To": "<0.2"}))])
    outcomes, result = _outcomes(apply_series(fake_project.project), "0.2.0")
    assert outcomes["0001-example.patch"].status == "not-applicable" and result.ok


def _fix_of_one_pin(tmp_path, applies_to="==0.2.0"):
    """A fix of one release, as `patch refresh` writes it (``Applies-To: ==<pin>``)."""
    return ("0002-example.patch", _example_patch(tmp_path, trailers={"Applies-To": applies_to}))


def test_a_fix_of_one_pin_is_locked_there_and_every_other_pins_entry_stays_as_it_was(fake_project, tmp_path):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path))])
    assert apply_text(fake_project.project).ok
    lock_path = fake_project.root / "series.lock"
    before = json.loads(lock_path.read_text())["pins"]
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path)), _fix_of_one_pin(tmp_path)])
    assert apply_text(fake_project.project, ["0.2.0"], update_lock=True).ok
    # Every pin passes with no other step: on 0.1.0 the fix is not applicable and needs no entry.
    report = apply_text(fake_project.project)
    assert report.ok, report.to_json()
    outcomes, result = _outcomes(report, "0.1.0")
    assert outcomes["0002-example.patch"].status == "not-applicable" and result.lock == "matches"
    after = json.loads(lock_path.read_text())["pins"]
    assert after["0.1.0"] == before["0.1.0"]
    assert [p["name"] for p in after["0.2.0"]["patches"]] == ["0001-guard.patch", "0002-example.patch"]


@pytest.mark.parametrize("locked_on, then, says", [
    # The fix comes to claim a pin whose entry was made without it: a new result, named in words.
    ("==0.2.0", ">=0.1.0", "patch 0002-example.patch: the lock has no entry for it on this pin, this run applied (commit "),
    # It stops claiming a pin it is locked on: the lock's proof of that pin no longer holds.
    (">=0.1.0", "==0.2.0", "patch 0002-example.patch: the lock has it applied (commit "),
])
def test_a_patch_that_comes_to_claim_a_pin_or_stops_is_a_mismatch_said_in_words(fake_project, tmp_path, locked_on, then, says):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path)), _fix_of_one_pin(tmp_path, locked_on)])
    assert apply_text(fake_project.project).ok
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path)), _fix_of_one_pin(tmp_path, then)])
    _, result = _outcomes(apply_text(fake_project.project, ["0.1.0"]), "0.1.0")
    assert result.lock == "mismatch" and says in result.error, result.error
    assert "{" not in result.error and "None" not in result.error, result.error
    if then == "==0.2.0":
        assert "this run not-applicable (no rendition claims the pin" in result.error


def test_warm_reapply_reuses_results_without_rebuilding(fake_project, tmp_path, monkeypatch):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path, trailers={"Witness": "guard-text"}))])
    first = apply_series(fake_project.project)
    monkeypatch.setattr(apply_module, "_apply_all", lambda *a, **k: pytest.fail("rebuilt on a warm run"))
    second = apply_series(fake_project.project)
    assert [r.commit for r in first.results] == [r.commit for r in second.results]


def test_cli_apply_prints_the_table_and_writes_the_json_report(fake_project, tmp_path):
    # A real witness: the CLI runs in its own process, without the test witnesses.
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path, trailers={"Witness": "rocm-guard"}))])
    run = subprocess.run(
        ["python", "-m", "sglpatch", "--root", str(fake_project.root), "apply", "--no-witnesses"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "sglang 0.1.0: ok" in run.stdout and "0001-guard.patch" in run.stdout and "applied" in run.stdout
    data = json.loads((fake_project.root / "build" / "apply-report.json").read_text())
    assert data["ok"] and data["pins"][0]["patches"][0]["status"] == "applied"
    assert data["pins"][0]["tree_path"].endswith("build/trees/0.1.0")


def test_cli_refuses_an_unknown_pin_by_name(fake_project):
    run = subprocess.run(
        ["python", "-m", "sglpatch", "--root", str(fake_project.root), "apply", "9.9.9"], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert "unknown pin 9.9.9" in run.stderr and "pins.toml" in run.stderr


def test_patch_whose_bug_is_absent_on_the_pin_is_not_needed_and_not_applied(fake_project, tmp_path, test_witnesses):
    files = tree_files("0.1.0")
    guarded = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    # Upstream fixed it differently on 0.2.0: the text differs, so only the witness can tell.
    wheel_files = {name: text for name, text in __import__("conftest").BASE_FILES.items()}
    wheel_files["sglang/jit_kernel/csrc/kernel.cuh"] = "#pragma once\n#ifndef USE_ROCM // upstream's way\n#include <cuda_runtime.h>\n#endif\n\nvoid f();\n"
    from conftest import make_wheel, pin_entry

    artifact = make_wheel(fake_project.index, "0.2.0", wheel_files)
    pins = fake_project.root / "upstream" / "pins.toml"
    text = pins.read_text()
    pins.write_text(text[: text.index("[[pin]]", text.index("0.1.0"))] + pin_entry("0.2.0", artifact))
    patch = format_patch(tmp_path, files, {KERNEL: guarded}, "kernel: guard", trailers={"Witness": "guard-text"})
    fake_project.set_patches([("0001-guard.patch", patch)])
    report = apply_series(fake_project.project)
    assert report.ok, report.to_json()
    old, _ = _outcomes(report, "0.1.0")
    new, result = _outcomes(report, "0.2.0")
    assert (old["0001-guard.patch"].status, old["0001-guard.patch"].needed) == ("applied", True)
    assert old["0001-guard.patch"].witness_before.startswith("bug") and old["0001-guard.patch"].witness_after.startswith("clean")
    assert (new["0001-guard.patch"].status, new["0001-guard.patch"].needed) == ("not-needed", False)
    # One release cannot tell a fix upstream from a bug never there: the detail says what it saw.
    assert "not needed here" in new["0001-guard.patch"].detail and "does not reverse-apply" in new["0001-guard.patch"].detail
    assert result.commit == result.pristine


def test_patch_that_does_not_fix_its_bug_fails_the_pin(fake_project, tmp_path):
    patch = _example_patch(tmp_path, trailers={"Witness": "guard-text"})  # touches another file
    fake_project.set_patches([("0001-example.patch", patch)])
    report = apply_series(fake_project.project, ["0.1.0"])
    outcomes, result = _outcomes(report, "0.1.0")
    assert outcomes["0001-example.patch"].status == "witness-failed"
    assert not result.ok and not (fake_project.root / "build" / "trees" / "0.1.0" / EXAMPLE).exists()


def test_unavailable_witness_is_asked_again_on_the_next_run(fake_project, tmp_path, test_witnesses, monkeypatch):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path))])  # fixture-unwitnessed
    apply_series(fake_project.project, ["0.1.0"])
    monkeypatch.setitem(test_witnesses, "fixture-unwitnessed", test_witnesses["guard-text"])
    outcomes, _ = _outcomes(apply_series(fake_project.project, ["0.1.0"]), "0.1.0")
    assert outcomes["0001-guard.patch"].witness_before.startswith("bug")


def test_witness_answers_are_cached_by_tree(fake_project, tmp_path, test_witnesses):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path, trailers={"Witness": "guard-text"}))])
    apply_series(fake_project.project, ["0.1.0"])
    runs = len(test_witnesses["guard-text"].runs)
    assert runs == 2  # pristine and patched
    apply_series(fake_project.project, ["0.1.0"], out_dir=tmp_path / "other")
    assert len(test_witnesses["guard-text"].runs) == runs


def test_apply_process_killed_by_sigkill_mid_series_leaves_the_tree_and_the_next_run_recovers(fake_project, tmp_path):
    import os
    import signal
    import time

    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path, trailers={"Witness": "rocm-guard"}))])
    assert apply_series(fake_project.project, ["0.1.0"], allow_unavailable=True).ok
    tree = fake_project.root / "build" / "trees" / "0.1.0"
    before = _head_and_files(tree)
    lock_before = (fake_project.root / "series.lock").read_text()
    # A long series of stacked patches, so the kill lands while commits are being built in the
    # private index.
    many, files = [], tree_files("0.1.0")
    for n in range(1, 40):
        text = files[EXAMPLE].replace(f"line {n}\n", f"patched {n}\n")
        patch = format_patch(tmp_path, files, {EXAMPLE: text}, f"example: line {n}", trailers={"Witness": "rocm-guard"})
        many.append((f"{n:04d}-line{n}.patch", patch))
        files = {**files, EXAMPLE: text}
    fake_project.set_patches(many)
    process = subprocess.Popen(
        ["python", "-m", "sglpatch", "--root", str(fake_project.root), "apply", "0.1.0", "--update-lock",
         "--allow-unavailable"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not list((tree / ".git").glob("sglpatch-index-*")) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.005)
    assert process.poll() is None, "apply finished before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert _head_and_files(tree) == before
    assert (fake_project.root / "series.lock").read_text() == lock_before
    report = apply_series(fake_project.project, ["0.1.0"], update_lock=True, allow_unavailable=True)
    assert report.ok, report.to_json()
    assert (tree / EXAMPLE).read_text().startswith('"""patched 1\npatched 2\n')  # the fake module opens its string on line 1
    assert git(tree, "status", "--porcelain").strip() == ""
    assert not list((tree / ".git").glob("sglpatch-index-*"))


def test_pending_patch_that_a_pin_already_has_gets_a_status_suggestion(fake_project, tmp_path):
    from conftest import BASE_FILES, make_wheel, pin_entry

    files = tree_files("0.1.0")
    guarded = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    upstream_files = {**BASE_FILES, "sglang/jit_kernel/csrc/kernel.cuh": guarded}
    artifact = make_wheel(fake_project.index, "0.3.0", upstream_files)
    pins = fake_project.root / "upstream" / "pins.toml"
    pins.write_text(pins.read_text() + pin_entry("0.3.0", artifact))
    patch = format_patch(tmp_path, files, {KERNEL: guarded}, "kernel: guard", trailers={"Witness": "guard-text"})
    fake_project.set_patches([("0001-guard.patch", patch)])
    report = apply_series(fake_project.project)
    assert [(s.patch, s.current, s.suggested) for s in report.suggestions] == [
        ("0001-guard.patch", "Pending", "Accepted [0.3.0]")
    ]
    assert "0.3.0" in report.suggestions[0].evidence
    assert json.loads(report.to_json())["status_suggestions"][0]["suggested"] == "Accepted [0.3.0]"


def test_settled_status_gets_no_suggestion(fake_project, tmp_path):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path, trailers={"Upstream-Status": "Inappropriate [local only]"}))])
    assert apply_series(fake_project.project).suggestions == []


class _CrashesOnThePatchedTree:
    """A test witness whose probe finds the bug on the pristine tree and cannot run on the patched
    one -- what a patch that breaks ``import sglang`` does to a real CPU-Python witness."""

    name = "crashes-when-patched"
    version = "1"

    def run(self, tree, pin):
        from sglpatch.witnesses.results import BUG, UNAVAILABLE, WitnessResult

        if "#ifndef USE_ROCM" in (tree / KERNEL).read_text():
            return WitnessResult(self.name, UNAVAILABLE, detail="the probe failed importing sglang: SyntaxError")
        return WitnessResult(self.name, BUG, "text", "no guard")


def test_witness_that_cannot_run_on_the_patched_tree_fails_the_pin_and_is_asked_again(
    fake_project, tmp_path, test_witnesses, monkeypatch
):
    monkeypatch.setitem(test_witnesses, "crashes-when-patched", _CrashesOnThePatchedTree())
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path, trailers={"Witness": "crashes-when-patched"}))])
    tree = fake_project.root / "build" / "trees" / "0.1.0"
    outcomes, result = _outcomes(apply_series(fake_project.project, ["0.1.0"]), "0.1.0")
    assert outcomes["0001-guard.patch"].status == "witness-unavailable"
    assert "could not run on the patched tree" in outcomes["0001-guard.patch"].detail
    assert "SyntaxError" in outcomes["0001-guard.patch"].detail
    assert not result.ok and "witness-unavailable" in result.error
    assert not (fake_project.root / "series.lock").exists() or "0.1.0" not in (fake_project.root / "series.lock").read_text()
    assert not (tree / KERNEL).exists()  # nothing was checked out
    # Not remembered as settled: once the witness can run, it is asked again and decides.
    monkeypatch.setitem(test_witnesses, "crashes-when-patched", test_witnesses["guard-text"])
    outcomes, result = _outcomes(apply_series(fake_project.project, ["0.1.0"]), "0.1.0")
    assert result.ok and outcomes["0001-guard.patch"].status == "applied"
    assert outcomes["0001-guard.patch"].witness_after.startswith("clean")


def test_witness_that_cannot_run_on_the_pristine_tree_fails_the_pin(fake_project, tmp_path):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path))])  # fixture-unwitnessed
    outcomes, result = _outcomes(apply_series(fake_project.project, ["0.1.0"]), "0.1.0")
    assert outcomes["0001-guard.patch"].status == "witness-unavailable" and not result.ok
    assert "nothing says the patch is needed" in outcomes["0001-guard.patch"].detail


def test_allow_unavailable_applies_but_says_unproven_on_every_line(fake_project, tmp_path):
    from sglpatch.apply.report import render_apply, render_witnesses

    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path))])  # fixture-unwitnessed
    report = apply_series(fake_project.project, allow_unavailable=True)
    assert report.ok
    for version in fake_project.versions:
        outcomes, _ = _outcomes(report, version)
        assert outcomes["0001-guard.patch"].status == "applied" and outcomes["0001-guard.patch"].unproven
    table = render_apply(report)
    assert table.count("UNPROVEN") >= 2 * len(fake_project.versions)
    assert render_witnesses(report).count("UNPROVEN") == len(fake_project.versions)
    assert all(p["unproven"] for pin in json.loads(report.to_json())["pins"] for p in pin["patches"])


def test_cli_apply_exits_non_zero_naming_the_witness_that_could_not_run(fake_project, tmp_path):
    # rocm-guard finds no fused metadata kernel in this small tree, so it cannot tell anything.
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path, trailers={"Witness": "rocm-guard"}))])
    run = subprocess.run(["python", "-m", "sglpatch", "--root", str(fake_project.root), "apply", "0.1.0"],
                         capture_output=True, text=True)
    assert run.returncode == 4, run.stdout + run.stderr  # exit status 4: a witness could not run here
    assert "witness-unavailable" in run.stdout and "rocm-guard" in run.stdout and "FAILED" in run.stdout
    allowed = subprocess.run(
        ["python", "-m", "sglpatch", "--root", str(fake_project.root), "apply", "0.1.0", "--allow-unavailable"],
        capture_output=True, text=True,
    )
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "UNPROVEN" in allowed.stdout


def _commit_on_the_branch(tree, name="mine.txt"):
    (tree / name).write_text("my own work\n")
    git(tree, "add", name)
    git(tree, "-c", "user.name=Me", "-c", "user.email=me@example.com", "commit", "-q", "-m", "my own patch")
    return git(tree, "rev-parse", "HEAD").strip()


def test_apply_never_drops_a_commit_the_user_made_on_the_branch(fake_project, tmp_path):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path))])
    assert apply_text(fake_project.project, ["0.1.0"]).ok
    tree = fake_project.root / "build" / "trees" / "0.1.0"
    mine = _commit_on_the_branch(tree)
    # The series changes, so the branch would move to a new commit.
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path)), ("0002-example.patch", _example_patch(tmp_path))])
    lock_before = (fake_project.root / "series.lock").read_text()
    report = apply_text(fake_project.project, ["0.1.0"], update_lock=True)
    _, result = _outcomes(report, "0.1.0")
    assert not result.ok
    assert mine[:12] in result.error and "my own patch" in result.error and "format-patch" in result.error
    assert "--discard-local" in result.error
    assert git(tree, "rev-parse", "sglpatch").strip() == mine and (tree / "mine.txt").exists()
    assert (fake_project.root / "series.lock").read_text() == lock_before
    # The command it names exports the commit.
    command = result.error.split("(git -C ", 1)[1].split(")", 1)[0].replace("<folder>", str(tmp_path / "exported"))
    subprocess.run(["git", "-C", *command.split()], check=True, capture_output=True)
    assert [p.name for p in (tmp_path / "exported").iterdir()] == ["0001-my-own-patch.patch"]
    # Only the explicit flag drops it.
    report = apply_text(fake_project.project, ["0.1.0"], update_lock=True, discard_local=True)
    assert report.ok and not (tree / "mine.txt").exists()


@pytest.mark.parametrize("elsewhere", [["checkout", "-q", "--detach"], ["checkout", "-q", "-b", "mine"]])
def test_a_warm_apply_puts_head_back_on_the_branch_from_a_detached_head_or_another_branch(fake_project, tmp_path, elsewhere):
    # The tree's commit is right but HEAD is not the sglpatch branch: the warm run must tell the two apart.
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path))])
    assert apply_text(fake_project.project, ["0.1.0"]).ok
    tree = fake_project.root / "build" / "trees" / "0.1.0"
    commit = git(tree, "rev-parse", "HEAD").strip()
    git(tree, *elsewhere)
    assert apply_text(fake_project.project, ["0.1.0"]).ok
    assert git(tree, "symbolic-ref", "HEAD").strip() == "refs/heads/sglpatch"
    assert git(tree, "rev-parse", "HEAD").strip() == commit


def test_apply_never_overwrites_an_untracked_file_of_the_user(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    assert apply_text(fake_project.project, ["0.1.0"]).ok
    tree = fake_project.root / "build" / "trees" / "0.1.0"
    new_file = "python/sglang/srt/new_module.py"
    files = tree_files("0.1.0")
    patch = format_patch(tmp_path, files, {new_file: "print('from the series')\n"}, "add a module")
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path)), ("0002-new.patch", patch)])
    (tree / new_file).write_text("my untracked draft\n")
    _, result = _outcomes(apply_text(fake_project.project, ["0.1.0"], update_lock=True), "0.1.0")
    assert not result.ok and new_file in result.error
    assert (tree / new_file).read_text() == "my untracked draft\n"


def test_the_witness_command_runs_witnesses_and_changes_nothing(fake_project, tmp_path):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path, trailers={"Witness": "rocm-guard"}))])
    run = subprocess.run(["python", "-m", "sglpatch", "--root", str(fake_project.root), "witness", "--allow-unavailable"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0.1.0" in run.stdout and "UNPROVEN" in run.stdout
    assert not (fake_project.root / "series.lock").exists()
    assert not (fake_project.root / "build").exists()


def test_witnessing_without_recording_compares_with_the_lock_and_moves_no_branch(fake_project, tmp_path, test_witnesses):
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path, trailers={"Witness": "guard-text"}))])
    assert apply_series(fake_project.project, ["0.1.0"]).ok
    tree = fake_project.root / "build" / "trees" / "0.1.0"
    lock_before, head_before = (fake_project.root / "series.lock").read_text(), git(tree, "rev-parse", "HEAD")
    report = apply_series(fake_project.project, ["0.1.0"], out_dir=tmp_path / "scratch", record=False)
    assert report.ok and report.results[0].lock == "matches"
    assert report.results[0].patches[0].witness_after.startswith("clean")
    fake_project.set_patches([("0001-guard.patch", _guard_patch(tmp_path, trailers={"Witness": "guard-text"},
                                                               body="Another message."))])
    differs = apply_series(fake_project.project, ["0.1.0"], out_dir=tmp_path / "scratch2", record=False)
    assert not differs.ok and "differs from the lock" in differs.results[0].error
    assert (fake_project.root / "series.lock").read_text() == lock_before and git(tree, "rev-parse", "HEAD") == head_before


def test_a_witness_checkout_moved_to_the_next_commit_holds_exactly_that_commit(tmp_path):
    from sglpatch.apply.checkouts import Checkouts, checkout_commit

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "kept.py").write_text("kept\n")
    (repo / "untouched.py").write_text("no patch touches this\n")
    (repo / "gone").mkdir()
    (repo / "gone" / "only.py").write_text("removed with its folder\n")
    (repo / "changed.py").write_text("before\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "old")
    old = git(repo, "rev-parse", "HEAD").strip()
    (repo / "gone" / "only.py").unlink()
    (repo / "changed.py").write_text("after\n")
    (repo / "new").mkdir()
    (repo / "new" / "tool.sh").write_text("#!/bin/sh\n")
    (repo / "new" / "tool.sh").chmod(0o755)
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "new")
    new = git(repo, "rev-parse", "HEAD").strip()

    def listing(folder):
        return sorted((str(p.relative_to(folder)), p.read_bytes(), os.access(p, os.X_OK))
                      for p in folder.rglob("*") if p.is_file())

    with Checkouts(repo) as checkouts:
        first = checkouts.get(old)
        assert listing(first) == listing(checkout_commit(repo, old, tmp_path / "old"))
        moved = checkouts.get(new)
        assert listing(moved) == listing(checkout_commit(repo, new, tmp_path / "fresh"))
        assert not (moved / "gone").exists() and checkouts.refreshed == []
        # Something edits a file no commit changes (a test writing into the tree it judges), keeping
        # its size and setting its time back: the next commit is checked out afresh, never moved
        # on with the edit in it.
        edited = moved / "untouched.py"
        stat = edited.stat()
        edited.write_text("no patch touches thiz\n")
        os.utime(edited, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        (moved / "stray.txt").write_text("left by a witness\n")
        assert checkouts.changes() == ["stray.txt", "untouched.py"]
        back = checkouts.get(old)
        assert listing(back) == listing(tmp_path / "old") and checkouts.refreshed == [["stray.txt", "untouched.py"]]
        # Asked for the same commit again, an edited folder is not given back as it is either.
        (back / "kept.py").write_text("edited\n")
        assert listing(checkouts.get(old)) == listing(tmp_path / "old")
        folder = checkouts.folder
    assert not folder.exists()


def test_the_lock_records_each_witness_and_its_level_but_compares_only_the_result(fake_project, tmp_path):
    patch = _guard_patch(tmp_path, trailers={"Witness": "guard-text"})
    fake_project.set_patches([("0001-guard.patch", patch)])
    report = apply_series(fake_project.project, ["0.1.0"])
    assert report.ok, report.to_json()
    lock_path = fake_project.root / "series.lock"
    entry = json.loads(lock_path.read_text())["pins"]["0.1.0"]["patches"][0]
    assert entry["witness"] == {"pristine": "bug [text]", "patched": "clean [text]"}
    from sglpatch.apply.report import render_apply

    assert "witnessed at: 0001 text" in render_apply(report)
    # Another machine whose witness ran at another level reproduces the same result: it matches.
    locked = json.loads(lock_path.read_text())
    locked["pins"]["0.1.0"]["patches"][0]["witness"] = {"pristine": "bug [stronger]", "patched": "clean [stronger]"}
    lock_path.write_text(json.dumps(locked, indent=2) + "\n")
    again = apply_series(fake_project.project, ["0.1.0"])
    assert again.ok and again.results[0].lock == "matches", again.to_json()
    assert json.loads(lock_path.read_text()) == locked  # nothing rewritten without --update-lock
    text_only = apply_text(fake_project.project, ["0.1.0"])
    assert text_only.results[0].lock == "matches" and "no witness ran" in render_apply(text_only)


def test_a_pin_line_whose_compile_witness_ran_at_the_include_graph_level_says_how_to_get_the_compile():
    from sglpatch.apply.one_pin import PatchOutcome, PinResult
    from sglpatch.apply.report import witness_levels

    result = PinResult("0.5.14", "t", patches=[
        PatchOutcome("0001-guard.patch", "applied", witness_before="bug [include-graph gfx942,gfx950]",
                     witness_after="clean [include-graph gfx942,gfx950]")])
    line = witness_levels(result)
    assert line.startswith("0001 include-graph gfx942,gfx950, nothing compiled; for hip-compile: bash ci/install-hip-toolchain.sh")


# -- git's three-way apply from the blobs a rendition was made on ------------------------------

CHANGED_17 = "0.2.5 changed line 17\n"


def _pin_with_line_17_changed(fake_project):
    """A third pin, 0.2.5, whose example.py changed line 17: in the context of a patch of line 20,
    so a rendition made on 0.1.0 does not apply to it exactly."""
    from conftest import BASE_FILES, make_wheel, pin_entry

    wheel = make_wheel(fake_project.index, "0.2.5", {**BASE_FILES, "sglang/srt/layers/example.py": example_lines({17: CHANGED_17})})
    pins = fake_project.root / "upstream" / "pins.toml"
    pins.write_text(pins.read_text() + pin_entry("0.2.5", wheel))


def test_a_rendition_made_on_another_pin_applies_three_way_from_that_pins_blobs_and_leaves_no_alternates(fake_project, tmp_path):
    _pin_with_line_17_changed(fake_project)
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])  # made on 0.1.0, Applies-To >=0.1
    report = apply_text(fake_project.project)
    assert report.ok, report.to_json()
    outcomes, result = _outcomes(report, "0.2.5")
    outcome = outcomes["0001-example.patch"]
    assert outcome.status == "applied-three-way"
    # The pin nearest 0.2.5 that the rendition covers lent the pre-image blobs.
    assert outcome.detail == "three-way from the blobs it was made on (lent by 0.2.0's pristine tree)"
    tree = fake_project.root / "build" / "trees" / "0.2.5"
    # The pin's own change upstream kept, the patch's change made.
    assert (tree / EXAMPLE).read_text() == example_lines({17: CHANGED_17, 20: "line twenty, patched\n"})
    assert git(tree, "status", "--porcelain").strip() == ""
    assert git(tree, "log", "--format=%s", "pristine..sglpatch").splitlines() == ["example: patch line 20"]
    # The lent tree was borrowed for the one git call: the tree repository keeps no link to the
    # cache, and holds every object of its commits itself.
    assert not (tree / ".git" / "objects" / "info" / "alternates").exists()
    git(tree, "fsck", "--connectivity-only", "--no-dangling")
    assert json.loads((fake_project.root / "series.lock").read_text())["pins"]["0.2.5"]["patches"][0]["status"] == "applied-three-way"
    # The pins it was made for apply it exactly, as before.
    for version in ("0.1.0", "0.2.0"):
        assert _outcomes(report, version)[0]["0001-example.patch"].status == "applied"


def test_without_a_covered_pin_to_lend_the_blobs_a_rendition_that_needs_three_way_is_a_conflict(fake_project, tmp_path):
    from sglpatch.apply.one_pin import apply_pin
    from sglpatch.sources import pristine_tree

    _pin_with_line_17_changed(fake_project)
    # Made on 0.1.0's file, but its Applies-To covers only 0.2.5: no pin it covers holds its blobs.
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path, trailers={"Applies-To": ">=0.2.5"}))])
    report = apply_text(fake_project.project)
    outcomes, result = _outcomes(report, "0.2.5")
    outcome = outcomes["0001-example.patch"]
    assert outcome.status == "conflict" and not result.ok
    assert "three-way: no pinned tree holds the blobs it was made on (" in outcome.detail
    assert f"hunk 1 of {EXAMPLE}" in outcome.detail  # what the exact apply found, as before
    assert not (fake_project.root / "build" / "trees" / "0.2.5" / EXAMPLE).exists()
    # Nor when apply is given no pins at all, even where the rendition covers the pins that hold them.
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    project = fake_project.project
    pin = project.pins().select(["0.2.5"])[0]
    alone = apply_pin(pin, project.series(), pristine_tree.pristine_from_index(pin), tmp_path / "alone", project.lock_file,
                      run_witnesses=False, record=False, pins=())
    assert [o.status for o in alone.patches] == ["conflict"]
    assert "no pinned tree holds the blobs it was made on" in alone.patches[0].detail
    assert not (tmp_path / "alone" / "0.2.5" / ".git" / "objects" / "info" / "alternates").exists()


def test_no_witnesses_on_a_pin_whose_trees_are_the_locks_matches_and_names_the_verdicts_it_did_not_check(
    fake_project, tmp_path, capsys
):
    # On 0.2.0 upstream already has the guard, byte for byte: the lock (witnessed) says not-needed,
    # text alone says already-upstream. Trees and commits are the lock's, so nothing differs that
    # --no-witnesses decided; it says which verdict it left unchecked instead of failing.
    from conftest import BASE_FILES, make_wheel, pin_entry
    from sglpatch import cli
    from sglpatch import exitcodes

    files = tree_files("0.1.0")
    guarded = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    wheel = make_wheel(fake_project.index, "0.2.0", {**BASE_FILES, "sglang/jit_kernel/csrc/kernel.cuh": guarded})
    pins = fake_project.root / "upstream" / "pins.toml"
    text = pins.read_text()
    pins.write_text(text[: text.index("[[pin]]", text.index("0.1.0"))] + pin_entry("0.2.0", wheel))
    fake_project.set_patches([
        ("0001-guard.patch", format_patch(tmp_path, files, {KERNEL: guarded}, "kernel: guard", trailers={"Witness": "guard-text"})),
        ("0002-example.patch", _example_patch(tmp_path)),
    ])
    assert apply_series(fake_project.project, allow_unavailable=True).ok
    lock_file = fake_project.root / "series.lock"
    lock = lock_file.read_bytes()
    assert json.loads(lock)["pins"]["0.2.0"]["patches"][0]["status"] == "not-needed"
    for extra in ([], ["--update-lock"]):
        status = cli.main(["-q", "--root", str(fake_project.root), "apply", "0.2.0", "--no-witnesses", *extra])
        out = capsys.readouterr().out
        assert status == exitcodes.OK, out
        assert "lock: matches" in out and "differs" not in out and "Outcome." not in out
        assert "not checked without witnesses: 0001-guard.patch not-needed (text alone: already-upstream)" in out
        assert lock_file.read_bytes() == lock  # the witnessed verdict stays; --update-lock has nothing to take
    data = json.loads((fake_project.root / "build" / "apply-report.json").read_text())
    assert data["pins"][0]["lock"] == "matches" and data["pins"][0]["unchecked"] == [
        "0001-guard.patch not-needed (text alone: already-upstream)"]
    # What text alone decides is still compared: another tree is a difference from the lock.
    fake_project.set_patches([
        ("0001-guard.patch", format_patch(tmp_path, files, {KERNEL: guarded}, "kernel: guard", trailers={"Witness": "guard-text"})),
        ("0002-example.patch", _example_patch(tmp_path, text="changed differently\n")),
    ])
    assert cli.main(["-q", "--root", str(fake_project.root), "apply", "0.2.0", "--no-witnesses"]) == exitcodes.LOCK_MISMATCH
    assert lock_file.read_bytes() == lock
