"""The ROCm tier's judgement of what its in-container checks print, and what it asks docker for."""

from __future__ import annotations

import json
import py_compile
from pathlib import Path

from sglpatch import matrix
from sglpatch.matrix import containers
from sglpatch.matrix import rocm as rocm_tier
from sglpatch.matrix import rocm_job
from sglpatch.matrix.containers import ContainerRun
from sglpatch.matrix.records import FAILED, PASSED, CellRecord


def _judge(cell: matrix.Cell, figures: dict | None, exit_code: int = 0, **run) -> CellRecord:
    record = CellRecord(cell.tier, cell.check, cell.pin, cell.depth, "2", "ab" * 32, "skipped")
    log = "server log line\n" + (json.dumps(figures) if figures is not None else "Traceback: boom")
    rocm_tier.judge(cell, ContainerRun(exit_code, log, **run), record)
    return record


def _spec_figures(**overrides) -> dict:
    figures = {
        "healthy_s": 312.0, "mismatch_lines": [], "accept_length": 5.2, "decode_tok_s": 205.0,
        "plain_decode_tok_s": 80.0, "burst_completed": 32, "burst_errors": [],
        "prefix_match": [1.0, 1.0, 0.8, 1.0], "exact_match": 3, "gpu": "AMD Instinct MI355X",
    }
    return {**figures, **overrides}


def _outcomes(record: CellRecord) -> dict[str, str]:
    return {part.name: part.outcome for part in record.parts}


def test_a_healthy_deep_spec_server_passes_every_part():
    record = _judge(matrix.Cell("rocm", "spec", "0.5.14", 5), _spec_figures())
    assert set(_outcomes(record).values()) == {PASSED}, record.parts
    assert record.gpu == "AMD Instinct MI355X"
    assert record.figures["decode_ratio_vs_plain"] == round(205 / 80, 3)


def test_a_missing_rocm_guard_shows_as_collapsed_decode_speed_and_fails():
    # The bring-up: the failed compile is retried every step, decode drops ~30x: far below the
    # non-speculative decode (6.5 / 80 = x0.08, floor x0.5).
    record = _judge(matrix.Cell("rocm", "spec", "0.5.14", 5), _spec_figures(decode_tok_s=6.5))
    assert _outcomes(record)[rocm_tier.COLLAPSE_PART] == FAILED
    detail = next(part.detail for part in record.parts if part.name == rocm_tier.COLLAPSE_PART)
    assert "6.5 tok/s at depth 5 vs 80.0 without speculative decoding (x0.08" in detail


def test_depth_3_is_judged_against_the_non_speculative_decode_measured_on_its_own_server():
    # Depth 3 at 30 tok/s: against itself it would be x1.0; against the plain decode (80) it is x0.38.
    record = _judge(matrix.Cell("rocm", "spec", "0.5.14", 3), _spec_figures(decode_tok_s=30.0, accept_length=3.6))
    assert _outcomes(record)[rocm_tier.COLLAPSE_PART] == FAILED
    assert record.figures["decode_ratio_vs_plain"] == round(30 / 80, 3)
    groups = rocm_job.job_groups([rocm_job.Item("spec", 3)])
    launches = rocm_job.Launches()
    speed = next(group for group in groups if any(step.kind == "speed" for step in group.steps))
    assert speed.launches == (launches.plain(),) and launches.plain() != launches.depth(3)
    assert not any(arg.startswith("--speculative") for arg in speed.launches[0].argv)


def test_accept_length_is_judged_against_the_floor_of_its_depth():
    floor = rocm_tier.ACCEPT_LENGTH_FLOORS[6]
    low = _judge(matrix.Cell("rocm", "spec", "0.5.14", 6), _spec_figures(accept_length=floor - 0.01))
    assert _outcomes(low)[f"accept length at least {floor}"] == FAILED
    missing = _judge(matrix.Cell("rocm", "spec", "0.5.14", 6), _spec_figures(accept_length=None))
    assert _outcomes(missing)[f"accept length at least {floor}"] == FAILED
    assert sorted(rocm_tier.ACCEPT_LENGTH_FLOORS) == list(matrix.DEPTHS)
    assert all(rocm_tier.ACCEPT_LENGTH_FLOORS[d] < d + 1 for d in matrix.DEPTHS)  # at most d + 1 per step


def test_the_depth_5_floor_is_sglangs_own_amd_ci_figure_and_the_others_follow_from_it():
    assert rocm_tier.ACCEPT_LENGTH_FLOORS[5] == 5.0
    floors = [rocm_tier.ACCEPT_LENGTH_FLOORS[d] for d in matrix.DEPTHS]
    assert floors == sorted(floors) and floors[0] > 1.0
    at_ci = _judge(matrix.Cell("rocm", "spec", "0.5.23", 5), _spec_figures(accept_length=4.99))
    assert _outcomes(at_ci)["accept length at least 5.0"] == FAILED


def test_greedy_outputs_that_diverge_from_the_non_speculative_run_fail():
    record = _judge(matrix.Cell("rocm", "spec", "0.5.14", 5), _spec_figures(prefix_match=[1.0, 0.2, 0.3, 0.5], exact_match=1))
    assert _outcomes(record)["greedy outputs against the non-speculative run"] == FAILED
    same = _judge(matrix.Cell("rocm", "spec", "0.5.14", 5), _spec_figures())
    assert _outcomes(same)["greedy outputs against the non-speculative run"] == PASSED


def test_a_burst_with_a_lost_request_and_a_shape_mismatch_fail():
    record = _judge(matrix.Cell("rocm", "spec", "0.5.14", 3), _spec_figures(
        burst_completed=31, burst_errors=["TimeoutError"],
        mismatch_lines=["RuntimeError: size mismatch for model.decoder.mlp.shared_experts.gate_up_proj"]))
    outcomes = _outcomes(record)
    assert outcomes["32 concurrent requests complete"] == FAILED
    assert outcomes["no shape mismatch in the server log"] == FAILED


def test_load_fails_when_the_server_never_becomes_healthy_or_prints_nothing():
    sick = _judge(matrix.Cell("rocm", "load", "0.5.14"), {"healthy_s": None, "mismatch_lines": [], "error": "exit 1"})
    assert _outcomes(sick)["server healthy"] == FAILED
    silent = _judge(matrix.Cell("rocm", "load", "0.5.14"), None, exit_code=1)
    assert [p.outcome for p in silent.parts] == [FAILED] and "no figures" in silent.parts[0].detail
    killed = _judge(matrix.Cell("rocm", "load", "0.5.14"), None, exit_code=None, timed_out=True)
    assert killed.parts[0].detail == "timed out"


def test_build_passes_only_when_every_loader_compiled():
    ok = _judge(matrix.Cell("rocm", "build", "0.5.14"), {"kernels": {"m._jit_a(0,)": "", "m._jit_b()": ""}, "gpu": "x"})
    assert [p.outcome for p in ok.parts] == [PASSED]
    bad = _judge(matrix.Cell("rocm", "build", "0.5.14"), {"kernels": {"m._jit_a(0,)": "fatal error: 'cuda_runtime.h'"}}, exit_code=1)
    assert [p.outcome for p in bad.parts] == [FAILED]
    nothing = _judge(matrix.Cell("rocm", "build", "0.5.14"), {"kernels": {}})
    assert [p.outcome for p in nothing.parts] == [FAILED]


def test_gpu_containers_get_sglangs_amd_ci_flags_and_aiter():
    assert containers.GPU_RUN_OPTIONS["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    assert containers.GPU_RUN_OPTIONS["group_add"] == ["video"]
    assert containers.GPU_RUN_OPTIONS["shm_size"] == "32g"
    assert containers.GPU_RUN_OPTIONS["cap_add"] == ["SYS_PTRACE"]
    assert containers.GPU_RUN_OPTIONS["security_opt"] == ["seccomp=unconfined"]
    assert containers.GPU_ENV == {"SGLANG_USE_AITER": "1"}


def test_the_base_image_is_the_pins_release_unless_configured(monkeypatch):
    monkeypatch.delenv(rocm_tier.IMAGE_ENV, raising=False)
    options = rocm_tier.RocmOptions()
    assert options.image_for("0.5.14", "lmsysorg/sglang:v0.5.14-rocm720-mi35x") == "lmsysorg/sglang:v0.5.14-rocm720-mi35x"
    monkeypatch.setenv(rocm_tier.IMAGE_ENV, "registry.local/sglang:v{version}-rocm")
    assert options.image_for("0.5.14", "unused") == "registry.local/sglang:v0.5.14-rocm"
    assert rocm_tier.RocmOptions(base_image="mine:{version}").image_for("0.5.23", "unused") == "mine:0.5.23"


def test_the_in_container_checks_compile_with_the_standard_library_only(tmp_path):
    for script in sorted(rocm_tier.CHECK_SCRIPTS.glob("*.py")):
        py_compile.compile(str(script), cfile=str(tmp_path / (script.name + "c")), doraise=True)
        imports = {line.split()[1].split(".")[0] for line in script.read_text().splitlines()
                   if line.startswith(("import ", "from ")) and not line.startswith("from __future__")}
        # sglpatch only as the host-side import of the sibling modules, with a fallback to them.
        assert imports <= {"json", "os", "re", "signal", "subprocess", "sys", "threading", "time", "urllib",
                           "pathlib", "importlib", "traceback", "math", "shlex", "shutil", "sglpatch",
                           "bench_metrics", "power", "serve_check"}, (script.name, imports)
    assert {p.name for p in rocm_tier.CHECK_SCRIPTS.glob("*.py")} == {
        "__init__.py", "build_check.py", "serve_check.py", "bench_run.py", "bench_metrics.py", "power.py",
        "accuracy_check.py", "tune_moe.py"}


def test_serve_check_compares_greedy_outputs_by_prefix():
    import importlib.util

    spec = importlib.util.spec_from_file_location("serve_check", rocm_tier.CHECK_SCRIPTS / "serve_check.py")
    serve_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve_check)
    assert serve_check.common_prefix("The capital is Paris.", "The capital is Lyon.") == len("The capital is ")
    assert serve_check.accept_length({"spec_accept_length": 3.5}) == 3.5
    assert serve_check.accept_length({"completion_tokens": 64, "spec_verify_ct": 16}) == 4.0
    assert serve_check.accept_length({"completion_tokens": 64}) is None
    assert Path(serve_check.__file__).name == "serve_check.py"


# -- a pin's job where the tier cannot run ------------------------------------------------------


def _scratch_project(tmp_path):
    """The repository's pins, patches and lock in a scratch folder, so build/ lands there."""
    import shutil

    from conftest import REPO_ROOT
    from sglpatch.project import Project

    for part in ("upstream", "patches"):
        shutil.copytree(REPO_ROOT / part, tmp_path / part)
    shutil.copy(REPO_ROOT / "series.lock", tmp_path / "series.lock")
    return Project(tmp_path)


def test_a_job_without_a_docker_engine_records_every_cell_skipped_with_the_reason(tmp_path):
    from sglpatch.matrix import rocm_job
    from sglpatch.matrix.records import SKIPPED, read_records

    project = _scratch_project(tmp_path)
    options = rocm_tier.RocmOptions(gpu=False, docker_url=f"unix://{tmp_path}/no-engine.sock")
    items = rocm_job.items_for("nightly")
    result = rocm_job.run_job(project, "0.5.23", items, options, event="nightly", on_log=lambda line: None)
    assert [r.cell_id for r in result.records] == [item.record_id("0.5.23") for item in items]
    assert {r.outcome for r in result.records} == {SKIPPED} and result.outcome == SKIPPED
    assert all("no docker engine" in r.reason for r in result.records)
    on_disk = {r.cell_id: r.outcome for r in read_records(project.build_dir / "matrix" / "records")}
    assert on_disk == {r.cell_id: SKIPPED for r in result.records}  # the job's own record is not a cell's
    job = json.loads(result.path.read_text())
    assert job["server_starts"] == 0 and "no docker engine" in job["reason"]


def test_a_job_without_dev_kfd_skips_the_matrix_and_the_bench_with_the_reason(tmp_path):
    from sglpatch.matrix import rocm_job
    from sglpatch.matrix.records import SKIPPED

    if rocm_tier.KFD.exists():
        import pytest

        pytest.skip("this machine has /dev/kfd: the no-GPU skip cannot be observed here")
    project = _scratch_project(tmp_path)
    for event in ("pr", "weekly"):
        result = rocm_job.run_job(project, "0.5.23", rocm_job.items_for(event), rocm_tier.RocmOptions(), event=event,
                                  on_log=lambda line: None)
        assert result.outcome == SKIPPED and result.outcomes and set(result.outcomes) == {SKIPPED}
        assert all("/dev/kfd" in r.reason for r in [*result.records, *result.bench_records])
    assert len(result.bench_records) == 3  # serving; single stream as shipped and custom-all-reduce


def test_the_sglpatch_matrix_job_door_prints_and_records_a_skip(tmp_path, capsys):
    from sglpatch import cli

    project = _scratch_project(tmp_path)
    record = tmp_path / "job.json"
    if rocm_tier.KFD.exists():
        import pytest

        pytest.skip("this machine has /dev/kfd")
    code = cli.main(["-q", "--root", str(project.root), "matrix", "job", "0.5.23", "--event", "nightly", "--record", str(record)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "rocm-job-0.5.23-nightly: skipped; 0 server start(s)" in out and "rocm-spec-0.5.23-d5" in out
    assert json.loads(record.read_text())["outcome"] == "skipped"


def test_a_server_that_never_came_up_fails_every_check_of_its_group_with_what_it_reported():
    report = {"healthy_s": None, "error": "the server exited with 1", "gpu": "AMD Instinct MI355X",
              "mismatch_lines": ["RuntimeError: size mismatch for model.decoder.mlp.shared_experts.gate_up_proj"]}
    record = CellRecord("rocm", "spec", "0.5.14", 5, "2", "ab" * 32, "skipped")
    rocm_tier.judge_figures(matrix.Cell("rocm", "spec", "0.5.14", 5), dict(report), record)
    outcomes = _outcomes(record)
    assert outcomes["server healthy"] == FAILED and outcomes["no shape mismatch in the server log"] == FAILED
    assert PASSED not in outcomes.values() and record.gpu == "AMD Instinct MI355X"


class _Created:
    """A created container whose engine fails its first starts with the given reasons (a test
    double of docker's Container: what is judged is what start() does with the engine's answers)."""

    def __init__(self, *failures: str):
        self.failures, self.starts = list(failures), 0

    def start(self):
        self.starts += 1
        if self.failures:
            error = RuntimeError("500 Server Error")
            error.explanation = self.failures.pop(0)
            raise error


def test_a_start_the_engine_fumbled_is_tried_again_and_a_real_refusal_is_not(monkeypatch):
    monkeypatch.setattr(containers.time, "sleep", lambda seconds: None)
    said = []
    hiccup = ("failed to create shim task: OCI runtime create failed: runc create failed: unable to start container "
              "process: can't get final child's PID from pipe: EOF: unknown")
    flaky = _Created(hiccup)
    assert containers.start(flaky, said.append) is None and flaky.starts == 2
    assert said and "trying again (2/3)" in said[0]
    refused = _Created("error gathering device information while adding custom device \"/dev/kfd\": no such file or directory")
    assert "/dev/kfd" in containers.start(refused, said.append) and refused.starts == 1
    broken = _Created(hiccup, hiccup, hiccup)
    assert containers.start(broken, said.append) == hiccup and broken.starts == containers.START_TRIES
