"""The test matrix: the cells nox lists, the CI workflow's matrix, records and the table, and the CPU
cells on the real pins."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import AUTHOR_ENV, REAL_PINS, REPO_ROOT, git, pristine_subtree, skip_unless_required
from sglpatch.apply.pin_under_test import prepare_pin
from sglpatch.cli import main
from sglpatch.matrix.cells import CHECKS, Cell, DEPTHS, PROFILE, TIERS, cells as matrix_cells
from sglpatch.matrix.cpu import run_cpu_cell
from sglpatch.matrix.cpu_checks import spec_scenarios, synthetic_checkpoint_part
from sglpatch.matrix.kernels import multi_step_kernel_threshold
from sglpatch.matrix.records import FAILED, PARTIAL, PASSED, SKIPPED, CellRecord, Part, combine, read_records, write_record
from sglpatch.matrix.table import render_markdown
from sglpatch.serving.profile import load_profile
from sglpatch.sources.pins import load_pins

PINS = load_pins(REPO_ROOT / "upstream" / "pins.toml")
GUARD_FIXED_UPSTREAM = "0.5.15"


def _session_name(cell: Cell) -> str:
    args = [cell.tier, cell.pin] + ([str(cell.depth)] if cell.depth is not None else [])
    return f"{cell.check}({', '.join(args)})"


def _nox_list(*args: str) -> list[dict]:
    listing = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "--json", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(listing.stdout)


def test_nox_lists_every_cell_of_the_matrix_with_a_description_and_its_tier_tag():
    # --json lists the selected sessions only: select both tiers' tags.
    listed = {s["session"]: s for s in _nox_list("-t", *TIERS) if s["name"] in CHECKS}
    expected = matrix_cells([pin.version for pin in PINS.pins])
    assert len(expected) == len(PINS.pins) * (2 + len(DEPTHS)) * len(TIERS)
    assert set(listed) == {_session_name(cell) for cell in expected}
    for cell in expected:
        session = listed[_session_name(cell)]
        assert session["tags"] == [cell.tier]
        assert session["description"] and "\n" not in session["description"]
    for tier in TIERS:
        # -t rocm also lists the bench and its gate (tests/test_matrix_plan.py); the cells are these.
        tagged = {s["session"] for s in _nox_list("-t", tier) if s["name"] in CHECKS}
        assert tagged == {_session_name(c) for c in expected if c.tier == tier}


def test_spec_scenarios_are_the_profile_at_depth_d_and_a_draft_count_sglang_must_normalise():
    profile = load_profile(PROFILE)
    scenarios = spec_scenarios(profile)
    assert len(scenarios) == 2 * len(DEPTHS)
    for depth in DEPTHS:
        argv, env = scenarios[f"d{depth}"]
        # The flags witness appends a scenario to the profile's flags; argparse keeps the last value.
        launched = profile.server_args("/m") + argv
        pairs = dict(zip(launched, launched[1:]))
        assert pairs["--speculative-algorithm"] == "EAGLE"
        assert pairs["--speculative-num-steps"] == str(depth)
        assert pairs["--speculative-eagle-topk"] == "1"
        assert pairs["--speculative-num-draft-tokens"] == str(depth + 1)
        assert pairs["--kv-cache-dtype"] == "fp8_e4m3" and "--enable-aiter-allreduce-fusion" in launched
        assert env == {}
        unnormalised = scenarios[f"d{depth}-unnormalised"][0]
        wrong = dict(zip(unnormalised, unnormalised[1:]))
        assert wrong["--speculative-num-draft-tokens"] == str(2 * depth + 3)
        assert {k: v for k, v in wrong.items() if k != "--speculative-num-draft-tokens"} == {
            k: v for k, v in dict(zip(argv, argv[1:])).items() if k != "--speculative-num-draft-tokens"}


def _record(pin: str, check: str, outcome: str, depth=None, **kwargs) -> CellRecord:
    return CellRecord("cpu", check, pin, depth, "2", "ab" * 32, outcome, **kwargs)


def test_a_cell_passes_only_when_every_part_passed():
    assert combine([Part("a", PASSED), Part("b", PASSED)]) == (PASSED, "")
    assert combine([Part("a", PASSED), Part("b", FAILED, "boom"), Part("c", SKIPPED, "no gpu")])[0] == FAILED
    outcome, reason = combine([Part("a", PASSED), Part("b", SKIPPED, "no toolchain")])
    assert outcome == PARTIAL and "no toolchain" in reason
    assert combine([Part("a", SKIPPED, "no engine")]) == (SKIPPED, "a: no engine")
    assert combine([])[0] == SKIPPED


def test_a_cell_that_could_not_run_everything_fails_only_where_ci_requires_it():
    from sglpatch.matrix.records import failing

    assert failing(_record("0.5.14", "build", FAILED))
    for outcome in (PARTIAL, SKIPPED):
        assert not failing(_record("0.5.14", "build", outcome))
        assert failing(_record("0.5.14", "build", outcome), strict=True)
    assert not failing(_record("0.5.14", "build", PASSED), strict=True)


def test_the_table_has_a_row_per_pin_a_column_per_cell_and_the_reasons(tmp_path):
    records = [
        _record("0.5.14", "build", PASSED),
        _record("0.5.10", "build", FAILED, reason="HIP build of x: expected clean"),
        _record("0.5.14", "spec", PASSED, depth=5, figures={"decode_tok_s": 213.4, "accept_length": 3.61}),
        _record("0.5.14", "load", SKIPPED, reason="no engine"),
    ]
    for record in records:
        write_record(record, tmp_path / "job" / record.cell_id)  # CI artifacts: one folder per job
    (tmp_path / "job" / "not-a-record.json").write_text('{"unrelated": true}')
    table = render_markdown(read_records(tmp_path))
    lines = table.splitlines()
    header = next(line for line in lines if line.startswith("| pin"))
    assert header == "| pin | build | load | spec d5 |"
    rows = [line for line in lines if line.startswith("| 0.5")]
    assert rows == ["| 0.5.10 | FAIL | — | — |", "| 0.5.14 | pass | skip | pass (213 tok/s, acc 3.61) |"]
    assert "- 0.5.10 build: **failed** — HIP build of x: expected clean" in lines
    assert "- 0.5.14 load: **skipped** — no engine" in lines


# -- the CPU cells on the real pins ------------------------------------------------------------


def _pristine_attention(pin, dest: Path) -> Path:
    return pristine_subtree(pin.version, dest, path="python/sglang/srt/layers/attention")


@pytest.mark.network
@pytest.mark.parametrize("version", [pin.version for pin in PINS.pins])
def test_every_pin_compiles_the_multi_step_metadata_kernel_from_depth_4(version, tmp_path):
    threshold, evidence = multi_step_kernel_threshold(_pristine_attention(PINS.select([version])[0], tmp_path))
    assert threshold == 4, evidence
    assert "speculative_num_steps > 3" in evidence


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_spec_cells_build_the_multi_step_kernel_from_depth_4_and_it_fails_pristine_where_it_was_patched(
    version, project_copy
):
    deep = run_cpu_cell(project_copy, Cell("cpu", "spec", version, 4))
    shallow = read_records(project_copy.build_dir / "matrix" / "records")
    assert deep.tree and deep.series_hash == project_copy.series().digest()
    parts = {part.name: part for part in deep.parts}
    patched = parts["HIP build of fused_metadata_copy.cuh (patched)"]
    pristine = parts["HIP build of fused_metadata_copy.cuh (pristine)"]
    assert patched.outcome == PASSED, patched
    assert pristine.outcome == PASSED, pristine
    assert ("expected bug" if version < GUARD_FIXED_UPSTREAM else "expected clean") in pristine.detail
    assert deep.figures["multi_step_kernel"] is True
    depth3 = run_cpu_cell(project_copy, Cell("cpu", "spec", version, 3))
    assert depth3.figures["multi_step_kernel"] is False
    assert not [p for p in depth3.parts if p.name.startswith("HIP build")]
    assert any(p.name.startswith("multi-step metadata kernel not used") and p.outcome == PASSED for p in depth3.parts)
    assert deep.outcome in (PASSED, PARTIAL) and depth3.outcome in (PASSED, PARTIAL, SKIPPED)
    assert shallow  # the records are on disk for the report


def _ran(part: Part) -> Part:
    """``part`` when it ran; a part that could not run here skips the test (fails where CI requires it)."""
    if part.outcome == SKIPPED:
        skip_unless_required(f"{part.name} could not run here: {part.detail}")
    return part


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_build_cell_compiles_the_touched_kernel_and_imports_the_patched_pin(version, project_copy):
    record = run_cpu_cell(project_copy, Cell("cpu", "build", version))
    assert record.figures["kernels"] == ["fused_metadata_copy.cuh"]
    compile_part = next(p for p in record.parts if p.name.startswith("HIP build"))
    assert compile_part.outcome == PASSED, compile_part
    smoke = _ran(next(p for p in record.parts if p.name.startswith("import smoke")))
    assert smoke.outcome == PASSED, smoke
    assert "fused_metadata_copy" in smoke.detail and "sglang.srt.server_args" in smoke.detail
    assert Path(record.log).is_file() and record.cell_id in Path(record.log).read_text()


@pytest.mark.network
def test_rocm_session_door_records_a_skip_with_its_reason_here(project_copy, tmp_path, capsys):
    if Path("/dev/kfd").exists():
        pytest.skip("this machine has /dev/kfd: the ROCm tier would really run")
    record_path = tmp_path / "cell.json"
    code = main(["--root", str(project_copy.root), "matrix", "run", "spec", "0.5.14", "--depth", "5",
                 "--tier", "rocm", "--record", str(record_path)])
    assert code == 0
    record = json.loads(record_path.read_text())
    assert record["outcome"] == SKIPPED and "/dev/kfd" in record["reason"]
    assert "skipped" in capsys.readouterr().out


@pytest.mark.network
@pytest.mark.parametrize(
    "version, module",
    [
        ("0.5.10", "sglang.jit_kernel.fused_metadata_copy"),
        ("0.5.19", "sglang.kernels.ops.attention.fused_metadata_copy"),
        ("0.5.23", "sglang.kernels.ops.attention.dsa.fused_metadata_copy"),
    ],
)
def test_the_rocm_build_check_finds_the_kernel_loaders_in_every_layout(version, module, project_copy):
    """The in-container build check must find what to compile wherever the release keeps it; the
    module it finds defines every loader function the check calls, with the argument count used."""
    put = prepare_pin(project_copy, version)
    script = REPO_ROOT / "sglpatch" / "rocm" / "checks" / "build_check.py"
    probe = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('build_check', {str(script)!r})\n"
        "check = importlib.util.module_from_spec(spec); spec.loader.exec_module(check)\n"
        "print(json.dumps({'modules': check.loader_modules('fused_metadata_copy.cuh'),"
        " 'loaders': check.LOADERS['fused_metadata_copy.cuh']}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(put.tree_path / "python")}
    answer = json.loads(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout)
    assert answer["modules"] == [module]
    source = (put.tree_path / "python" / Path(*module.split("."))).with_suffix(".py").read_text()
    for name, args in answer["loaders"]:
        signature = re.search(rf"def {name}\(([^)]*)\)", source)
        assert signature, name
        assert len([a for a in signature.group(1).split(",") if a.strip()]) == len(args), (name, signature.group(1))


@pytest.mark.network
def test_load_cell_resolves_the_synthetic_glm_checkpoint_on_the_patched_pin_and_not_on_the_pristine(project_copy, tmp_path):
    record = run_cpu_cell(project_copy, Cell("cpu", "load", "0.5.14"))
    parts = {part.name.split(" (")[0]: part for part in record.parts}
    witness = _ran(parts["MTP load witness"])
    assert witness.outcome == PASSED, witness
    synthetic = _ran(parts["synthetic GlmMoeDsa checkpoint through the pin's config and quantization"])
    assert synthetic.outcome == PASSED, synthetic
    assert "layer 78" in synthetic.detail and "shared_experts.gate_up_proj: UnquantizedLinearMethod/ok" in synthetic.detail

    # The same checkpoint on the pristine release: the bring-up's half-width MXFP4 slot.
    put = prepare_pin(project_copy, "0.5.14")
    part, _ = synthetic_checkpoint_part(put, put.pristine_commit)
    assert part.outcome == FAILED, part
    assert "shape-mismatch" in part.detail


# -- what is no verdict on the tree: a hung child, a missing module ------------------------------


def test_a_probe_child_that_hung_or_ran_past_its_limit_is_transient_and_a_reported_failure_is_not():
    from sglpatch.witnesses import probe_runs

    hung = probe_runs.ProbeRun({}, {}, "the CPU probe runner for 0.5.23 hung in 'mtp: build' and was killed after 540 s", 540.0)
    assert hung.transient("mtp") and hung.failure("mtp")
    past_limit = probe_runs.ProbeRun({"mtp": {"ok": False, "timed_out": True, "error": "ran past its 240 s limit"}}, {"ok": True}, None, 1.0)
    assert past_limit.transient("mtp")
    reported = probe_runs.ProbeRun({}, {"ok": False, "phase": "import sglang", "error": "ImportError: no module x"},
                                   "the CPU probe runner failed in 'import sglang': ImportError: no module x", 1.0)
    assert not reported.transient("mtp")
    raised = probe_runs.ProbeRun({"mtp": {"ok": False, "phase": "build", "error": "ValueError: shape"}}, {"ok": True}, None, 1.0)
    assert not raised.transient("mtp")


def test_a_cell_part_whose_probe_child_hung_is_skipped_never_failed(monkeypatch):
    from sglpatch.matrix import cpu_checks

    hung = "the CPU probe runner for 0.5.23 hung in 'glm-checkpoint: write' and was killed after 540 s"
    monkeypatch.setattr(cpu_checks, "pin_probes", lambda put, commit=None: {
        "answers": {}, "runner": {}, "failures": {cpu_checks.GLM_CHECKPOINT: hung}, "transient": [cpu_checks.GLM_CHECKPOINT]})
    part, _ = cpu_checks.synthetic_checkpoint_part(object())
    assert part.outcome == SKIPPED and hung in part.detail, part
    assert combine([part])[0] != FAILED  # so the cell is never kept as failed


def test_the_checkpoint_part_cannot_pass_when_a_module_it_checks_is_missing_from_the_draft():
    from sglpatch.matrix import cpu_checks

    modules = {m: {"checkpoint_names": [], "quant_method": "QuarkLinearMethod(QuarkW4A4MXFP4)", "unquantized": False,
                   "load": "ok"} for m in ("shared_experts.gate_up_proj", "self_attn.o_proj")}
    answer = {"cases": {"checkpoint": {"draft_prefix": "model", "modules": modules, "missing": ["eh_proj"]}}}
    part = cpu_checks.judge_checkpoint("checkpoint", answer, {"excluded": [], "shape": {}, "mtp_layer": 78})
    assert part.outcome == SKIPPED and "eh_proj" in part.detail, part


def test_a_cpu_cells_key_follows_the_toolchain_the_profile_and_the_built_environment(monkeypatch):
    from types import SimpleNamespace

    from sglpatch.matrix import cpu
    from sglpatch.matrix.cells import Cell
    from sglpatch.witnesses import cpu_envs
    from sglpatch.witnesses import rocm_guard

    put = SimpleNamespace(pin=REAL_PINS.newest, patched_tree="p" * 40, pristine_tree="q" * 40)
    cell = Cell("cpu", "spec", put.pin.version, 5)
    state = {"toolchain": "include-graph", "built": True, "installed": "numpy 2.3.0"}
    monkeypatch.setattr(cpu_envs, "env_built", lambda pin: state["built"])
    monkeypatch.setattr(cpu_envs, "env_fingerprint", lambda pin: state["installed"])
    monkeypatch.setattr(rocm_guard.RocmGuardWitness, "fingerprint", lambda self, pin: state["toolchain"])
    first = cpu._cell_key(put, cell)
    assert cpu._cell_key(put, cell) == first
    state["toolchain"] = "hip-compile gfx942,gfx950"  # the toolchain got installed
    assert cpu._cell_key(put, cell) != first
    state["installed"] = "numpy 2.3.1"
    assert cpu._cell_key(put, cell) not in (first, None)
    state["built"] = False
    assert cpu._cell_key(put, cell) is None  # nothing is looked up or kept before the environment exists


def test_a_pins_checks_share_one_scratch_checkout_moved_between_its_commits_and_removed_at_the_end(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from sglpatch.apply import checkouts, pin_under_test

    repo = tmp_path / "tree"
    (repo / "python" / "sglang").mkdir(parents=True)
    module = repo / "python" / "sglang" / "module.py"
    commits = []
    for text in ("pristine\n", "patched\n"):
        module.write_text(text)
        if not commits:
            git(tmp_path, "init", "-q", str(repo))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", text.strip(), env=AUTHOR_ENV)
        commits.append(git(repo, "rev-parse", "HEAD").strip())
    pristine, patched = commits
    written = []
    real_git = checkouts.run_git
    monkeypatch.setattr(checkouts, "run_git", lambda args, *rest, **kw: (written.append(args), real_git(args, *rest, **kw))[1])
    put = SimpleNamespace(tree_path=repo)

    def whole_checkouts() -> int:
        return sum("checkout-index" in args for args in written)

    first = pin_under_test.checkout(put, patched)
    assert (first / "python/sglang/module.py").read_text() == "patched\n"
    # The next check of the pin looks at the pristine commit, then the patched again: the same
    # folder, moved by git, never a second whole checkout.
    assert pin_under_test.checkout(put, pristine) == first and (first / "python/sglang/module.py").read_text() == "pristine\n"
    assert pin_under_test.checkout(put, patched) == first and (first / "python/sglang/module.py").read_text() == "patched\n"
    assert whole_checkouts() == 1
    # A check that wrote into it gets a fresh one holding exactly the commit.
    (first / "python/sglang/module.py").write_text("a witness wrote here\n")
    (first / "python/sglang/left.py").write_text("")
    fresh = pin_under_test.checkout(put, patched)
    assert (fresh / "python/sglang/module.py").read_text() == "patched\n" and not (fresh / "python/sglang/left.py").exists()
    assert whole_checkouts() == 2
    # One that something else removed is checked out afresh, never asked of git as if it were there.
    shutil.rmtree(fresh)
    anew = pin_under_test.checkout(put, pristine)
    assert (anew / "python/sglang/module.py").read_text() == "pristine\n" and whole_checkouts() == 3
    pin_under_test.remove_checkouts()
    assert not anew.exists() and not [p for p in (repo / ".git").iterdir() if p.name.startswith("sglpatch-")]


def test_a_pins_scratch_checkout_outlives_the_apply_each_of_its_cells_starts_with(project_copy):
    """Each cell applies the pin again (``prepare_pin``) before it looks at a commit, and apply
    clears what it finds in the tree's .git as a killed run's leftovers: the checkout the pin's
    cells share must not be there, or the second cell of every pin found it gone."""
    from sglpatch.apply import pin_under_test

    try:
        put = prepare_pin(project_copy, "0.5.14")
        first = pin_under_test.checkout(put, put.patched_commit)
        put = prepare_pin(project_copy, "0.5.14")  # the next cell
        again = pin_under_test.checkout(put, put.pristine_commit)
        assert again == first
        shared = pin_under_test._CHECKOUTS[put.tree_path]
        assert shared.refreshed == []  # moved by git, not checked out afresh
        # A file the series changes on this pin, so the folder shows which commit it holds.
        path = "python/sglang/srt/server_args.py"
        pristine = git(put.tree_path, "show", f"{put.pristine_commit}:{path}")
        assert pristine != git(put.tree_path, "show", f"{put.patched_commit}:{path}")
        assert (again / path).read_text() == pristine
    finally:
        pin_under_test.remove_checkouts()
    assert not first.exists()
