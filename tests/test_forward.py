"""Porting the series to a release that is not pinned: every rendition tried nearest first, the
witness deciding, the report saying what was tried, and nothing written unless all is settled."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import BASE_FILES, REPO_ROOT, TextWitness, format_patch, make_wheel, pin_entry, tree_files
from sglpatch import forward, witnesses
from sglpatch.errors import SglpatchError
from sglpatch.lock import read_lock
from sglpatch.pins import load_pins
from sglpatch.project import Project
from sglpatch.series import load_series
from sglpatch.witnesses import BUG, CLEAN, WitnessResult

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


@pytest.fixture(autouse=True)
def local_witnesses(monkeypatch, test_witnesses):
    registry = witnesses.registry
    monkeypatch.setattr(witnesses, "registry", lambda: {**registry(), **LOCAL_WITNESSES})
    for witness in LOCAL_WITNESSES.values():
        if hasattr(witness, "runs"):
            witness.runs.clear()
    return LOCAL_WITNESSES


def _lines(replace):
    lines = [f"line {n}\n" for n in range(1, 41)]
    for number, text in replace.items():
        lines[number - 1] = text
    return "".join(lines)


def _release(fake_project, version, example_text=None, files=None):
    make_wheel(fake_project.index, version, files or {**BASE_FILES, "sglang/srt/layers/example.py": example_text})


def _add_pin(fake_project, version, files):
    wheel = make_wheel(fake_project.index, version, files)
    pins = fake_project.root / "upstream" / "pins.toml"
    pins.write_text(pins.read_text() + pin_entry(version, wheel))


def _example_patch(tmp_path, witness="example-20", applies_to=">=0.1", base=None, line=20, subject=None):
    files = base or tree_files("0.1.0")
    return format_patch(
        tmp_path, files, {EXAMPLE: _lines({line: "patched\n"})}, subject or f"example: patch line {line}",
        trailers={"Witness": witness, "Applies-To": applies_to},
    )


def _snapshot(root):
    return {path: path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file() and "build" not in path.parts}


def _verdicts(report):
    return [(o.name, o.verdict) for o in report.outcomes]


def test_patch_that_applies_as_is_carries_over_and_its_applies_to_grows_to_the_release(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", _lines({5: "upstream changed line 5\n"}))
    report = forward.forward_port(fake_project.project, "0.3.0")
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
    changed = _lines({17: "0.2.5 changed line 17\n"})
    _add_pin(fake_project, "0.2.5", {**BASE_FILES, "sglang/srt/layers/example.py": changed})
    main = _example_patch(tmp_path, applies_to=">=0.1.0,<=0.2.0")
    newer = _example_patch(tmp_path, applies_to="==0.2.5", base={**tree_files("0.2.5"), EXAMPLE: changed})
    fake_project.set_patches([("0001-example.patch", main)], {"0001-example": [("0.2.5.patch", newer)]})
    # 0.2.2 as 0.2.5 has it: the older neighbour's rendition does not apply, the newer one's does,
    # exactly -- it is taken before any three-way merge of the older one.
    _release(fake_project, "0.2.2", changed)
    report = forward.forward_port(fake_project.project, "0.2.2", write=False)
    assert _verdicts(report) == [("0001-example.patch", "carries-over")]
    assert report.outcomes[0].rendition == "patches/renditions/0001-example/0.2.5.patch"
    assert [(a.rendition.split("/")[-1], a.how, a.result) for a in report.outcomes[0].attempts] == [
        ("0001-example.patch", "exact", "does not apply"),
        ("0.2.5.patch", "exact", "applies"),
    ]
    # 0.2.3 as 0.2.0 has it: both neighbours are one pin away; the older one's rendition is tried first.
    _release(fake_project, "0.2.3", _lines({}))
    report = forward.forward_port(fake_project.project, "0.2.3")
    assert report.outcomes[0].rendition == "patches/0001-example.patch"
    assert report.written
    text = (fake_project.root / "upstream" / "pins.toml").read_text()
    assert text.index('"0.2.0"') < text.index('"0.2.3"') < text.index('"0.2.5"')
    assert "Applies-To: >=0.1.0,<=0.2.3" in (fake_project.root / "patches" / "0001-example.patch").read_text()


def test_candidates_are_ordered_nearest_release_first():
    series_dir = REPO_ROOT / "patches"
    patch = load_series(series_dir).get("0002-quark-keep-mtp-draft-excluded-modules-unquantized")
    pins = load_pins(REPO_ROOT / "upstream" / "pins.toml")
    newest = pins.newest.version
    ordered = forward.candidates(patch, pins.pins, "99.0")
    assert ordered[0].rendition.covers(newest)
    ranks = [candidate.rank for candidate in ordered]
    assert ranks == sorted(ranks)


def test_changed_context_is_merged_three_way_into_a_new_rendition(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path, subject="[AMD] example: patch line 20"))])
    _release(fake_project, "0.3.0", _lines({17: "upstream changed line 17\n"}))
    report = forward.forward_port(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "new-rendition")]
    assert [(a.how, a.result, a.made_for) for a in report.outcomes[0].attempts] == [
        ("exact", "does not apply", "0.2.0"),
        ("three-way", "merges", "0.2.0"),
    ]
    rendition = fake_project.root / "patches" / "renditions" / "0001-example" / "0.3.0.patch"
    text = rendition.read_text()
    assert "Applies-To: ==0.3.0" in text and " upstream changed line 17" in text and "+patched" in text
    # The commit message stays the rendition's own, its subject's tag included.
    assert "Problem, cause and fix" in text and "Subject: [PATCH] [AMD] example: patch line 20" in text
    assert report.written
    assert "Applies-To: >=0.1.0,<=0.2.0" in (fake_project.root / "patches" / "0001-example.patch").read_text()
    from sglpatch.check import check_series

    project = fake_project.project
    assert check_series(project.patches_dir, project.pins()) == []


def test_conflict_writes_nothing_and_names_the_hunk(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", _lines({20: "upstream rewrote line 20\n"}))
    before = _snapshot(fake_project.root)
    report = forward.forward_port(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "conflict")]
    assert "hunk 1 of" in report.outcomes[0].attempts[0].detail
    assert not report.written and not report.complete
    assert _snapshot(fake_project.root) == before


def test_bug_fixed_differently_upstream_is_fixed_upstream_and_no_rendition_claims_the_release(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", _lines({20: "patched upstream, their own way\n"}))
    report = forward.forward_port(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "fixed-upstream")]
    assert report.outcomes[0].witness_before == "clean [text]"
    assert report.written
    # The main rendition claimed ">=0.1"; now it holds only the pins it was applied to.
    assert "Applies-To: >=0.1.0,<=0.2.0" in (fake_project.root / "patches" / "0001-example.patch").read_text()
    lock = read_lock(fake_project.root / "series.lock")["pins"]["0.3.0"]
    assert lock["patches"][0]["status"] == "not-applicable"


def test_moved_file_whose_rendition_reverse_applies_is_already_upstream_not_fixed_differently(fake_project, tmp_path):
    old_files = tree_files("0.1.0")
    old = old_files["python/" + OLD_KERNEL]
    guard = lambda text: text.replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")  # noqa: E731
    main = format_patch(
        tmp_path, old_files, {"python/" + OLD_KERNEL: guard(old)}, "kernel: guard the CUDA include",
        trailers={"Witness": "kernel-guard", "Applies-To": ">=0.1.0,<=0.2.0"},
    )
    moved = {k: v for k, v in BASE_FILES.items() if k != OLD_KERNEL} | {NEW_KERNEL: BASE_FILES[OLD_KERNEL]}
    _add_pin(fake_project, "0.2.5", moved)
    moved_tree = {"python/" + k: v.format(version="0.2.5") for k, v in moved.items()}
    rendition = format_patch(
        tmp_path, moved_tree, {"python/" + NEW_KERNEL: guard(BASE_FILES[OLD_KERNEL])}, "kernel: guard the CUDA include",
        trailers={"Witness": "kernel-guard", "Applies-To": "==0.2.5"},
    )
    fake_project.set_patches([("0001-guard.patch", main)], {"0001-guard": [("0.2.5.patch", rendition)]})
    # Upstream took the very same guard at the new path.
    _release(fake_project, "0.3.0", files={**moved, NEW_KERNEL: guard(BASE_FILES[OLD_KERNEL])})
    report = forward.forward_port(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-guard.patch", "already-upstream")]
    outcome = report.outcomes[0]
    assert outcome.rendition == "patches/renditions/0001-guard/0.2.5.patch"
    assert [(a.rendition, a.result) for a in outcome.attempts] == [
        ("patches/renditions/0001-guard/0.2.5.patch", "reverse-applies")
    ]
    assert report.written
    assert "Applies-To: >=0.2.5,<=0.3.0" in (fake_project.root / "patches" / "renditions" / "0001-guard" / "0.2.5.patch").read_text()
    lock = read_lock(fake_project.root / "series.lock")["pins"]["0.3.0"]
    assert lock["patches"][0]["status"] == "not-needed"


def test_patch_whose_witness_still_finds_the_bug_is_witness_failed_not_a_new_rendition(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path, witness="example-30"))])
    _release(fake_project, "0.3.0", _lines({17: "upstream changed line 17\n"}))
    before = _snapshot(fake_project.root)
    report = forward.forward_port(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "witness-failed")]
    assert [(a.how, a.result, a.witness_after) for a in report.outcomes[0].attempts] == [
        ("exact", "does not apply", ""),
        ("three-way", "merges", "bug [text]"),
    ]
    assert not report.written and _snapshot(fake_project.root) == before


def test_patch_whose_witness_cannot_run_is_not_classified_and_nothing_is_written(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path, witness="fixture-unwitnessed"))])
    _release(fake_project, "0.3.0", _lines({5: "upstream changed line 5\n"}))
    before = _snapshot(fake_project.root)
    report = forward.forward_port(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "witness-unavailable")]
    assert not report.written and _snapshot(fake_project.root) == before


def test_a_trial_without_an_outcome_for_every_patch_is_not_complete():
    assert not forward.PortReport("0.3.0", "a.whl", patches_in_series=2).complete
    report = forward.PortReport("0.3.0", "a.whl", patches_in_series=1)
    report.outcomes.append(forward.PortOutcome("0001", "carries-over"))
    assert report.complete
    report.error = "the staged apply failed"
    assert not report.complete


def test_a_trial_that_errors_writes_nothing(fake_project, tmp_path):
    patch = _example_patch(tmp_path).replace("Witness: example-20", "Witness: no-such-witness")
    fake_project.set_patches([("0001-example.patch", patch)])
    _release(fake_project, "0.3.0", _lines({5: "upstream changed line 5\n"}))
    before = _snapshot(fake_project.root)
    with pytest.raises(SglpatchError, match="unknown witness 'no-such-witness'"):
        forward.forward_port(fake_project.project, "0.3.0")
    assert _snapshot(fake_project.root) == before


def test_final_apply_that_fails_writes_nothing(fake_project, tmp_path, cache_dir):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", _lines({5: "upstream changed line 5\n"}))
    # Every patch classifies on 0.3.0, but the grown Applies-To must re-lock 0.1.0, whose artifact
    # is gone from the index and from the cache: the staged apply of 0.1.0 fails.
    (fake_project.index / "sglang-0.1.0.tar.gz").unlink()
    for entry in (cache_dir / "pristine").glob("0.1.0-*"):
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for entry in (cache_dir / "artifacts").glob("sglang-0.1.0*"):
        entry.unlink()
    before = _snapshot(fake_project.root)
    report = forward.forward_port(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "carries-over")]
    assert not report.written and not report.complete
    assert "does not apply to 0.1.0" in report.error and "nothing written" in report.error
    assert _snapshot(fake_project.root) == before


def test_files_are_moved_in_only_after_the_staged_apply_and_put_back_if_a_move_fails(fake_project, tmp_path, monkeypatch):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", _lines({17: "upstream changed line 17\n"}))
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

    monkeypatch.setattr(forward.os, "replace", replace)
    report = forward.forward_port(fake_project.project, "0.3.0")
    assert moved, "the other files were moved before the lock failed"
    assert not report.written and "the files are as they were" in report.error
    assert _snapshot(fake_project.root) == before


def test_dry_run_classifies_and_writes_nothing(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", _lines({17: "upstream changed line 17\n"}))
    before = _snapshot(fake_project.root)
    report = forward.forward_port(fake_project.project, "0.3.0", write=False)
    assert _verdicts(report) == [("0001-example.patch", "new-rendition")] and report.complete
    assert not report.written and _snapshot(fake_project.root) == before


def test_cli_rebase_prints_every_try_and_writes_a_json_report(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", _lines({20: "upstream rewrote line 20\n"}))
    done = subprocess.run(
        [sys.executable, "-m", "sglpatch", "--root", str(fake_project.root), "rebase", "0.3.0", "--dry-run", "--json"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=300,
    )
    # The subprocess has the real witnesses only, so the test witness is unknown there: the CLI
    # must say so in one line, not a traceback.
    assert done.returncode == 2 and "unknown witness 'example-20'" in done.stderr and "Traceback" not in done.stderr
    report = forward.forward_port(fake_project.project, "0.3.0", write=False)
    text = report.text()
    assert "tried patches/0001-example.patch exact from 0.2.0: does not apply" in text
    assert "tried patches/0001-example.patch three-way from 0.2.0: conflict" in text
    assert json.loads(json.dumps(report.to_dict()))["complete"] is False


def test_already_pinned_version_is_refused(fake_project):
    with pytest.raises(SglpatchError, match="already pinned"):
        forward.forward_port(fake_project.project, "0.2.0")


def test_spec_for_holds_exactly_the_given_pins():
    pinned = ["0.1.0", "0.2.0", "0.2.5", "0.3.0"]
    assert forward.spec_for(["0.2.0"], pinned) == "==0.2.0"
    assert forward.spec_for(["0.2.0", "0.2.5", "0.3.0"], pinned) == ">=0.2.0,<=0.3.0"
    assert forward.spec_for(["0.1.0", "0.3.0"], pinned) is None


# -- the real series on real releases ------------------------------------------------------------


def _real_copy(tmp_path, removed: list[str]):
    """The repository's patches, lock and pins, with the pins of ``removed`` taken out."""
    root = tmp_path / "project"
    shutil.copytree(REPO_ROOT / "patches", root / "patches")
    shutil.copy(REPO_ROOT / "series.lock", root / "series.lock")
    (root / "upstream").mkdir(parents=True)
    text = (REPO_ROOT / "upstream" / "pins.toml").read_text()
    for version in removed:
        block = re.search(rf'^\[\[pin\]\]\n(#.*\n)?version = "{re.escape(version)}"\n(?:(?!\[\[pin\]\]).*\n?)*', text, re.MULTILINE)
        assert block, version
        text = text[: block.start()] + text[block.end() :]
    (root / "upstream" / "pins.toml").write_text(text)
    return Project(root)


REMOVED = ["0.5.12.post1", "0.5.18", "0.5.23"]


@pytest.mark.network
@pytest.mark.parametrize("version", REMOVED)
def test_dry_run_classifies_every_patch_of_a_release_that_is_not_pinned(tmp_path, version):
    # A copy of the project without three pins: one between two post releases, one after the guard's
    # file moved to kernels/jit (0.5.17), and the newest. Each is classified without a conflict, as
    # the committed lock has it.
    project = _real_copy(tmp_path, REMOVED)
    before = {path: path.read_bytes() for path in project.root.rglob("*") if path.is_file()}
    report = forward.forward_port(project, version, write=False)
    assert report.complete, report.text()
    locked = {p["name"]: p["status"] for p in read_lock(REPO_ROOT / "series.lock")["pins"][version]["patches"]}
    expected = {"applied": ("carries-over", "new-rendition"), "applied-with-offset": ("carries-over", "new-rendition"), "not-needed": ("already-upstream",), "not-applicable": ("fixed-upstream",)}
    for outcome in report.outcomes:
        assert outcome.verdict in expected[locked[outcome.name]], (outcome.name, outcome.verdict, locked[outcome.name])
        assert outcome.witness_before and outcome.attempts
    guard = report.outcomes[0]
    if version == "0.5.12.post1":
        assert guard.verdict == "carries-over" and guard.witness_before.startswith("bug")
        assert guard.witness_after.startswith("clean")
    else:
        # The guard's file moved: the rendition made for the new path reverse-applies, so the
        # release holds this very guard (not "fixed differently").
        assert guard.verdict == "already-upstream" and guard.witness_before.startswith("clean")
        assert guard.rendition.endswith("renditions/0001-amd-guard-cuda-runtime-include-fused-metadata-copy/0.5.19.patch")
    assert {path: path.read_bytes() for path in project.root.rglob("*") if path.is_file()} == before


@pytest.mark.network
def test_end_to_end_rebase_of_the_real_series_pins_the_newest_release_again(tmp_path):
    project = _real_copy(tmp_path, ["0.5.23"])
    report = forward.forward_port(project, "0.5.23")
    assert [(o.name[:4], o.verdict) for o in report.outcomes] == [
        ("0001", "already-upstream"), ("0002", "carries-over"), ("0003", "carries-over"),
    ], report.text()
    assert report.written, report.error
    ported = load_pins(project.pins_file).select(["0.5.23"])[0]
    shipped = load_pins(REPO_ROOT / "upstream" / "pins.toml").select(["0.5.23"])[0]
    assert (ported.artifact, ported.sha256, ported.released) == (shipped.artifact, shipped.sha256, shipped.released)
    # The lock it records is the committed one: the same series gives the same commits.
    assert read_lock(project.lock_file)["pins"]["0.5.23"] == read_lock(REPO_ROOT / "series.lock")["pins"]["0.5.23"]
