"""Replays marked everywhere an answer is shown (issue 35 item 7): an answer given back from where
it was kept, not run now, says so in every printer of a verdict, and ``matrix run --no-cache``
runs every part again, its witnesses' included, and says truthfully what was cached."""

from __future__ import annotations

import functools
import json
from types import SimpleNamespace

import pytest

from conftest import format_patch, tree_files
from sglpatch import cli
from sglpatch.apply.apply_pins import ApplyReport
from sglpatch.apply.one_pin import PatchOutcome, PinResult
from sglpatch.apply.report import render_apply, render_witnesses
from sglpatch.matrix import kernels
from sglpatch.plumbing import cache, workers
from sglpatch.witnesses import answer_cache
from sglpatch.witnesses.results import BUG, CLEAN, REPLAY_MARK, WitnessResult

KERNEL = "python/sglang/jit_kernel/csrc/kernel.cuh"
KEPT = "kept 2026-12-01 10:00:00 UTC for tree 4c8ebdab1703 (answer cache witness/guard-text/4c8e-1)"


def _report(outcome_replayed: dict, pin_replayed: str = "") -> ApplyReport:
    outcome = PatchOutcome("0001-guard.patch", "applied", commit="c" * 40, needed=True,
                           witness_before="bug [text]", witness_after="clean [text]", replayed=outcome_replayed)
    result = PinResult("0.1.0", "/tree", ok=True, commit="c" * 40, patches=[outcome], replayed=pin_replayed)
    return ApplyReport("1", "d" * 64, [result])


# Every printer of an apply or witness verdict: add a new one here.
PRINTERS = {
    "apply text": render_apply,
    "witness text": render_witnesses,
    "apply and witness JSON": lambda report: report.to_json(),
}


@pytest.mark.parametrize("printer", sorted(PRINTERS))
@pytest.mark.parametrize("replayed", [{"pristine: guard-text": KEPT}, {"patched: guard-text": KEPT}],
                         ids=["pristine", "patched"])
def test_every_printer_of_a_verdict_marks_a_replayed_answer(printer, replayed):
    shown = PRINTERS[printer](_report(replayed))
    assert REPLAY_MARK in shown or '"replayed"' in shown and KEPT in shown, shown
    unmarked = PRINTERS[printer](_report({}))
    assert REPLAY_MARK not in unmarked and KEPT not in unmarked


@pytest.mark.parametrize("printer", sorted(PRINTERS))
def test_a_whole_result_given_back_by_apply_says_nothing_ran_now(printer):
    kept = "apply's result kept 2026-12-01 10:00:00 UTC (.git/sglpatch-results/k.json)"
    shown = PRINTERS[printer](_report({"every tree": kept}, kept))
    assert REPLAY_MARK in shown or kept in shown, shown


def test_a_matrix_part_and_record_show_a_replayed_witness():
    from sglpatch.commands.matrix import cached_mark
    from sglpatch.matrix.records import CellRecord

    part = kernels.witness_part("MTP load witness", WitnessResult("w", CLEAN, "build+load gfx950", "ok", replayed=KEPT),
                                expect=CLEAN)
    assert REPLAY_MARK in part.detail and KEPT in part.detail
    record = CellRecord("cpu", "load", "0.5.23", None, "1", "h", "passed", cached=True, figures={"replayed": [KEPT]})
    assert cached_mark(record) == " (cached: 1 answer(s) replayed)"
    assert WitnessResult("w", BUG, "text").shown() == "bug [text]"


def _guarded_project(fake_project, tmp_path):
    files = tree_files("0.1.0")
    guarded = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    fake_project.set_patches([("0001-guard.patch", format_patch(tmp_path / "src", files, {KERNEL: guarded}, "kernel: guard",
                                                                trailers={"Witness": "guard-text"}))])
    return fake_project.root


def test_sglpatch_witness_marks_the_answers_it_gives_back_in_text_and_json(fake_project, tmp_path, capsys, monkeypatch):
    root = _guarded_project(fake_project, tmp_path)
    assert cli.main(["--root", str(root), "apply", "0.1.0", "--update-lock"]) == 0
    capsys.readouterr()
    assert cli.main(["--root", str(root), "witness", "0.1.0", "--json"]) == 0
    ran_here = capsys.readouterr()
    assert REPLAY_MARK not in ran_here.err  # answered by this process: no replay
    monkeypatch.setattr(answer_cache, "_ANSWERED_HERE", set())  # a later process
    assert cli.main(["--root", str(root), "witness", "0.1.0", "--json"]) == 0
    later = capsys.readouterr()
    assert f"bug [text] {REPLAY_MARK} -> clean [text] {REPLAY_MARK}" in later.err, later.err
    [outcome] = json.loads(later.out)["pins"][0]["patches"]
    assert set(outcome["replayed"]) == {"pristine: guard-text", "patched: guard-text"}
    assert all(where.startswith("kept ") and "answer cache" in where for where in outcome["replayed"].values())


def test_apply_marks_its_own_kept_result_when_it_gives_it_back(fake_project, tmp_path, capsys):
    root = _guarded_project(fake_project, tmp_path)
    assert cli.main(["--root", str(root), "apply", "0.1.0", "--update-lock"]) == 0
    first = capsys.readouterr().out
    assert "nothing ran now" not in first
    assert cli.main(["--root", str(root), "apply", "0.1.0"]) == 0
    again = capsys.readouterr().out
    assert f"{REPLAY_MARK} nothing ran now: apply's result kept" in again and f"bug [text] {REPLAY_MARK}" in again


class Counting:
    """A witness that counts its runs (the cache's plumbing is under test, not a check)."""

    version = "1"

    def __init__(self, name: str):
        self.name, self.runs = name, 0

    def run(self, tree, pin):
        self.runs += 1
        return WitnessResult(self.name, BUG, "text", "ran")


def test_a_cached_answer_is_given_back_only_for_the_tree_it_ran_on(cache_dir, tmp_path):
    witness, pin = Counting("counting"), SimpleNamespace(version="0.1.0")
    tree = tmp_path / "tree"
    tree.mkdir()
    answer_cache.run_cached(witness, "a" * 40, pin, lambda: tree)
    key = answer_cache._key(witness, "a" * 40, answer_cache.fingerprint(witness, pin))
    kept = answer_cache.ANSWERS.get(key)
    assert kept["tree"] == "a" * 40 and kept["stored"].endswith("UTC")
    # An entry that claims another tree than the one it is asked for is never given back.
    answer_cache.ANSWERS.put(key, {**kept, "tree": "b" * 40})
    answer_cache._ANSWERED_HERE.discard(key)
    answer_cache.run_cached(witness, "a" * 40, pin, lambda: tree)
    assert witness.runs == 2


def test_a_witness_that_changes_the_tree_it_ran_on_gives_no_answer(cache_dir, tmp_path):
    class Writing:
        name, version = "writing", "1"

        def run(self, tree, pin):
            (tree / "left-behind.py").write_text("x\n")
            return WitnessResult(self.name, CLEAN, "text", "clean, after writing into the tree")

    tree = tmp_path / "tree"
    tree.mkdir()
    result = answer_cache.run_cached(Writing(), "a" * 40, SimpleNamespace(version="0.1.0"), lambda: tree)
    assert result.state == "unavailable" and "the tree changed while its witnesses ran on it (left-behind.py)" in result.detail
    assert not list((cache.answers_root() / "witness").rglob("*.json"))  # nothing kept


def test_rerun_runs_a_witness_again_whatever_another_process_kept(cache_dir, tmp_path, monkeypatch):
    witness, pin = Counting("counting-rerun"), SimpleNamespace(version="0.1.0")
    tree = tmp_path / "tree"
    tree.mkdir()
    answer_cache.run_cached(witness, "a" * 40, pin, lambda: tree)
    monkeypatch.setattr(answer_cache, "_ANSWERED_HERE", set())  # a later process
    with answer_cache.replays_seen() as seen:
        assert answer_cache.run_cached(witness, "a" * 40, pin, lambda: tree).replayed.startswith("kept ")
    assert witness.runs == 1 and len(seen) == 1
    with answer_cache.rerun():
        again = answer_cache.run_cached(witness, "a" * 40, pin, lambda: tree)
        assert again.replayed == "" and answer_cache.run_cached(witness, "a" * 40, pin, lambda: tree).replayed == ""
    assert witness.runs == 2


def test_rerun_compiles_again_what_an_earlier_process_kept_and_only_once_in_this_one(cache_dir, monkeypatch):
    # A build cell's HIP compile passes are kept by a digest of their whole input; under
    # ``matrix run-all --no-cache`` one kept by an earlier run stood in, unmarked, for a compile
    # said to run now. The compile is hip_toolchain's own remembered path; only the compiler is counted.
    from sglpatch.witnesses import hip_toolchain

    compiled = []

    def compile_():
        compiled.append(1)
        return CLEAN, "compiled"

    assert hip_toolchain.remembered_compile("pass-key", compile_) == (CLEAN, "compiled")
    monkeypatch.setattr(cache, "_MADE_HERE", set(), raising=False)  # a later process
    assert hip_toolchain.remembered_compile("pass-key", compile_) == (CLEAN, "compiled")
    assert len(compiled) == 1  # outside a rerun the kept pass is given back
    with answer_cache.rerun():
        assert hip_toolchain.remembered_compile("pass-key", compile_) == (CLEAN, "compiled")
        assert len(compiled) == 2  # kept by an earlier process: compiled again
        hip_toolchain.remembered_compile("pass-key", compile_)
        assert len(compiled) == 2  # compiled in this process: given back


def _remembered_in_a_worker(memo: cache.Memo, item: str) -> str:
    with cache.rerun():  # as each CPU cell run with --no-cache enters it
        return memo.remember("key", lambda: f"made again by worker {item}")


def test_one_rerun_shares_what_its_forked_workers_made_and_the_next_run_makes_it_again(cache_dir, monkeypatch):
    # The CPU tier's workers are one run: a compile one of them made is not made again by another.
    memo = cache.Memo("made-in-a-run")
    memo.remember("key", lambda: "kept by an earlier run")
    monkeypatch.setattr(cache, "_MADE_HERE", set())  # a later process
    for run in ("a", "b"):
        with cache.one_run():  # as the CPU tier holds one around its workers
            made = workers.share_out([run], lambda item: item, functools.partial(_remembered_in_a_worker, memo), 1)
            assert made == [f"made again by worker {run}"]
            with cache.rerun():
                assert memo.remember("key", lambda: "made again here") == made[0]  # not made twice in one run
        monkeypatch.setattr(cache, "_MADE_HERE", set())  # the next run, another process


def test_matrix_run_no_cache_reruns_the_mtp_witness_part_and_records_cached_truthfully(tmp_path, monkeypatch, cache_dir):
    from sglpatch.matrix import cpu, cpu_checks
    from sglpatch.matrix.cells import Cell
    from sglpatch.matrix.records import PASSED, Part
    from sglpatch.plumbing.project import Project

    class MtpWitnessDouble:
        """Test double of the MTP load witness: the part's plumbing (cache, replay, --no-cache) is
        under test, not the witness (tests/test_witness_mtp_exclude.py runs the real one)."""

        name, version, runs = "mtp-quark-exclude", "1", 0

        def run(self, tree, pin):
            MtpWitnessDouble.runs += 1
            return WitnessResult(self.name, CLEAN, "build+load gfx950", "double")

    tree = tmp_path / "tree"
    tree.mkdir()
    put = SimpleNamespace(pin=SimpleNamespace(version="0.5.23"), patched_tree="p" * 40, pristine_tree="q" * 40,
                          patched_commit="c" * 40, series_version="1", series_hash="h")
    monkeypatch.setattr(cpu, "_ANSWERED_HERE", {})
    monkeypatch.setattr(cpu, "prepare_pin", lambda project, version: put)
    monkeypatch.setattr(cpu, "_cell_key", lambda put, cell: f"test-{cell.check}-{cell.depth}")
    monkeypatch.setattr(cpu, "remove_checkouts", lambda: None)
    monkeypatch.setattr(cpu_checks.mtp_exclude, "MtpQuarkExcludeWitness", MtpWitnessDouble)
    monkeypatch.setattr(cpu_checks, "checkout", lambda put, commit: tree)
    monkeypatch.setattr(cpu_checks, "synthetic_checkpoint_part", lambda put: (Part("synthetic checkpoint", PASSED), []))
    project = Project(tmp_path / "project", sealed=True)
    cell = Cell("cpu", "load", "0.5.23", None)
    first = cpu.run_cpu_cell(project, cell)
    assert (MtpWitnessDouble.runs, first.cached) == (1, False)
    # A later process with the cell's record gone: the witness's answer is given back, and said so.
    monkeypatch.setattr(cpu, "_ANSWERED_HERE", {})
    monkeypatch.setattr(answer_cache, "_ANSWERED_HERE", set())
    cpu.CELLS.path("test-load-None").unlink()
    second = cpu.run_cpu_cell(project, cell)
    assert MtpWitnessDouble.runs == 1 and second.cached and "mtp-quark-exclude" in second.figures["replayed"][0]
    assert REPLAY_MARK in second.parts[0].detail
    # --no-cache: every part runs again, the witness's included, and the record says it ran.
    monkeypatch.setattr(answer_cache, "_ANSWERED_HERE", set())
    third = cpu.run_cpu_cell(project, cell, use_cache=False)
    assert MtpWitnessDouble.runs == 2 and not third.cached and "replayed" not in third.figures
    assert REPLAY_MARK not in third.parts[0].detail
