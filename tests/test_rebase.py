"""Porting the series to a release that is not pinned: every rendition tried nearest first, the
witness deciding, the report saying what was tried, and nothing written unless all is settled."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import BASE_FILES, REPO_ROOT, TextWitness, example_lines, format_patch, make_wheel, pin_entry, tree_files
from sglpatch.apply import staged
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.project import Project
from sglpatch.rebase.hand_port import refresh_hand_port
from sglpatch.rebase.onto import rebase_onto
from sglpatch.rebase.report import RebaseOutcome, RebaseReport
from sglpatch.rebase.trial import Trial, candidates
from sglpatch.series.lock import read_lock
from sglpatch.series.patches import load_series, spec_for
from sglpatch.sources.pins import load_pins
from sglpatch.witnesses import registry
from sglpatch.witnesses.results import BUG, CLEAN, WitnessResult

EXAMPLE = "python/sglang/srt/layers/example.py"
OLD_KERNEL = "sglang/jit_kernel/csrc/kernel.cuh"
NEW_KERNEL = "sglang/kernels/jit/csrc/kernel.cuh"


class EitherPathGuard:
    """Test witness: the CUDA include is guarded in the kernel, at its old or its new path."""

    name = "kernel-guard"
    version = "1"

    def run(self, tree, pin) -> WitnessResult:
        for path in (OLD_KERNEL, NEW_KERNEL):
            kernel = tree / "python" / path
            if kernel.exists():
                guarded = "#ifndef USE_ROCM" in kernel.read_text()
                return WitnessResult(self.name, CLEAN if guarded else BUG, "text", f"{path} guarded: {guarded}")
        return WitnessResult(self.name, BUG, "text", "no kernel")


LOCAL_WITNESSES = {
    "example-20": TextWitness("example-20", EXAMPLE, "patched"),
    "example-30": TextWitness("example-30", EXAMPLE, "line 30 fixed"),
    "kernel-guard": EitherPathGuard(),
}


def _import_with_this_python(self, commit, changed):
    """The judge's import smoke for the small test releases: each touched module that its release
    file parses as Python, really imported (this interpreter, the candidate tree on the path)."""
    import tempfile as _tempfile
    from pathlib import Path as _Path

    from sglpatch.apply.checkouts import checkout_commit

    tree = checkout_commit(self.repo, commit, _Path(_tempfile.mkdtemp(dir=self.scratch, prefix="imports-")))
    findings = []
    for path in changed:
        if not (path.startswith("python/") and path.endswith(".py")) or not (tree / path).exists():
            continue
        try:
            compile((tree / path).read_text(), path, "exec")
        except SyntaxError:
            if "patched" in (tree / path).read_text():  # the line-numbered test files are no Python
                continue
        module = path[len("python/"):-3].replace("/", ".")
        done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120,
                              env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tree / "python")})
        if done.returncode:
            findings.append(f"{module}: {done.stderr.strip().splitlines()[-1]}")
    IMPORTED.extend(m for m in changed)
    return findings


IMPORTED: list[str] = []


@pytest.fixture(autouse=True)
def local_imports(monkeypatch, request):
    """Test releases have no CPU Python of their own: the import smoke imports with this one. The
    real releases (``network``) keep the real one, the pin's CPU Python on the emulated box."""
    IMPORTED.clear()
    if request.node.get_closest_marker("network") is None:
        monkeypatch.setattr(Trial, "import_smoke", _import_with_this_python)


@pytest.fixture(autouse=True)
def local_witnesses(monkeypatch, test_witnesses):
    known = registry.registry
    monkeypatch.setattr(registry, "registry", lambda: {**known(), **LOCAL_WITNESSES})
    for witness in LOCAL_WITNESSES.values():
        if hasattr(witness, "runs"):
            witness.runs.clear()
    return LOCAL_WITNESSES


def _release(fake_project, version, example_text=None, files=None):
    make_wheel(fake_project.index, version, files or {**BASE_FILES, "sglang/srt/layers/example.py": example_text})


def _add_pin(fake_project, version, files):
    wheel = make_wheel(fake_project.index, version, files)
    pins = fake_project.root / "upstream" / "pins.toml"
    pins.write_text(pins.read_text() + pin_entry(version, wheel))


def _example_patch(tmp_path, witness="example-20", applies_to=">=0.1", base=None, line=20, subject=None):
    files = base or tree_files("0.1.0")
    return format_patch(
        tmp_path, files, {EXAMPLE: example_lines({line: "patched\n"})}, subject or f"example: patch line {line}",
        trailers={"Witness": witness, "Applies-To": applies_to},
    )


def _snapshot(root):
    return {path: path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file() and "build" not in path.parts}


def _verdicts(report):
    return [(o.name, o.verdict) for o in report.outcomes]


def test_patch_that_applies_as_is_carries_over_and_its_applies_to_grows_to_the_release(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", example_lines({5: "upstream changed line 5\n"}))
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "carries-over")]
    assert report.written and report.complete
    outcome = report.outcomes[0]
    assert (outcome.witness_before, outcome.witness_after) == ("bug [text]", "clean [text]")
    assert [(a.how, a.result) for a in outcome.attempts] == [("exact", "applies")]
    pin = load_pins(fake_project.root / "upstream" / "pins.toml").select(["0.3.0"])[0]
    assert pin.artifact.endswith(".whl") and not pin.commit and "rebase" in pin.commit_evidence
    # A flat folder index gives no upload time: the pin says where its date came from.
    with zipfile.ZipFile(fake_project.index / pin.artifact) as wheel:
        newest = max(info.date_time for info in wheel.infolist())
    assert pin.released == "{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}Z".format(*newest)
    assert "# released: the index gives no upload time" in (fake_project.root / "upstream" / "pins.toml").read_text()
    assert "Applies-To: >=0.1.0,<=0.3.0" in (fake_project.root / "patches" / "0001-example.patch").read_text()
    lock = read_lock(fake_project.root / "series.lock")["pins"]
    assert lock["0.3.0"]["patches"][0]["status"] == "applied"
    # The grown Applies-To changed the commit message, so the older pins were re-locked with it.
    assert set(report.relocked) == {"0.1.0", "0.2.0", "0.3.0"} and set(lock) == {"0.1.0", "0.2.0", "0.3.0"}


def test_release_between_two_pins_is_inserted_in_order_and_takes_the_nearest_rendition_that_applies(fake_project, tmp_path):
    changed = example_lines({17: "0.2.5 changed line 17\n"})
    _add_pin(fake_project, "0.2.5", {**BASE_FILES, "sglang/srt/layers/example.py": changed})
    # The main file is the newest rendition (0.2.5's); 0.1.0 and 0.2.0 have one of their own.
    newest = _example_patch(tmp_path, applies_to="==0.2.5", base={**tree_files("0.2.5"), EXAMPLE: changed})
    older = _example_patch(tmp_path, applies_to=">=0.1.0,<=0.2.0")
    fake_project.set_patches([("0001-example.patch", newest)], {"0001-example": [("0.2.0.patch", older)]})
    # 0.2.2 as 0.2.5 has it: the older neighbour's rendition does not apply, the newer one's does,
    # exactly -- it is taken before any three-way merge of the older one.
    _release(fake_project, "0.2.2", changed)
    report = rebase_onto(fake_project.project, "0.2.2", write=False)
    assert _verdicts(report) == [("0001-example.patch", "carries-over")]
    assert report.outcomes[0].rendition == "patches/0001-example.patch"
    assert [(a.rendition.split("/")[-1], a.how, a.result) for a in report.outcomes[0].attempts] == [
        ("0.2.0.patch", "exact", "does not apply"),
        ("0001-example.patch", "exact", "applies"),
    ]
    # 0.2.3 as 0.2.0 has it: both neighbours are one pin away; the older one's rendition is tried first.
    _release(fake_project, "0.2.3", example_lines({}))
    report = rebase_onto(fake_project.project, "0.2.3")
    assert report.outcomes[0].rendition == "patches/renditions/0001-example/0.2.0.patch"
    assert report.written
    text = (fake_project.root / "upstream" / "pins.toml").read_text()
    assert text.index('"0.2.0"') < text.index('"0.2.3"') < text.index('"0.2.5"')
    assert "Applies-To: >=0.1.0,<=0.2.3" in (fake_project.root / "patches" / "renditions" / "0001-example" / "0.2.0.patch").read_text()
    # The main file still holds the newest pin alone: nothing moved.
    assert "Applies-To: ==0.2.5" in (fake_project.root / "patches" / "0001-example.patch").read_text()


def test_candidates_are_ordered_nearest_release_first():
    series_dir = REPO_ROOT / "patches"
    patch = load_series(series_dir).get("0002-quark-keep-mtp-draft-excluded-modules-unquantized")
    pins = load_pins(REPO_ROOT / "upstream" / "pins.toml")
    newest = pins.newest.version
    ordered = candidates(patch, pins.pins, "99.0")
    assert ordered[0].rendition.covers(newest)
    ranks = [candidate.rank for candidate in ordered]
    assert ranks == sorted(ranks)


def test_changed_context_git_merges_three_way_carries_over_with_its_applies_to_grown_and_no_new_file(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path, subject="[AMD] example: patch line 20"))])
    main = fake_project.root / "patches" / "0001-example.patch"
    before = main.read_text()
    _release(fake_project, "0.3.0", example_lines({17: "upstream changed line 17\n"}))
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "carries-over")]
    outcome = report.outcomes[0]
    assert outcome.step == "three-way" and outcome.rendition == "patches/0001-example.patch"
    assert [(a.how, a.result, a.made_for) for a in outcome.attempts] == [
        ("exact", "does not apply", "0.2.0"),
        ("three-way", "merges", "0.2.0"),
    ]
    assert report.written
    # apply repeats the three-way step from the same blobs, so no rendition is made for 0.3.0: the
    # main file is the only one, and only its Applies-To changed (the rendition's own text, its
    # subject's tag included).
    assert sorted(p.relative_to(fake_project.root).as_posix() for p in (fake_project.root / "patches").rglob("*.patch")) == [
        "patches/0001-example.patch"]
    text = main.read_text()
    assert "Applies-To: >=0.1\n" in before
    assert text == before.replace("Applies-To: >=0.1\n", "Applies-To: >=0.1.0,<=0.3.0\n")
    assert "Subject: [PATCH] [AMD] example: patch line 20" in text and "upstream changed line 17" not in text
    lock = read_lock(fake_project.root / "series.lock")["pins"]
    assert [p["status"] for p in lock["0.3.0"]["patches"]] == ["applied-three-way"]
    assert [p["status"] for p in lock["0.2.0"]["patches"]] == ["applied"]
    from sglpatch.series.check import check_series

    project = fake_project.project
    assert check_series(project.patches_dir, project.pins()) == []


def test_conflict_writes_nothing_and_names_the_hunk(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", example_lines({20: "upstream rewrote line 20\n"}))
    before = _snapshot(fake_project.root)
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "needs-hand-port")]
    assert "hunk 1 of" in report.outcomes[0].attempts[0].detail
    # Every tool was tried and said why it made no tree.
    assert [a.how for a in report.outcomes[0].attempts] == ["exact", "three-way", "merge-ort", "merge-ort + both insertions", "wiggle",
                                                             "moved-definitions"]
    # The file is no Python the moved-definitions step can read: it says why it made no tree.
    assert "changes module-level lines" in report.outcomes[0].attempts[-1].detail
    assert not report.written and not report.complete
    assert _snapshot(fake_project.root) == before


def test_bug_fixed_differently_upstream_is_fixed_upstream_and_no_rendition_claims_the_release(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", example_lines({20: "patched upstream, their own way\n"}))
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "fixed-upstream")]
    assert report.outcomes[0].witness_before == "clean [text]"
    assert report.written
    # The main rendition claimed ">=0.1"; now it holds only the pins it was applied to.
    assert "Applies-To: >=0.1.0,<=0.2.0" in (fake_project.root / "patches" / "0001-example.patch").read_text()
    lock = read_lock(fake_project.root / "series.lock")["pins"]["0.3.0"]
    # No rendition claims the release: the patch has no entry there (series.lock locks a patch where it applies).
    assert lock["patches"] == []


def test_moved_file_whose_rendition_reverse_applies_is_already_upstream_not_fixed_differently(fake_project, tmp_path):
    old_files = tree_files("0.1.0")
    old = old_files["python/" + OLD_KERNEL]
    guard = lambda text: text.replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")  # noqa: E731
    older = format_patch(
        tmp_path, old_files, {"python/" + OLD_KERNEL: guard(old)}, "kernel: guard the CUDA include",
        trailers={"Witness": "kernel-guard", "Applies-To": ">=0.1.0,<=0.2.0"},
    )
    moved = {k: v for k, v in BASE_FILES.items() if k != OLD_KERNEL} | {NEW_KERNEL: BASE_FILES[OLD_KERNEL]}
    _add_pin(fake_project, "0.2.5", moved)
    moved_tree = {"python/" + k: v.format(version="0.2.5") for k, v in moved.items()}
    # The main file is the newest rendition: 0.2.5's, made for the kernel's new path.
    newest = format_patch(
        tmp_path, moved_tree, {"python/" + NEW_KERNEL: guard(BASE_FILES[OLD_KERNEL])}, "kernel: guard the CUDA include",
        trailers={"Witness": "kernel-guard", "Applies-To": "==0.2.5"},
    )
    fake_project.set_patches([("0001-guard.patch", newest)], {"0001-guard": [("0.2.0.patch", older)]})
    # Upstream took the very same guard at the new path.
    _release(fake_project, "0.3.0", files={**moved, NEW_KERNEL: guard(BASE_FILES[OLD_KERNEL])})
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-guard.patch", "already-upstream")]
    outcome = report.outcomes[0]
    assert outcome.rendition == "patches/0001-guard.patch"
    assert [(a.rendition, a.result) for a in outcome.attempts] == [
        ("patches/0001-guard.patch", "reverse-applies")
    ]
    assert report.written
    assert "Applies-To: >=0.2.5,<=0.3.0" in (fake_project.root / "patches" / "0001-guard.patch").read_text()
    assert "Applies-To: >=0.1.0,<=0.2.0" in (fake_project.root / "patches" / "renditions" / "0001-guard" / "0.2.0.patch").read_text()
    lock = read_lock(fake_project.root / "series.lock")["pins"]["0.3.0"]
    assert lock["patches"][0]["status"] == "not-needed"


def test_patch_whose_witness_still_finds_the_bug_is_refused_by_the_judge_and_needs_a_hand_port(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path, witness="example-30"))])
    _release(fake_project, "0.3.0", example_lines({17: "upstream changed line 17\n"}))
    before = _snapshot(fake_project.root)
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "needs-hand-port")]
    attempts = report.outcomes[0].attempts
    assert [(a.how, a.result, a.witness_after) for a in attempts[:2]] == [
        ("exact", "does not apply", ""),
        ("three-way", "merges", "bug [text]"),
    ]
    assert attempts[1].judge.startswith("refused: witness: example-30 says bug")
    assert "no candidate the judge accepts" in report.outcomes[0].detail and "example-30 says bug" in report.outcomes[0].detail
    assert not report.written and _snapshot(fake_project.root) == before


def test_patch_whose_witness_cannot_run_is_not_classified_and_nothing_is_written(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path, witness="fixture-unwitnessed"))])
    _release(fake_project, "0.3.0", example_lines({5: "upstream changed line 5\n"}))
    before = _snapshot(fake_project.root)
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "witness-unavailable")]
    assert not report.written and _snapshot(fake_project.root) == before


def test_a_trial_without_an_outcome_for_every_patch_is_not_complete():
    assert not RebaseReport("0.3.0", "a.whl", patches_in_series=2).complete
    report = RebaseReport("0.3.0", "a.whl", patches_in_series=1)
    report.outcomes.append(RebaseOutcome("0001", "carries-over"))
    assert report.complete
    report.error = "the staged apply failed"
    assert not report.complete


def test_a_trial_that_errors_writes_nothing(fake_project, tmp_path):
    patch = _example_patch(tmp_path).replace("Witness: example-20", "Witness: no-such-witness")
    fake_project.set_patches([("0001-example.patch", patch)])
    _release(fake_project, "0.3.0", example_lines({5: "upstream changed line 5\n"}))
    before = _snapshot(fake_project.root)
    with pytest.raises(SglpatchError, match="unknown witness 'no-such-witness'"):
        rebase_onto(fake_project.project, "0.3.0")
    assert _snapshot(fake_project.root) == before


def test_final_apply_that_fails_writes_nothing(fake_project, tmp_path, cache_dir):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", example_lines({5: "upstream changed line 5\n"}))
    # Every patch classifies on 0.3.0, but the grown Applies-To must re-lock 0.1.0, whose artifact
    # is gone from the index and from the cache: the staged apply of 0.1.0 fails.
    (fake_project.index / "sglang-0.1.0.tar.gz").unlink()
    for entry in (cache_dir / "pristine").glob("0.1.0-*"):
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for entry in (cache_dir / "artifacts").glob("sglang-0.1.0*"):
        entry.unlink()
    before = _snapshot(fake_project.root)
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "carries-over")]
    assert not report.written and not report.complete
    assert "does not apply to 0.1.0" in report.error and "nothing written" in report.error
    assert _snapshot(fake_project.root) == before


def test_a_cpu_matrix_cell_that_fails_on_the_staged_series_writes_nothing(fake_project, tmp_path, fake_release_cells):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", example_lines({5: "upstream changed line 5\n"}))
    fake_release_cells["cpu-spec-0.3.0-d4"] = "speculative_num_steps 4 resolves to 3"
    before = _snapshot(fake_project.root)
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "carries-over")]
    assert not report.written and not report.complete
    assert "cpu-spec-0.3.0-d4 says failed" in report.error and "1 of 8 did not pass" in report.error
    assert "nothing written" in report.error and "cpu-spec-0.3.0-d4 failed" in report.text()
    assert _snapshot(fake_project.root) == before


def test_files_are_moved_in_only_after_the_staged_apply_and_put_back_if_a_move_fails(fake_project, tmp_path, monkeypatch):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", example_lines({17: "upstream changed line 17\n"}))
    before = _snapshot(fake_project.root)
    real_replace = os.replace
    moved = []

    def replace(src, dst):
        inside = str(dst).startswith(str(fake_project.root))
        if inside and str(dst).endswith("series.lock"):
            raise OSError("disk full (test)")
        if inside:
            moved.append(dst)
        return real_replace(src, dst)

    monkeypatch.setattr(staged.os, "replace", replace)
    report = rebase_onto(fake_project.project, "0.3.0")
    assert moved, "the other files were moved before the lock failed"
    assert not report.written and "the files are as they were" in report.error
    assert _snapshot(fake_project.root) == before


def test_dry_run_classifies_and_writes_nothing(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", example_lines({17: "upstream changed line 17\n"}))
    before = _snapshot(fake_project.root)
    report = rebase_onto(fake_project.project, "0.3.0", write=False)
    # Classified (a carry-over by three-way, whose Applies-To would grow), and nothing written.
    assert _verdicts(report) == [("0001-example.patch", "carries-over")] and report.complete
    assert report.outcomes[0].step == "three-way" and "patches/0001-example.patch" in report.files
    assert not report.written and _snapshot(fake_project.root) == before


def test_cli_rebase_prints_every_try_and_writes_a_json_report(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", example_lines({20: "upstream rewrote line 20\n"}))
    done = subprocess.run(
        [sys.executable, "-m", "sglpatch", "--root", str(fake_project.root), "rebase", "0.3.0", "--dry-run", "--json"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=300,
    )
    # The subprocess has the real witnesses only, so the test witness is unknown there: the CLI
    # must say so in one line, not a traceback.
    assert done.returncode == 2 and "unknown witness 'example-20'" in done.stderr and "Traceback" not in done.stderr
    report = rebase_onto(fake_project.project, "0.3.0", write=False)
    text = report.text()
    assert "tried patches/0001-example.patch exact from 0.2.0: does not apply" in text
    assert "tried patches/0001-example.patch three-way from 0.2.0: conflict" in text
    assert json.loads(json.dumps(report.to_dict()))["complete"] is False


def test_already_pinned_version_is_refused(fake_project):
    with pytest.raises(SglpatchError, match="already pinned"):
        rebase_onto(fake_project.project, "0.2.0")


@pytest.mark.parametrize("given, says", [
    ("banana", "sglpatch: error: 'banana' is not a version: rebase takes an sglang release, such as one newer than "
               "the newest pin (0.2.0)"),
    ("0.0.9", "sglpatch: error: sglang 0.0.9 is older than every pin (the oldest is 0.1.0): rebase ports the series "
              "forward"),
    ("0.3.0", "sglpatch: error: sglang 0.3.0 is not on the package index "),
])
def test_what_rebase_cannot_port_is_refused_in_one_line_before_it_starts(fake_project, tmp_path, given, says):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.0.9", example_lines())  # on the index, but older than every pin
    before = _snapshot(fake_project.root)
    done = subprocess.run([sys.executable, "-m", "sglpatch", "--root", str(fake_project.root), "rebase", given],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(says), line
    if given == "0.3.0":
        assert line.endswith("; the newest there is 0.2.0"), line
    assert _snapshot(fake_project.root) == before and not (fake_project.root / "build").exists()


def test_a_release_older_than_every_pin_is_ported_back_only_when_asked(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.0.9", example_lines())
    with pytest.raises(SglpatchError, match="older than every pin .*--backwards ports it back anyway"):
        rebase_onto(fake_project.project, "0.0.9", write=False)
    report = rebase_onto(fake_project.project, "0.0.9", write=False, backwards=True)
    assert _verdicts(report) == [("0001-example.patch", "carries-over")] and report.complete


def test_spec_for_holds_exactly_the_given_pins():
    pinned = ["0.1.0", "0.2.0", "0.2.5", "0.3.0"]
    assert spec_for(["0.2.0"], pinned) == "==0.2.0"
    assert spec_for(["0.2.0", "0.2.5", "0.3.0"], pinned) == ">=0.2.0,<=0.3.0"
    assert spec_for(["0.1.0", "0.3.0"], pinned) is None


# -- the real series on real releases, each left out as if never seen ---------------------------------


@pytest.mark.network
def test_leave_one_out_copy_holds_no_file_made_for_the_release_it_left_out(tmp_path):
    from sglpatch.rebase.leave_one_out import leave_out

    done = leave_out(REPO_ROOT, "0.5.23", tmp_path / "copy")
    project = Project(tmp_path / "copy")
    assert "0.5.23" not in [pin.version for pin in project.pins().pins]
    assert "0.5.23" not in read_lock(project.lock_file)["pins"]
    for patch in project.series().patches:
        for rendition in patch.renditions:
            assert not rendition.covers("0.5.23"), rendition.path
    # 0002's and 0003's main files cover 0.5.22 and 0.5.23 (0002 on 0.5.22 by a three-way apply): each is
    # made again for 0.5.22 from that pin's locked commit, so neither holds what was made for 0.5.23.
    assert done["remade"] == [
        f"patches/{name} -> patches/{name} (each made for its pin from the pin's locked commit)"
        for name in ("0002-quark-keep-mtp-draft-excluded-modules-unquantized.patch",
                     "0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default.patch")
    ]
    for name in ("0002-quark-keep-mtp-draft-excluded-modules-unquantized.patch",
                 "0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default.patch"):
        assert project.series().get(name).main.trailer("Applies-To") == "==0.5.22"
    original = {p.name: p for p in Project(REPO_ROOT).series().patches}
    for name in ("0002-quark-keep-mtp-draft-excluded-modules-unquantized.patch",
                 "0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default.patch"):
        assert project.series().get(name).main.diff_text != original[name].main.diff_text
    # 0001 is committed on no pin its main file covers (upstream has it): its text stays, its range narrowed.
    assert done["narrowed"] == ["patches/0001-amd-guard-cuda-runtime-include-fused-metadata-copy.patch: >=0.5.17,<=0.5.22"]


@pytest.mark.network
def test_a_release_left_out_whose_renditions_still_apply_is_ported_to_the_committed_tree_and_lock(tmp_path):
    from sglpatch.rebase.leave_one_out import rebase_left_out

    row = rebase_left_out(REPO_ROOT, "0.5.12.post1", tmp_path)
    assert row["ported"] and row["written"] and row["identical"], row
    # The release's real CPU cells answered on the staged series, every one of them, and passed:
    # computed now, or replayed from an earlier run on the same trees and code (cells_replayed says which).
    assert row["cells"] == [f"cpu-{check}-0.5.12.post1{depth} passed"
                            for check, depth in [("build", ""), ("load", ""), *(("spec", f"-d{d}") for d in range(1, 7))]], row
    assert set(row["cells_replayed"]) <= {cell.split(" ")[0] for cell in row["cells"]}
    assert [(p["verdict"], p["step"]) for p in row["patches"]] == [("carries-over", "exact")] * 3


@pytest.mark.network
def test_a_release_across_the_file_move_is_ported_by_the_merge_tools_from_its_neighbours(tmp_path):
    # 0.5.17 moved the settings into namespaces; no rendition made for it is in the copy, so 0003
    # comes from 0.5.16's or 0.5.18's and must pass the judge. Since series v9 0003's renditions
    # before 0.5.21 touch only the KV default (arg_groups/overrides.py) and ServerArgs' own
    # methods, none of which reads a moved setting, so a neighbour's applies exactly. 0002 touches
    # only glm4_moe.py there, unchanged from 0.5.16: its 0.5.16 rendition applies exactly.
    from sglpatch.rebase.leave_one_out import rebase_left_out

    row = rebase_left_out(REPO_ROOT, "0.5.17", tmp_path, write=False)
    assert row["ported"], row
    verdicts = {p["name"][:4]: (p["verdict"], p["step"]) for p in row["patches"]}
    assert verdicts["0001"] == ("already-upstream", "")
    assert verdicts["0002"] == ("carries-over", "exact"), verdicts
    assert verdicts["0003"] == ("carries-over", "exact"), verdicts


@pytest.mark.network
def test_a_line_using_a_name_only_the_newer_release_has_is_written_as_the_older_rendition_writes_it(tmp_path):
    # 0.5.22's 0003 calls attn_dp_enabled_of(view), which 0.5.22 added; a merge tool carries it onto
    # 0.5.21 and the judge refuses that name. The older rendition writes that line
    # view.enable_dp_attention, which 0.5.21 has: with it the port passes the judge. (It is not the
    # committed tree: the committed rendition's docstring names 0.5.21's
    # apply_aiter_all_reduce_fusion where the port keeps 0.5.22's aiter_ar_fusion_applies, a comment
    # no judge reads.)
    from sglpatch.rebase.leave_one_out import rebase_left_out

    row = rebase_left_out(REPO_ROOT, "0.5.21", tmp_path, write=False)
    assert row["ported"], row
    by_name = {p["name"][:4]: p for p in row["patches"]}
    assert by_name["0003"]["verdict"] == "new-rendition" and by_name["0003"]["step"].endswith(" + sibling lines"), row


@pytest.mark.network
def test_a_release_whose_code_was_rewritten_is_ported_from_its_neighbours_with_both_insertions(tmp_path):
    # 0.5.14 rewrote ServerArgs' fields as annotated ones. Up to series v8 0003 added a field there
    # and no tool merged it (a hand port); since v9 its renditions before 0.5.21 add no field, and
    # merge-ort ports 0.5.13's onto 0.5.14, as it ports 0002's, each keeping both sides' insertions
    # where they meet. The hand-port path itself is covered by the fake project's tests above.
    from sglpatch.rebase.leave_one_out import rebase_left_out

    row = rebase_left_out(REPO_ROOT, "0.5.14", tmp_path, write=False)
    assert row["ported"], row
    by_name = {p["name"][:4]: p for p in row["patches"]}
    assert by_name["0001"]["verdict"] == "carries-over"
    for patch in ("0002", "0003"):
        assert (by_name[patch]["verdict"], by_name[patch]["step"]) == ("new-rendition", "merge-ort + both insertions"), row


# -- the cascade past a three-way merge, and the judge -----------------------------------------------

QUARK = "python/sglang/srt/layers/quant.py"
QUARK_PRISTINE = '''import logging
import re

logger = logging.getLogger(__name__)


class QuantConfig:

    def __init__(self, layers):
        self.layers = layers
        self.quantized = set()

    def is_excluded(self, name):
        return name in self.layers
'''
# Upstream annotated the line next to the one the patch changes: git's merges conflict there.
QUARK_UPSTREAM = QUARK_PRISTINE.replace("    def is_excluded(self, name):\n", "    def is_excluded(self, name: str) -> bool:\n")
QUARK_PATCHED = QUARK_PRISTINE.replace(
    "logger = logging.getLogger(__name__)\n\n",
    'logger = logging.getLogger(__name__)\n\n# Modules a draft builds as model.<name>.\n_DRAFT_MODULES = ("eh_proj", "enorm")\n\n',
).replace("        return name in self.layers\n", "        return name in self.layers or name.startswith(_DRAFT_MODULES)\n")


def _python_pin(fake_project, tmp_path, files_025: dict, patched: dict, witness: str, subject: str):
    """A pin 0.2.5 holding real Python modules and a patch made for it alone."""
    _add_pin(fake_project, "0.2.5", {**BASE_FILES, **files_025})
    tree = {**tree_files("0.2.5"), **{"python/" + k: v for k, v in files_025.items()}}
    patch = format_patch(tmp_path, tree, patched, subject, trailers={"Witness": witness, "Applies-To": "==0.2.5"})
    fake_project.set_patches([("0001-draft.patch", patch)])


def _made_into_the_main_file(fake_project, report, before: str) -> str:
    """The text of the rendition a merge tool made for 0.3.0 (newer than every pin), checked to be
    the main file now, with the main file's old text (``before``) kept as 0.2.5's rendition."""
    assert report.written and report.outcomes[0].rendition == "patches/0001-draft.patch"
    patches = fake_project.root / "patches"
    assert sorted(p.relative_to(patches).as_posix() for p in patches.rglob("*.patch")) == [
        "0001-draft.patch", "renditions/0001-draft/0.2.5.patch"]
    assert (patches / "renditions" / "0001-draft" / "0.2.5.patch").read_text() == before
    text = (patches / "0001-draft.patch").read_text()
    assert "Applies-To: ==0.3.0" in text and text != before
    return text


def test_context_git_cannot_merge_is_merged_by_wiggle_and_judged_before_it_is_accepted(fake_project, tmp_path, local_witnesses):
    local_witnesses["draft"] = TextWitness("draft", QUARK, "_DRAFT_MODULES")
    _python_pin(fake_project, tmp_path, {"sglang/srt/layers/quant.py": QUARK_PRISTINE}, {QUARK: QUARK_PATCHED}, "draft", "quant: keep draft modules")
    _release(fake_project, "0.3.0", files={**BASE_FILES, "sglang/srt/layers/quant.py": QUARK_UPSTREAM})
    before = (fake_project.root / "patches" / "0001-draft.patch").read_text()
    report = rebase_onto(fake_project.project, "0.3.0")
    outcome = report.outcomes[0]
    assert (outcome.verdict, outcome.step) == ("new-rendition", "wiggle"), report.text()
    tried = [(a.how, a.result.split(" (")[0], a.judge.split(" (")[0]) for a in outcome.attempts]
    assert tried[:3] == [("exact", "does not apply", ""), ("three-way", "conflict", ""), ("merge-ort", "no tree", "")]
    # Both sides changed lines there, so it is no pair of insertions either.
    assert tried[3] == ("merge-ort + both insertions", "no tree", "")
    assert "a conflict changes lines both sides had" in outcome.attempts[3].detail
    assert tried[4][0] == "wiggle" and tried[4][2] == "accepted"
    assert "quant.py" in " ".join(IMPORTED)  # the judge imported the module it touched
    text = _made_into_the_main_file(fake_project, report, before)
    assert "+_DRAFT_MODULES" in text and " def is_excluded(self, name: str) -> bool:" in text


COMM = "python/sglang/srt/layers/comm.py"
COMM_016 = '''from sglang.srt.context import get_server_args


def use_fusion(batch_size):
    return (
        get_server_args().enable_fusion
        and batch_size > 0
    )
'''
COMM_PATCHED = COMM_016.replace("        and batch_size > 0\n", "        and batch_size > 0\n        and not get_server_args().fusion_in_prefill\n")
# The next release reads its settings through namespaces: the patch's added line still merges.
COMM_017 = COMM_016.replace("get_server_args", "get_exec").replace("get_exec().enable_fusion", "get_exec().comm.enable_fusion")
CONTEXT = "def get_exec():\n    return None\n\n\ndef get_server_args():\n    return None\n"


def test_a_merge_that_uses_a_name_the_release_renamed_is_refused_with_the_finding(fake_project, tmp_path, local_witnesses):
    local_witnesses["prefill"] = TextWitness("prefill", COMM, "fusion_in_prefill")
    files = {"sglang/srt/layers/comm.py": COMM_016, "sglang/srt/context.py": CONTEXT}
    _python_pin(fake_project, tmp_path, files, {COMM: COMM_PATCHED}, "prefill", "comm: keep prefill unfused")
    _release(fake_project, "0.3.0", files={**BASE_FILES, **files, "sglang/srt/layers/comm.py": COMM_017})
    before = _snapshot(fake_project.root)
    report = rebase_onto(fake_project.project, "0.3.0")
    outcome = report.outcomes[0]
    assert outcome.verdict == "needs-hand-port", report.text()
    made = [a for a in outcome.attempts if a.judge]
    assert made, "some tool merged the added line"
    assert all(a.judge.startswith("refused: names:") for a in made)
    assert any("undefined name 'get_server_args'" in f for a in made for f in a.findings)
    assert not report.written and _snapshot(fake_project.root) == before
    assert "undefined name 'get_server_args'" in outcome.detail


OLD_PLACE = "python/sglang/srt/old_place.py"
NEW_PLACE = "python/sglang/srt/utils/new_place.py"
PLACE = "".join(f"value_{n} = {n}\n" for n in range(1, 31))


class EitherPlace:
    name, version = "either-place", "1"

    def run(self, tree, pin):
        for path in (OLD_PLACE, NEW_PLACE):
            if (tree / path).exists():
                fixed = "value_15 = 1500" in (tree / path).read_text()
                return WitnessResult(self.name, CLEAN if fixed else BUG, "text", path)
        return WitnessResult(self.name, BUG, "text", "no file")


def test_a_file_the_release_moved_is_followed_by_gits_merge_with_rename_detection(fake_project, tmp_path, local_witnesses):
    local_witnesses["either-place"] = EitherPlace()
    _python_pin(fake_project, tmp_path, {"sglang/srt/old_place.py": PLACE}, {OLD_PLACE: PLACE.replace("value_15 = 15", "value_15 = 1500")},
                "either-place", "place: value 15")
    moved = PLACE.replace("value_2 = 2\n", "value_2 = 20\n")
    _release(fake_project, "0.3.0", files={**BASE_FILES, "sglang/srt/utils/new_place.py": moved})
    before = (fake_project.root / "patches" / "0001-draft.patch").read_text()
    report = rebase_onto(fake_project.project, "0.3.0")
    outcome = report.outcomes[0]
    assert (outcome.verdict, outcome.step) == ("new-rendition", "merge-ort"), report.text()
    assert [a.how for a in outcome.attempts] == ["exact", "three-way", "merge-ort"]
    text = _made_into_the_main_file(fake_project, report, before)
    assert "+++ b/python/sglang/srt/utils/new_place.py" in text and "+value_15 = 1500" in text and "old_place" not in text


FUSION = "python/sglang/srt/fusion.py"
DEFAULTS = "python/sglang/srt/defaults.py"
FUSION_TEXT = "".join(f"setting_{n} = False\n" for n in range(1, 31))
DEFAULTS_TEXT = "".join(f"default_{n} = None\n" for n in range(1, 21))


def test_hunks_the_release_holds_and_files_it_removed_are_dropped_when_the_judge_is_satisfied(fake_project, tmp_path, local_witnesses):
    local_witnesses["fusion"] = TextWitness("fusion", FUSION, "setting_25 = True")
    fixed = FUSION_TEXT.replace("setting_3 = False", "setting_3 = True").replace("setting_25 = False", "setting_25 = True")
    _python_pin(fake_project, tmp_path, {"sglang/srt/fusion.py": FUSION_TEXT, "sglang/srt/defaults.py": DEFAULTS_TEXT},
                {FUSION: fixed, DEFAULTS: DEFAULTS_TEXT.replace("default_10 = None", "default_10 = 'fp8'")},
                "fusion", "fusion: on by default")
    # Upstream took the first hunk itself and removed defaults.py.
    _release(fake_project, "0.3.0", files={**BASE_FILES, "sglang/srt/fusion.py": FUSION_TEXT.replace("setting_3 = False", "setting_3 = True")})
    before = (fake_project.root / "patches" / "0001-draft.patch").read_text()
    report = rebase_onto(fake_project.project, "0.3.0")
    outcome = report.outcomes[0]
    assert (outcome.verdict, outcome.step) == ("new-rendition", "reduced exact"), report.text()
    assert "dropped python/sglang/srt/defaults.py: every hunk (1), the release removed the file" in outcome.detail
    assert "dropped python/sglang/srt/fusion.py: hunk 1 (at line 1), the release already holds it" in outcome.detail
    text = _made_into_the_main_file(fake_project, report, before)
    assert "defaults.py" not in text.split("---\n", 1)[1] and text.count("\n@@ ") == 1 and "+setting_25 = True" in text


def test_a_patch_left_for_a_person_is_prepared_with_zdiff3_markers_and_refreshed_back(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", example_lines({20: "upstream rewrote line 20\n"}))
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "needs-hand-port")]
    prepared = fake_project.root / "build" / "port" / "0.3.0"
    assert report.prepared == "build/port/0.3.0" and "sglpatch patch refresh 0.3.0" in report.text()
    text = (prepared / EXAMPLE).read_text()
    # zdiff3: ours, the merge base, theirs.
    assert "<<<<<<< " in text and "||||||| " in text and "upstream rewrote line 20" in text and "patched" in text
    with pytest.raises(SglpatchError, match="conflict marker"):
        refresh_hand_port(fake_project.project, "0.3.0")
    (prepared / EXAMPLE).write_text(example_lines({20: "patched\n"}))
    from sglpatch import cli

    assert cli.main(["--root", str(fake_project.root), "patch", "refresh", "0.3.0"]) == 0
    written = fake_project.root / "patches" / "renditions" / "0001-example" / "0.3.0.patch"
    assert "Applies-To: ==0.3.0" in written.read_text() and "-upstream rewrote line 20" in written.read_text()
    again = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(again) == [("0001-example.patch", "carries-over")] and again.written


RENAMED = "python/sglang/srt/layers/fused.py"
FUSED_025 = COMM_016.replace("get_server_args", "get_global_server_args")  # the name before a rename
FUSED_PATCHED = FUSED_025.replace("        and batch_size > 0\n", "        and batch_size > 0\n        and not get_global_server_args().fusion_in_prefill\n")


def test_a_name_the_release_renamed_around_the_patch_is_renamed_in_its_added_lines_too(fake_project, tmp_path, local_witnesses):
    local_witnesses["prefill"] = TextWitness("prefill", RENAMED, "fusion_in_prefill")
    files = {"sglang/srt/layers/fused.py": FUSED_025, "sglang/srt/context.py": "def get_global_server_args():\n    pass\n"}
    _python_pin(fake_project, tmp_path, files, {RENAMED: FUSED_PATCHED}, "prefill", "fused: keep prefill unfused")
    release = {"sglang/srt/layers/fused.py": FUSED_025.replace("get_global_server_args", "get_server_args"),
               "sglang/srt/context.py": "def get_server_args():\n    pass\n"}
    _release(fake_project, "0.3.0", files={**BASE_FILES, **release})
    before = (fake_project.root / "patches" / "0001-draft.patch").read_text()
    report = rebase_onto(fake_project.project, "0.3.0")
    outcome = report.outcomes[0]
    assert (outcome.verdict, outcome.step) == ("new-rendition", "three-way + renames"), report.text()
    merged = next(a for a in outcome.attempts if a.how == "three-way")
    assert "undefined name 'get_global_server_args'" in merged.findings[0]
    renamed = next(a for a in outcome.attempts if a.how == "three-way + renames")
    assert "get_global_server_args -> get_server_args (1x)" in renamed.detail
    text = _made_into_the_main_file(fake_project, report, before)
    assert "+        and not get_server_args().fusion_in_prefill" in text and "get_global_server_args" not in text


IMPORTS = "python/sglang/srt/paths.py"
PATHS_025 = '''from os.path import (
    basename,
    join,
)


def where(name):
    return join(basename(name), "b")
'''


def test_names_both_sides_added_to_one_import_list_are_both_kept(fake_project, tmp_path, local_witnesses):
    local_witnesses["dirname"] = TextWitness("dirname", IMPORTS, "dirname(name)")
    patched = PATHS_025.replace("    basename,\n", "    basename,\n    dirname,\n").replace("basename(name)", "dirname(name)")
    _python_pin(fake_project, tmp_path, {"sglang/srt/paths.py": PATHS_025}, {IMPORTS: patched}, "dirname", "paths: the folder")
    _release(fake_project, "0.3.0", files={**BASE_FILES, "sglang/srt/paths.py": PATHS_025.replace("    basename,\n", "    basename,\n    abspath,\n")})
    before = (fake_project.root / "patches" / "0001-draft.patch").read_text()
    report = rebase_onto(fake_project.project, "0.3.0")
    outcome = report.outcomes[0]
    assert (outcome.verdict, outcome.step) == ("new-rendition", "merge-ort + both insertions"), report.text()
    text = _made_into_the_main_file(fake_project, report, before)
    assert "     abspath,\n+    dirname,\n" in text and "<<<<<<<" not in text


def test_a_conflict_on_lines_both_sides_changed_is_not_resolved_as_insertions():
    from sglpatch.rebase.merge_tools import resolve_insertions

    both = "a\n<<<<<<< ours\nx1\n||||||| base\n=======\nx2\n>>>>>>> theirs\nb\n"
    assert resolve_insertions(both) == ("a\nx1\nx2\nb\n", 1)
    changed = "a\n<<<<<<< ours\nx1\n||||||| base\nx\n=======\nx2\n>>>>>>> theirs\nb\n"
    assert resolve_insertions(changed) == (None, 1)


def test_every_patch_left_for_a_person_gets_its_candidate_in_the_prepared_tree_and_each_is_refreshed_back(fake_project, tmp_path, local_witnesses):
    other = "python/sglang/srt/layers/other.py"
    local_witnesses["other-20"] = TextWitness("other-20", other, "patched")
    _add_pin(fake_project, "0.2.5", {**BASE_FILES, "sglang/srt/layers/other.py": example_lines({})})
    second = format_patch(tmp_path, {**tree_files("0.2.5"), other: example_lines({})}, {other: example_lines({20: "patched\n"})}, "other: patch line 20",
                          trailers={"Witness": "other-20", "Applies-To": "==0.2.5"})
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path)), ("0002-other.patch", second)])
    # The release rewrote the very line both patches change: neither ports by itself.
    rewritten = example_lines({20: "upstream rewrote line 20\n"})
    _release(fake_project, "0.3.0", files={**BASE_FILES, "sglang/srt/layers/example.py": rewritten, "sglang/srt/layers/other.py": rewritten})
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "needs-hand-port"), ("0002-other.patch", "needs-hand-port")]
    assert [o.prepared for o in report.outcomes] == ["build/port/0.3.0"] * 2
    assert "the nearest candidate of 0001-example.patch, 0002-other.patch" in report.text()
    prepared = fake_project.root / "build" / "port" / "0.3.0"
    note = json.loads((prepared / ".git" / "sglpatch-port.json").read_text())
    assert [(e["patch"], e["files"]) for e in note["patches"]] == [("0001-example.patch", [EXAMPLE]), ("0002-other.patch", [other])]
    for path in (EXAMPLE, other):
        text = (prepared / path).read_text()
        assert "<<<<<<< " in text and "||||||| " in text and "upstream rewrote line 20" in text, path
    with pytest.raises(SglpatchError, match="conflict marker"):
        refresh_hand_port(fake_project.project, "0.3.0")
    (prepared / EXAMPLE).write_text(example_lines({20: "patched\n"}))
    (prepared / other).write_text(example_lines({20: "patched\n"}))
    written = refresh_hand_port(fake_project.project, "0.3.0")
    assert [p.relative_to(fake_project.root).as_posix() for p in written] == [
        "patches/renditions/0001-example/0.3.0.patch", "patches/renditions/0002-other/0.3.0.patch"]
    first, then = (p.read_text() for p in written)
    assert "+patched" in first and "other.py" not in first.split("---\n", 1)[1]
    assert "+patched" in then and "example.py" not in then.split("---\n", 1)[1]
    again = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(again) == [("0001-example.patch", "carries-over"), ("0002-other.patch", "carries-over")] and again.written


def _with_tests(fake_project, tmp_path, monkeypatch, answer: str):
    """The example patch (its witness passes on the port) with a regression test beside it. The
    test releases hold no sglang to import, so a test double answers for the pin's CPU Python:
    every patch's tests say ``answer``."""
    from sglpatch.witnesses import probing
    from sglpatch.witnesses.upstream_test import UpstreamTestWitness

    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    test = fake_project.root / "patches" / "tests" / "0001-example" / "test/registered/unit/layers/test_example.py"
    test.parent.mkdir(parents=True)
    test.write_text('register_cpu_ci(est_time=1, suite="base-a-test-cpu")\n\nif __name__ == "__main__":\n    main()\n')
    ran = []

    def cpu_python_double(witnesses, tree, pin):
        ran.extend(w.name for w in witnesses)
        assert all(isinstance(w, UpstreamTestWitness) for w in witnesses)
        return {w.name: WitnessResult(w.name, answer, "unittest double", f"the double says {answer}") for w in witnesses}

    monkeypatch.setattr(probing, "run_probe_witnesses", cpu_python_double)
    _release(fake_project, "0.3.0", example_lines({5: "upstream changed line 5\n"}))
    return ran


def test_a_port_whose_regression_test_fails_is_refused_by_the_judge(fake_project, tmp_path, monkeypatch):
    ran = _with_tests(fake_project, tmp_path, monkeypatch, BUG)
    before = _snapshot(fake_project.root)
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "needs-hand-port")]
    first = report.outcomes[0].attempts[0]
    assert (first.how, first.result, first.witness_after) == ("exact", "applies", "clean [text]")
    assert first.judge.startswith("refused: witness: upstream-test:0001-example says bug [unittest double]")
    assert "upstream-test:0001-example" in ran
    assert not report.written and _snapshot(fake_project.root) == before


def test_a_port_whose_regression_test_passes_carries_over(fake_project, tmp_path, monkeypatch):
    _with_tests(fake_project, tmp_path, monkeypatch, CLEAN)
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "carries-over")]
    assert report.outcomes[0].attempts[0].judge == "accepted (names, witness, imports)"
