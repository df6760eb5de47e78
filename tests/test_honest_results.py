"""What a result says is what ran: a replayed answer says so, no switch a child sees stays outside
the keys of what it answers, a dry run says what a write would refuse, a staged or copied project
writes only inside itself, and the plan counts only durations measured on a ROCm GPU."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import BASE_FILES, REPO_ROOT, TextWitness, example_lines, format_patch, tree_files
from sglpatch.matrix import plan
from sglpatch.matrix.records import PASSED, CellRecord, matrix_dir, write_record
from sglpatch.plumbing import cache
from sglpatch.plumbing.project import OUT_ENV, Project
from sglpatch.rebase.onto import rebase_onto
from sglpatch.rebase.report import RebaseReport
from sglpatch.rocm import constants
from sglpatch.rocm.options import RocmOptions, device_stamp
from sglpatch.sources.pins import load_pins
from sglpatch.witnesses import answer_cache

RECORD_ENV = "SGLPATCH_STANDIN_RECORD"  # rocm_box.RECORD_ENV (the probes' own module, not importable here)

# The rebase tests' witnesses and import smoke for the small releases (autouse there, named here).
from test_rebase import _add_pin, _example_patch, _release, _verdicts, local_imports, local_witnesses  # noqa: F401

PROJECT = Project(REPO_ROOT)
# The judge's real import smoke, taken before the rebase tests' double (``local_imports``) replaces it.
REAL_IMPORT_SMOKE = __import__("sglpatch.rebase.trial", fromlist=["Trial"]).Trial.import_smoke


# -- a replayed answer says so ---------------------------------------------------------------------


def _cells(version: str, replayed: set[str]) -> list[CellRecord]:
    records = []
    for check, depth in [("build", None), ("load", None), *(("spec", d) for d in range(1, 7))]:
        record = CellRecord("cpu", check, version, depth, "1", "h", PASSED)
        record.cached = record.cell_id in replayed
        records.append(record)
    return records


def test_a_rebase_report_says_which_cpu_cells_were_replayed_in_text_and_json(fake_project, tmp_path, monkeypatch):
    import sglpatch.rebase.onto

    replayed = {"cpu-build-0.3.0", "cpu-spec-0.3.0-d1"}
    monkeypatch.setattr(sglpatch.rebase.onto, "pin_cells", lambda staged, version: _cells(version, replayed))
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", example_lines({5: "upstream changed line 5\n"}))
    report = rebase_onto(fake_project.project, "0.3.0")
    assert report.written
    assert sorted(report.cells_replayed) == sorted(replayed)
    assert json.loads(json.dumps(report.to_dict()))["cells_replayed"] == report.cells_replayed
    text = report.text()
    assert "cpu-build-0.3.0 passed (replayed)" in text and "cpu-spec-0.3.0-d1 passed (replayed)" in text
    assert "cpu-load-0.3.0 passed," in text  # computed by this run: said plainly
    assert "2 of 8 replayed" in text


def test_a_replayed_failing_cell_says_so_in_the_refusal(fake_project, tmp_path, monkeypatch):
    import sglpatch.rebase.onto

    def failing(staged, version):
        records = _cells(version, {"cpu-spec-0.3.0-d4"})
        records[5].outcome, records[5].reason = "failed", "speculative_num_steps 4 resolves to 3"
        return records

    monkeypatch.setattr(sglpatch.rebase.onto, "pin_cells", failing)
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", example_lines({5: "upstream changed line 5\n"}))
    report = rebase_onto(fake_project.project, "0.3.0")
    assert not report.written and "cpu-spec-0.3.0-d4 says failed (replayed)" in report.error


def test_bench_port_says_how_many_cells_ran_and_how_many_were_replayed(monkeypatch, capsys, tmp_path):
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import bench_port

    seen = []

    def row(root, version, work, write=True):
        seen.append(dict(answers=cache.answers_root(), kept=list(cache.answers_root().rglob("*"))))
        cells = [f"{r.cell_id} {r.outcome}" for r in _cells(version, set())]
        return {"version": version, "ported": True, "identical": True, "seconds": 1.0, "error": "", "patches": [],
                "cells": cells, "cells_replayed": [c.split(" ")[0] for c in cells[:6]]}

    monkeypatch.setattr(bench_port, "rebase_left_out", row)
    monkeypatch.setenv(cache.ANSWERS_ENV, str(tmp_path / "kept"))
    assert bench_port.main(["0.5.23", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "| 8/8 (6 replayed) |" in out
    assert "CPU cells: 2 ran, 6 replayed" in out
    assert seen[0]["answers"] == tmp_path / "kept"
    # --fresh: answers are computed anew (an empty answer store of the run's own), not replayed.
    assert bench_port.main(["0.5.23", "--dry-run", "--fresh"]) == 0
    out = capsys.readouterr().out
    assert seen[1]["answers"] != tmp_path / "kept" and seen[1]["kept"] == []
    assert "fresh answers" in out and cache.answers_root() == tmp_path / "kept"  # given back after the run


# -- a switch a child sees is in the key, or the answer is not kept ---------------------------------


def test_an_answer_given_in_stand_in_recording_mode_is_not_reused_by_a_normal_run(fake_project, tmp_path, monkeypatch):
    witness = TextWitness("recording-check", "python/sglang/srt/layers/example.py", "patched")
    pin = load_pins(fake_project.root / "upstream" / "pins.toml").pins[0]
    tree = tmp_path / "tree"
    (tree / "python/sglang/srt/layers").mkdir(parents=True)
    (tree / "python/sglang/srt/layers/example.py").write_text("patched\n")
    monkeypatch.setenv(RECORD_ENV, str(tmp_path / "recorded.json"))
    answer_cache.run_cached(witness, "a" * 40, pin, lambda: tree)
    answer_cache.run_cached(witness, "a" * 40, pin, lambda: tree)
    assert len(witness.runs) == 2  # in recording mode nothing is replayed either
    monkeypatch.delenv(RECORD_ENV)
    answer_cache.run_cached(witness, "a" * 40, pin, lambda: tree)
    assert len(witness.runs) == 3  # the normal run computed its own answer
    answer_cache.run_cached(witness, "a" * 40, pin, lambda: tree)
    assert len(witness.runs) == 3  # and keeps it for the next normal run


def test_every_switch_passed_to_probe_children_keeps_no_answer(tmp_path, monkeypatch):
    from sglpatch.witnesses import probe_children

    monkeypatch.setenv(cache.ANSWERS_ENV, str(tmp_path / "answers"))
    memo = cache.Memo("switch-test")
    for switch in probe_children.PASSED_TO_PROBES:
        monkeypatch.setenv(switch, "1")
        assert memo.remember("k", lambda: {"answer": switch}) == {"answer": switch}
        assert memo.get("k") is None and not memo.path("k").exists()
        monkeypatch.delenv(switch)
    assert memo.remember("k", lambda: {"answer": "normal"}) == {"answer": "normal"}
    assert memo.get("k") == {"answer": "normal"}


# -- a dry run says what a write would refuse -------------------------------------------------------


def test_a_dry_run_reports_an_applies_to_the_write_would_refuse(fake_project, tmp_path):
    # 0001's main file claims every pin and, by its range, the new release between them; it does not
    # apply there, a rendition made for no pin does. Writing would have to give the release up from
    # the main file's range, which no single range can then say: the write refuses, so must the dry run.
    _add_pin(fake_project, "0.2.5", BASE_FILES)
    wide = _example_patch(tmp_path, applies_to=">=0.1.0,<=0.2.5")
    other = _example_patch(tmp_path, applies_to="==0.2.1", line=30, subject="example: patch line 30")
    fake_project.set_patches([("0001-example.patch", wide)], {"0001-example": [("0.2.1.patch", other)]})
    _release(fake_project, "0.2.2", example_lines({19: "upstream changed line 19\n", 20: "upstream changed line 20\n",
                                                   21: "upstream changed line 21\n"}))
    dry = rebase_onto(fake_project.project, "0.2.2", write=False)
    assert _verdicts(dry) == [("0001-example.patch", "carries-over")]
    assert "no single range can say" in dry.error and not dry.complete and not dry.written
    wet = rebase_onto(fake_project.project, "0.2.2")
    assert wet.error == dry.error and not wet.written


# -- a staged or copied project writes inside its own root ------------------------------------------


def test_a_staged_project_keeps_its_records_inside_itself_whatever_sglpatch_out_dir_says(fake_project, tmp_path, monkeypatch):
    import sglpatch.rebase.onto

    outside = tmp_path / "outside"
    monkeypatch.setenv(OUT_ENV, str(outside))
    assert fake_project.project.build_dir == outside  # the real project follows the variable
    seen = []

    def cells(staged, version):
        seen.append((staged.root, matrix_dir(staged)))
        records = _cells(version, set())
        for record in records:
            write_record(record, matrix_dir(staged) / "records")
        return records

    monkeypatch.setattr(sglpatch.rebase.onto, "pin_cells", cells)
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", example_lines({5: "upstream changed line 5\n"}))
    report = rebase_onto(fake_project.project, "0.3.0")
    assert report.written
    (root, records), = seen
    assert records.is_relative_to(root)
    assert not outside.exists()


def test_a_leave_one_out_copy_is_rebased_inside_itself_whatever_sglpatch_out_dir_says(fake_project, tmp_path, monkeypatch):
    from sglpatch.rebase import leave_one_out

    monkeypatch.setenv(OUT_ENV, str(tmp_path / "outside"))
    seen = []

    def rebase(project, version, write=True, backwards=False):
        seen.append((project.root, project.build_dir))
        return RebaseReport(version, "artifact")

    monkeypatch.setattr(leave_one_out, "rebase_onto", rebase)
    leave_one_out.rebase_left_out(fake_project.root, "0.2.0", tmp_path / "work", write=False)
    (root, build), = seen
    assert build == root / "build"


# -- the plan counts only durations measured on a ROCm GPU ------------------------------------------


def test_a_stand_in_record_is_refused_as_a_duration_and_a_rocm_gpu_record_counts(tmp_path, monkeypatch):
    stand_in = device_stamp(RocmOptions(gpu=False))
    assert stand_in != constants.ROCM_GPU
    records = tmp_path / "records"
    records.mkdir()
    for name, device in (("stand-in", stand_in), ("unstamped", None)):
        data = {"tier": "rocm", "check": "spec", "pin": "0.5.23", "outcome": "passed", "seconds": 5.0}
        if device is not None:
            data["device"] = device
        (records / f"{name}.json").write_text(json.dumps(data))
    (records / "job.json").write_text(json.dumps({"kind": "rocm-job", "pin": "0.5.23", "device": stand_in, "image_s": 3.0}))
    assert plan.recorded_seconds(records) == {}
    defaults = plan.plan(PROJECT, "nightly", records_dir=None)
    assert plan.render(plan.plan(PROJECT, "nightly", records_dir=records), "nightly") == plan.render(defaults, "nightly")
    # The same record made on a ROCm GPU (the runner's stamp) replaces the default.
    monkeypatch.setattr("sglpatch.rocm.options.KFD", tmp_path)  # a host with /dev/kfd
    stamped = device_stamp(RocmOptions())
    assert stamped == constants.ROCM_GPU
    (records / "gpu.json").write_text(json.dumps({"tier": "rocm", "check": "spec", "pin": "0.5.23", "outcome": "passed",
                                                  "seconds": 7.0, "device": stamped}))
    assert plan.recorded_seconds(records) == {"spec": 7.0}


def test_the_runner_stamps_every_record_of_a_job_with_the_device_it_ran_on(tmp_path):
    import shutil

    from sglpatch.matrix import job_plan
    from sglpatch.matrix.records import read_records
    from sglpatch.rocm.job import run_job

    for part in ("upstream", "patches"):
        shutil.copytree(REPO_ROOT / part, tmp_path / part)
    shutil.copy(REPO_ROOT / "series.lock", tmp_path / "series.lock")
    project = Project(tmp_path)
    options = RocmOptions(gpu=False, docker_url=f"unix://{tmp_path}/no-engine.sock")
    result = run_job(project, "0.5.23", job_plan.items_for("pr"), options, event="pr", on_log=lambda line: None)
    on_disk = read_records(project.build_dir / "matrix" / "records")
    assert on_disk and {record.device for record in on_disk} == {device_stamp(options)}
    assert json.loads(result.path.read_text())["device"] == device_stamp(options)


def test_the_matrix_table_marks_a_replayed_cell_and_counts_them():
    from sglpatch.matrix.table import render_markdown

    records = _cells("0.5.14", {"cpu-build-0.5.14"})
    table = render_markdown(records)
    row = next(line for line in table.splitlines() if line.startswith("| 0.5.14 |"))
    assert row.startswith("| 0.5.14 | pass (replayed) | pass | pass |")
    assert "1 of 8 cells replayed" in table
    assert "replayed" not in render_markdown(_cells("0.5.14", set()))


# -- a judge part that could not look is a finding ----------------------------------------------------


def _trial(fake_project, tmp_path, version="0.2.0"):
    from sglpatch.rebase.trial import Trial
    from sglpatch.sources import pristine_tree

    pin = load_pins(fake_project.root / "upstream" / "pins.toml").select([version])[0]
    scratch = tmp_path / "trial"
    scratch.mkdir()
    return Trial(scratch, pin, pristine_tree.pristine_from_index(pin))


def test_the_import_smoke_with_no_module_to_import_is_a_finding_not_a_pass(fake_project, tmp_path):
    trial = _trial(fake_project, tmp_path)
    real = REAL_IMPORT_SMOKE
    kernel = "python/sglang/jit_kernel/csrc/kernel.cuh"
    assert real(trial, trial.parent, [kernel]) == [
        f"could not check {kernel}: no module of the release names kernel.cuh, so none loads it"]
    assert real(trial, trial.parent, ["README.md"]) == [
        "could not check README.md: it is outside the package (python/sglang/), nothing imports it"]


def test_a_name_only_the_port_defines_is_accepted_as_the_ports_own_and_reported(fake_project, tmp_path):
    helper = "from sglang.version import __version__\n\n\ndef helper():\n    return __version__\n"
    user = "from sglang.srt.layers.helper import helper\n\nVALUE = helper()\n"
    patch = format_patch(tmp_path, tree_files("0.1.0"), {"python/sglang/srt/layers/example.py": example_lines({20: "patched\n"}),
                                                         "python/sglang/srt/layers/helper.py": helper,
                                                         "python/sglang/srt/layers/user.py": user},
                         "example: patch line 20 with a helper", trailers={"Witness": "example-20", "Applies-To": ">=0.1"})
    fake_project.set_patches([("0001-example.patch", patch)])
    _release(fake_project, "0.3.0", example_lines({5: "upstream changed line 5\n"}))
    report = rebase_onto(fake_project.project, "0.3.0", write=False)
    assert _verdicts(report) == [("0001-example.patch", "carries-over")]
    attempt = report.outcomes[0].attempts[0]
    assert attempt.judge == "accepted (names, witness, imports; 1 name(s) the port itself adds)"
    assert attempt.findings == ["the port adds: python/sglang/srt/layers/user.py:1: imports sglang.srt.layers.helper,"
                                " a module the port itself adds"]


# -- leave-one-out removes every claim on the release it leaves out --------------------------------------


def test_leaving_out_a_release_inside_a_range_splits_the_range_around_it(fake_project, tmp_path):
    from sglpatch.rebase.leave_one_out import leave_out

    _add_pin(fake_project, "0.2.5", BASE_FILES)
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path, applies_to=">=0.1"))])
    done = leave_out(fake_project.root, "0.2.0", tmp_path / "copy")
    copy = Project(tmp_path / "copy")
    patch = copy.series().get("0001-example.patch")
    assert [(r.path.relative_to(copy.root).as_posix(), r.trailer("Applies-To")) for r in patch.renditions] == [
        ("patches/0001-example.patch", "==0.2.5"), ("patches/renditions/0001-example/0.1.0.patch", "==0.1.0")]
    assert not [r for r in patch.renditions if r.covers("0.2.0")]
    assert sorted(done["narrowed"]) == ["patches/0001-example.patch: ==0.2.5",
                                        "patches/renditions/0001-example/0.1.0.patch: ==0.1.0"]


def test_a_rendition_committed_on_the_left_out_release_alone_is_made_again_from_a_neighbours_locked_commit(
        fake_project, tmp_path):
    from sglpatch.apply.apply_pins import apply_series
    from sglpatch.rebase.leave_one_out import leave_out

    # 0.2.5 already holds the fix (the main file reverse-applies there: not needed), so among the
    # main file's pins only 0.2.0 commits it: its text was made for 0.2.0.
    _add_pin(fake_project, "0.2.5", {**BASE_FILES, "sglang/srt/layers/example.py": example_lines({20: "patched\n"})})
    main = _example_patch(tmp_path, applies_to=">=0.2.0")
    older = format_patch(tmp_path, tree_files("0.1.0"), {"python/sglang/srt/layers/example.py": example_lines({20: "patched for 0.1.0\n"})},
                         "example: patch line 20", trailers={"Witness": "example-20", "Applies-To": "==0.1.0"})
    fake_project.set_patches([("0001-example.patch", main)], {"0001-example": [("0.1.0.patch", older)]})
    assert apply_series(fake_project.project).ok
    statuses = {v: e["patches"][0]["status"] for v, e in json.loads(fake_project.project.lock_file.read_text())["pins"].items()}
    assert statuses == {"0.1.0": "applied", "0.2.0": "applied", "0.2.5": "not-needed"}
    done = leave_out(fake_project.root, "0.2.0", tmp_path / "copy")
    remade = Project(tmp_path / "copy").series().get("0001-example.patch").main
    assert remade.trailer("Applies-To") == "==0.2.5"
    assert "+patched for 0.1.0" in remade.diff_text and "+patched\n" not in remade.diff_text
    assert done["remade"] == ["patches/0001-example.patch -> patches/0001-example.patch (made for 0.2.0 alone among its pins:"
                              " made again from 0.1.0's locked commit)"]


@pytest.mark.network
def test_leaving_out_a_release_inside_a_range_of_the_real_series_leaves_no_claim_on_it(tmp_path):
    from sglpatch.rebase.leave_one_out import leave_out

    done = leave_out(REPO_ROOT, "0.5.19", tmp_path / "copy")
    copy = Project(tmp_path / "copy")
    for patch in copy.series().patches:
        for rendition in patch.renditions:
            assert not rendition.covers("0.5.19"), rendition.path
    # 0001's main file (upstream has the fix from 0.5.15: committed on none of its pins) kept its
    # text, split around 0.5.19 into the pins below it and the pins above it.
    guard = copy.series().get("0001-amd-guard-cuda-runtime-include-fused-metadata-copy.patch")
    assert guard.main.trailer("Applies-To") == ">=0.5.20,<=0.5.23"
    below = guard.main.path.parent / "renditions" / guard.stem / "0.5.18.patch"
    assert below.is_file() and guard.for_version("0.5.18").path == below
    assert guard.for_version("0.5.17").path == below and guard.for_version("0.5.19") is None
    assert "patches/renditions/0001-amd-guard-cuda-runtime-include-fused-metadata-copy/0.5.18.patch: >=0.5.17,<=0.5.18" in done["narrowed"]


def test_a_spec_depth_answered_earlier_in_the_same_run_is_not_called_replayed(tmp_path, monkeypatch):
    # The spec check answers every depth of a pin in one run; the depths after the first read those
    # answers back. They ran in this run: only an answer kept by an earlier run is a replay.
    from types import SimpleNamespace

    from sglpatch.matrix import cpu
    from sglpatch.matrix.cells import Cell
    from sglpatch.matrix.records import Part

    monkeypatch.setenv(cache.ANSWERS_ENV, str(tmp_path / "answers"))
    monkeypatch.setattr(cpu, "_ANSWERED_HERE", {})
    put = SimpleNamespace(pin=SimpleNamespace(version="0.5.23"), patched_tree="p" * 40, pristine_tree="q" * 40,
                          series_version="1", series_hash="h")
    runs = []

    def spec_cells(put, records):
        runs.append(sorted(records))
        for record in records.values():
            record.parts.append(Part("a stated part", PASSED))
        return {depth: [] for depth in records}

    monkeypatch.setattr(cpu, "prepare_pin", lambda project, version: put)
    monkeypatch.setattr(cpu, "_cell_key", lambda put, cell: f"test-{cell.check}-{cell.depth}")
    monkeypatch.setattr(cpu, "spec_cells", spec_cells)
    monkeypatch.setattr(cpu, "remove_checkouts", lambda: None)
    project = Project(tmp_path / "project", sealed=True)
    first = cpu.run_cpu_cell(project, Cell("cpu", "spec", "0.5.23", 1))
    second = cpu.run_cpu_cell(project, Cell("cpu", "spec", "0.5.23", 2))
    assert len(runs) == 1 and (first.cached, second.cached) == (False, False)
    monkeypatch.setattr(cpu, "_ANSWERED_HERE", {})  # a later run (another process)
    third = cpu.run_cpu_cell(project, Cell("cpu", "spec", "0.5.23", 3))
    assert len(runs) == 1 and third.cached


def test_a_hand_port_prepared_under_sglpatch_out_dir_is_named_where_it_is(fake_project, tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    monkeypatch.setenv(OUT_ENV, str(outside))
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", example_lines({20: "upstream rewrote line 20\n"}))
    report = rebase_onto(fake_project.project, "0.3.0")
    assert _verdicts(report) == [("0001-example.patch", "needs-hand-port")]
    assert report.prepared == str(outside / "port" / "0.3.0")
    assert "<<<<<<< " in (outside / "port" / "0.3.0" / "python/sglang/srt/layers/example.py").read_text()
