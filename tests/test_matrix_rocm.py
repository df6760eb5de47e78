"""The ROCm tier's judgement of what its in-container checks print, and what it asks docker for."""

from __future__ import annotations

import json
import py_compile
from pathlib import Path

import pytest

from sglpatch.matrix import job_plan, rocm_judge
from sglpatch.matrix.cells import Cell, DEPTHS
from sglpatch.matrix.records import FAILED, PASSED, CellRecord
from sglpatch.rocm import constants, containers, image
from sglpatch.rocm.containers import ContainerRun
from sglpatch.rocm.job import run_job
from sglpatch.rocm.options import IMAGE_ENV, RocmOptions


def _judge(cell: Cell, figures: dict | None, exit_code: int = 0, **run) -> CellRecord:
    record = CellRecord(cell.tier, cell.check, cell.pin, cell.depth, "2", "ab" * 32, "skipped")
    log = "server log line\n" + (json.dumps(figures) if figures is not None else "Traceback: boom")
    rocm_judge.judge(cell, ContainerRun(exit_code, log, **run), record)
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
    record = _judge(Cell("rocm", "spec", "0.5.14", 5), _spec_figures())
    assert set(_outcomes(record).values()) == {PASSED}, record.parts
    assert record.gpu == "AMD Instinct MI355X"
    assert record.figures["decode_ratio_vs_plain"] == round(205 / 80, 3)


def test_a_missing_rocm_guard_shows_as_collapsed_decode_speed_and_fails():
    # The bring-up: the failed compile is retried every step, decode drops ~30x: far below the
    # non-speculative decode (6.5 / 80 = x0.08, floor x0.5).
    record = _judge(Cell("rocm", "spec", "0.5.14", 5), _spec_figures(decode_tok_s=6.5))
    assert _outcomes(record)[rocm_judge.COLLAPSE_PART] == FAILED
    detail = next(part.detail for part in record.parts if part.name == rocm_judge.COLLAPSE_PART)
    assert "6.5 tok/s at depth 5 vs 80.0 without speculative decoding (x0.08" in detail


def test_depth_3_is_judged_against_the_non_speculative_decode_measured_on_its_own_server():
    # Depth 3 at 30 tok/s: against itself it would be x1.0; against the plain decode (80) it is x0.38.
    record = _judge(Cell("rocm", "spec", "0.5.14", 3), _spec_figures(decode_tok_s=30.0, accept_length=3.6))
    assert _outcomes(record)[rocm_judge.COLLAPSE_PART] == FAILED
    assert record.figures["decode_ratio_vs_plain"] == round(30 / 80, 3)
    groups = job_plan.job_groups([job_plan.Item("spec", 3)])
    launches = job_plan.Launches()
    speed = next(group for group in groups if any(step.kind == "speed" for step in group.steps))
    assert speed.launches == (launches.plain(),) and launches.plain() != launches.depth(3)
    assert not any(arg.startswith("--speculative") for arg in speed.launches[0].argv)


def test_accept_length_is_judged_against_the_floor_of_its_depth():
    floor = rocm_judge.ACCEPT_LENGTH_FLOORS[6]
    low = _judge(Cell("rocm", "spec", "0.5.14", 6), _spec_figures(accept_length=floor - 0.01))
    assert _outcomes(low)[f"accept length at least {floor}"] == FAILED
    missing = _judge(Cell("rocm", "spec", "0.5.14", 6), _spec_figures(accept_length=None))
    assert _outcomes(missing)[f"accept length at least {floor}"] == FAILED
    assert sorted(rocm_judge.ACCEPT_LENGTH_FLOORS) == list(DEPTHS)
    assert all(rocm_judge.ACCEPT_LENGTH_FLOORS[d] < d + 1 for d in DEPTHS)  # at most d + 1 per step


def test_the_depth_5_floor_is_sglangs_own_amd_ci_figure_and_the_others_follow_from_it():
    assert rocm_judge.ACCEPT_LENGTH_FLOORS[5] == 5.0
    floors = [rocm_judge.ACCEPT_LENGTH_FLOORS[d] for d in DEPTHS]
    assert floors == sorted(floors) and floors[0] > 1.0
    at_ci = _judge(Cell("rocm", "spec", "0.5.23", 5), _spec_figures(accept_length=4.99))
    assert _outcomes(at_ci)["accept length at least 5.0"] == FAILED


def test_greedy_outputs_that_diverge_from_the_non_speculative_run_fail():
    record = _judge(Cell("rocm", "spec", "0.5.14", 5), _spec_figures(prefix_match=[1.0, 0.2, 0.3, 0.5], exact_match=1))
    assert _outcomes(record)["greedy outputs against the non-speculative run"] == FAILED
    same = _judge(Cell("rocm", "spec", "0.5.14", 5), _spec_figures())
    assert _outcomes(same)["greedy outputs against the non-speculative run"] == PASSED


def test_a_burst_with_a_lost_request_and_a_shape_mismatch_fail():
    record = _judge(Cell("rocm", "spec", "0.5.14", 3), _spec_figures(
        burst_completed=31, burst_errors=["TimeoutError"],
        mismatch_lines=["RuntimeError: size mismatch for model.decoder.mlp.shared_experts.gate_up_proj"]))
    outcomes = _outcomes(record)
    assert outcomes["32 concurrent requests complete"] == FAILED
    assert outcomes["no shape mismatch in the server log"] == FAILED


def test_load_fails_when_the_server_never_becomes_healthy_or_prints_nothing():
    sick = _judge(Cell("rocm", "load", "0.5.14"), {"healthy_s": None, "mismatch_lines": [], "error": "exit 1"})
    assert _outcomes(sick)["server healthy"] == FAILED
    silent = _judge(Cell("rocm", "load", "0.5.14"), None, exit_code=1)
    assert [p.outcome for p in silent.parts] == [FAILED] and "no figures" in silent.parts[0].detail
    killed = _judge(Cell("rocm", "load", "0.5.14"), None, exit_code=None, timed_out=True)
    assert killed.parts[0].detail == "timed out"


def test_build_passes_only_when_every_loader_compiled():
    ok = _judge(Cell("rocm", "build", "0.5.14"), {"kernels": {"m._jit_a(0,)": "", "m._jit_b()": ""}, "gpu": "x"})
    assert [p.outcome for p in ok.parts] == [PASSED]
    bad = _judge(Cell("rocm", "build", "0.5.14"), {"kernels": {"m._jit_a(0,)": "fatal error: 'cuda_runtime.h'"}}, exit_code=1)
    assert [p.outcome for p in bad.parts] == [FAILED]
    nothing = _judge(Cell("rocm", "build", "0.5.14"), {"kernels": {}})
    assert [p.outcome for p in nothing.parts] == [FAILED]


def test_gpu_containers_get_sglangs_amd_ci_flags_and_aiter():
    assert containers.GPU_RUN_OPTIONS["devices"] == ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"]
    assert containers.GPU_RUN_OPTIONS["group_add"] == ["video"]
    assert containers.GPU_RUN_OPTIONS["shm_size"] == "32g"
    assert containers.GPU_RUN_OPTIONS["cap_add"] == ["SYS_PTRACE"]
    assert containers.GPU_RUN_OPTIONS["security_opt"] == ["seccomp=unconfined"]
    assert containers.GPU_ENV == {"SGLANG_USE_AITER": "1"}


def test_the_base_image_is_the_pins_release_unless_configured(monkeypatch):
    monkeypatch.delenv(IMAGE_ENV, raising=False)
    options = RocmOptions()
    assert options.image_for("0.5.14", "lmsysorg/sglang:v0.5.14-rocm720-mi35x") == "lmsysorg/sglang:v0.5.14-rocm720-mi35x"
    monkeypatch.setenv(IMAGE_ENV, "registry.local/sglang:v{version}-rocm")
    assert options.image_for("0.5.14", "unused") == "registry.local/sglang:v0.5.14-rocm"
    assert RocmOptions(base_image="mine:{version}").image_for("0.5.23", "unused") == "mine:0.5.23"


def test_the_in_container_checks_compile_with_the_standard_library_only(tmp_path):
    for script in sorted(image.CHECK_SCRIPTS.glob("*.py")):
        py_compile.compile(str(script), cfile=str(tmp_path / (script.name + "c")), doraise=True)
        imports = {line.split()[1].split(".")[0] for line in script.read_text().splitlines()
                   if line.startswith(("import ", "from ")) and not line.startswith("from __future__")}
        # sglpatch only as the host-side import of the sibling modules, with a fallback to them.
        assert imports <= {"json", "os", "re", "signal", "subprocess", "sys", "threading", "time", "urllib",
                           "pathlib", "importlib", "traceback", "math", "shlex", "shutil", "sglpatch",
                           "bench_metrics", "power", "serve_check"}, (script.name, imports)
    assert {p.name for p in image.CHECK_SCRIPTS.glob("*.py")} == {
        "__init__.py", "build_check.py", "serve_check.py", "bench_run.py", "bench_metrics.py", "power.py",
        "accuracy_check.py", "tune_moe.py"}


def test_serve_check_compares_greedy_outputs_by_prefix():
    import importlib.util

    spec = importlib.util.spec_from_file_location("serve_check", image.CHECK_SCRIPTS / "serve_check.py")
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
    from sglpatch.plumbing.project import Project

    for part in ("upstream", "patches"):
        shutil.copytree(REPO_ROOT / part, tmp_path / part)
    shutil.copy(REPO_ROOT / "series.lock", tmp_path / "series.lock")
    return Project(tmp_path)


def test_a_job_without_a_docker_engine_records_every_cell_skipped_with_the_reason(tmp_path):
    from sglpatch.matrix.records import SKIPPED, read_records

    project = _scratch_project(tmp_path)
    options = RocmOptions(gpu=False, docker_url=f"unix://{tmp_path}/no-engine.sock")
    items = job_plan.items_for("nightly")
    result = run_job(project, "0.5.23", items, options, event="nightly", on_log=lambda line: None)
    assert [r.cell_id for r in result.records] == [item.record_id("0.5.23") for item in items]
    assert {r.outcome for r in result.records} == {SKIPPED} and result.outcome == SKIPPED
    assert all("no docker engine" in r.reason for r in result.records)
    on_disk = {r.cell_id: r.outcome for r in read_records(project.build_dir / "matrix" / "records")}
    assert on_disk == {r.cell_id: SKIPPED for r in result.records}  # the job's own record is not a cell's
    job = json.loads(result.path.read_text())
    assert job["server_starts"] == 0 and "no docker engine" in job["reason"]


def test_a_job_without_dev_kfd_skips_the_matrix_and_the_bench_with_the_reason(tmp_path):
    from sglpatch.matrix.records import SKIPPED

    if constants.KFD.exists():
        import pytest

        pytest.skip("this machine has /dev/kfd: the no-GPU skip cannot be observed here")
    project = _scratch_project(tmp_path)
    for event in ("pr", "weekly"):
        result = run_job(project, "0.5.23", job_plan.items_for(event), RocmOptions(), event=event,
                                  on_log=lambda line: None)
        assert result.outcome == SKIPPED and result.outcomes and set(result.outcomes) == {SKIPPED}
        assert all("/dev/kfd" in r.reason for r in [*result.records, *result.bench_records])
    assert len(result.bench_records) == 3  # serving; single stream as shipped and custom-all-reduce


def test_the_sglpatch_matrix_job_door_prints_and_records_a_skip(tmp_path, capsys):
    from sglpatch import cli

    project = _scratch_project(tmp_path)
    record = tmp_path / "job.json"
    if constants.KFD.exists():
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
    rocm_judge.judge_figures(Cell("rocm", "spec", "0.5.14", 5), dict(report), record)
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


# -- the bug-level cells' synthetic checkpoint and what the synthetic servers are judged on -------

PROBES = Path(image.CHECKPOINT_SCRIPTS[0]).parent


def _serve_check():
    import importlib.util

    spec = importlib.util.spec_from_file_location("serve_check_under_test", image.CHECK_SCRIPTS / "serve_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_rocm_checkpoint_holds_every_tensor_mxfp4_packed_and_the_mtp_shared_expert_bf16_at_full_width(tmp_path):
    import os
    import struct
    import subprocess
    import sys

    from sglpatch.witnesses.probes.quark_checkpoint import read_safetensors_header

    out = tmp_path / "ckpt"
    # The generator as the job runs it (a script beside its sibling, the standard library only).
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-s", str(PROBES / "glm_checkpoint.py"), str(out), "--size", "rocm"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.splitlines()[-1])
    config = json.loads((out / "config.json").read_text())
    header = read_safetensors_header(str(out / "model.safetensors"))
    layers, h, inter = config["num_hidden_layers"], config["hidden_size"], config["moe_intermediate_size"]
    assert config["architectures"] == ["GlmMoeDsaForCausalLM"] and config["num_nextn_predict_layers"] == 1
    assert said["mtp_layer"] == layers == 4 and said["tensors"] == len(header)
    assert said["bytes"] == (out / "model.safetensors").stat().st_size < 2 * 2**30  # "a few GB at most"
    # What the ROCm kernels are built for stays GLM-5's.
    assert (config["kv_lora_rank"], config["qk_rope_head_dim"], config["qk_nope_head_dim"], config["v_head_dim"]) == (512, 64, 192, 256)
    assert (config["n_routed_experts"], config["num_experts_per_tok"], config["index_head_dim"]) == (256, 8, 128)
    # Per rank at TP2 what GLM-5 has per rank at TP8 (the write-up's single-stream layout).
    assert config["num_attention_heads"] // job_plan.SYNTHETIC_TP == 64 // 8
    assert config["moe_intermediate_size"] // job_plan.SYNTHETIC_TP == 2048 // 8
    # Quark's exclude list: the MTP layer's shared expert and eh_proj by their checkpoint names,
    # nothing of the routed experts or the other layers' shared experts.
    mtp = f"model.layers.{layers}"
    exclude = config["quantization_config"]["exclude"]
    assert config["quantization_config"]["quant_method"] == "quark"
    assert {f"{mtp}.mlp.shared_experts.gate_proj", f"{mtp}.mlp.shared_experts.up_proj",
            f"{mtp}.mlp.shared_experts.down_proj", f"{mtp}.eh_proj", "lm_head"} <= set(exclude)
    assert not any(".experts." in name or name.startswith("model.layers.3.mlp") for name in exclude)
    # bf16 at full width where excluded; MXFP4 as Quark stores it (two codes a byte, a scale per 32) elsewhere.
    assert header[f"{mtp}.mlp.shared_experts.gate_proj.weight"] == {**header[f"{mtp}.mlp.shared_experts.gate_proj.weight"],
                                                                   "dtype": "BF16", "shape": [inter, h]}
    assert f"{mtp}.mlp.shared_experts.gate_proj.weight_scale" not in header
    assert header[f"{mtp}.eh_proj.weight"]["shape"] == [h, 2 * h] and header[f"{mtp}.eh_proj.weight"]["dtype"] == "BF16"
    shared = header["model.layers.3.mlp.shared_experts.gate_proj.weight"]
    assert (shared["dtype"], shared["shape"]) == ("U8", [inter, h // 2])
    assert header["model.layers.3.mlp.shared_experts.gate_proj.weight_scale"]["shape"] == [inter, h // 32]
    for layer in range(config["first_k_dense_replace"], layers + 1):  # every routed expert of every MoE layer
        for expert in (0, 255):
            assert header[f"model.layers.{layer}.mlp.experts.{expert}.down_proj.weight"]["shape"] == [h, inter // 2]
    assert sum(name.endswith(".experts.17.up_proj.weight_scale") for name in header) == layers
    assert {f"{mtp}.{name}.weight" for name in ("enorm", "hnorm", "embed_tokens", "shared_head.norm", "shared_head.head")} <= set(header)
    # Random bf16 is finite: no exponent of all ones, read straight from the file.
    info = header[f"{mtp}.mlp.shared_experts.down_proj.weight"]
    with open(out / "model.safetensors", "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        handle.seek(8 + length + info["data_offsets"][0])
        values = struct.unpack(f"<{h * inter}H", handle.read(2 * h * inter))
    # every sign, both exponents (2^-7, 2^-6) and every mantissa: 512 values, none of them NaN or infinite
    assert all((value >> 7) & 0xFF != 0xFF for value in values) and len(set(values)) == 512
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) == config["vocab_size"] == 512
    # The final norms of target and draft are zero: every logit 0, greedy token 0 from both ("!"),
    # so every draft is accepted; the norms before them are ones.
    with open(out / "model.safetensors", "rb") as handle:
        for name, value in (("model.norm.weight", 0), (f"{mtp}.shared_head.norm.weight", 0), (f"{mtp}.enorm.weight", 0x3F80)):
            start, end = header[name]["data_offsets"]
            handle.seek(8 + length + start)
            assert set(struct.unpack(f"<{h}H", handle.read(end - start))) == {value}, name
    assert tokenizer["model"]["vocab"]["!"] == 0
    assert tokenizer["model"]["vocab"]["<|eos|>"] == config["eos_token_id"] == 257


def test_the_synthetic_tp_is_the_one_the_checkpoint_is_sized_for():
    import re

    sized = re.search(r"^ROCM_TP = (\d+)$", (PROBES / "glm_checkpoint.py").read_text(), re.MULTILINE)
    assert int(sized.group(1)) == job_plan.SYNTHETIC_TP
    launch = job_plan.Launches().shipped()
    assert launch.synthetic and launch.argv[launch.argv.index("--tp-size") + 1] == str(job_plan.SYNTHETIC_TP)
    assert RocmOptions(matrix_model=None).synthetic and not RocmOptions(matrix_model="/m").synthetic


def test_the_cpu_probes_checkpoint_is_unchanged_at_its_own_size():
    # The CPU tier's cached answers depend on these bytes: the default size still writes the MTP
    # tensors alone, the same seed, the same layout as before the ROCm size was added.
    import hashlib
    import tempfile

    from sglpatch.witnesses.probes import quark_checkpoint

    with tempfile.TemporaryDirectory() as folder:
        quark_checkpoint.save_bf16_tensors(folder, {"model.layers.78.eh_proj.weight": (64, 128)}, seed=78)
        data = Path(folder, "model-mtp.safetensors").read_bytes()
    assert hashlib.sha256(data).hexdigest()[:16] == "0fde70737c74f97b"  # from the code before (de2e803)


def test_a_failed_compile_of_the_metadata_kernel_fails_load_and_spec_and_a_repeat_is_named_retried():
    serve_check = _serve_check()
    line = ("ERROR Failed to compile JIT fused metadata copy multi kernel (has_real_page_table=True, has_flashmla=False): "
            "fatal error: 'cuda_runtime.h' file not found")
    log = "\n".join(["loading", line, "Warning: Multi-backend fused metadata copy kernel failed with error: x, falling back to loop.", line])
    findings = serve_check.log_findings(log)
    assert findings["compile_failures"] == 3 and findings["compile_failure_line"] == line[:300]
    for check, depth in (("spec", 5), ("load", None)):
        figures = {**_spec_figures(), **findings, "generate": "x", "flags_asked": {}}
        record = CellRecord("rocm", check, "0.5.14", depth, "2", "ab" * 32, "skipped")
        rocm_judge.judge_figures(Cell("rocm", check, "0.5.14", depth), figures, record, synthetic=True)
        part = next(p for p in record.parts if p.name == rocm_judge.COMPILE_PART)
        assert part.outcome == FAILED and "3 failed compile(s) (retried: the failure is not cached)" in part.detail
    assert serve_check.log_findings("all fine")["compile_failures"] == 0


def test_on_the_synthetic_checkpoint_accept_length_and_greedy_agreement_are_recorded_not_judged():
    figures = _spec_figures(accept_length=1.02, prefix_match=[0.1, 0.3], exact_match=0, compile_failures=0)
    record = CellRecord("rocm", "spec", "0.5.14", 6, "2", "ab" * 32, "skipped")
    rocm_judge.judge_figures(Cell("rocm", "spec", "0.5.14", 6), figures, record, synthetic=True)
    assert set(_outcomes(record).values()) == {PASSED}, record.parts
    assert not any(p.name.startswith(("accept length", "greedy outputs")) for p in record.parts)
    assert record.figures["accept_length"] == 1.02 and record.figures["prefix_match_mean"] == 0.2
    assert record.figures["not_judged"] == ["accept_length", "prefix_match"] and record.figures["checkpoint"] == "synthetic"
    # The same figures on the full model fail both.
    full = CellRecord("rocm", "spec", "0.5.14", 6, "2", "ab" * 32, "skipped")
    rocm_judge.judge_figures(Cell("rocm", "spec", "0.5.14", 6), dict(figures), full)
    assert [p.name for p in full.parts if p.outcome == FAILED] == [
        "greedy outputs against the non-speculative run", f"accept length at least {rocm_judge.ACCEPT_LENGTH_FLOORS[6]}"]


def test_the_launchs_flags_are_read_back_from_the_server_and_one_it_runs_otherwise_fails_load():
    serve_check = _serve_check()
    argv = list(job_plan.Launches().shipped().argv)
    asked = serve_check.flags_asked(argv)
    assert asked == {"kv_cache_dtype": "fp8_e4m3", "enable_aiter_allreduce_fusion": True, "speculative_num_steps": 5,
                     "tp_size": job_plan.SYNTHETIC_TP}
    # Flat before 0.5.17, in namespaces after: found either way.
    nested = {"server_args": {"exec": {"comm": {"enable_aiter_allreduce_fusion": True}}, "kv_cache_dtype": "auto"}}
    assert serve_check.find_fields(nested, set(asked)) == {"kv_cache_dtype": "auto", "enable_aiter_allreduce_fusion": True}

    def part(resolved, findings=()):
        return rocm_judge.flags_part({"flags_asked": asked, "flags_resolved": resolved, "flag_findings": list(findings)})

    assert part(dict(asked)).outcome == PASSED
    said = part(dict(asked), ["--enable-aiter-allreduce-fusion has no effect: custom all-reduce is disabled"])
    assert said.outcome == PASSED and "has no effect" in said.detail  # recorded beside, not a failure
    wrong = part({**asked, "kv_cache_dtype": "bfloat16"})
    assert wrong.outcome == FAILED and "kv_cache_dtype: asked 'fp8_e4m3', the server runs 'bfloat16'" in wrong.detail
    unknown = part({key: value for key, value in asked.items() if key != "tp_size"})
    assert unknown.outcome == "skipped" and "tp_size" in unknown.detail


@pytest.fixture(scope="module")
def rocm_checkpoint(tmp_path_factory):
    import os
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("rocm-checkpoint") / "ckpt"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run([sys.executable, "-s", str(PROBES / "glm_checkpoint.py"), str(out), "--size", "rocm"],
                   check=True, capture_output=True, timeout=600, env=env)
    return out


@pytest.mark.network
@pytest.mark.parametrize("patched", [False, True], ids=["pristine", "patched"])
@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_the_pins_own_sglang_builds_the_rocm_checkpoints_draft_wrong_until_patched(version, patched, rocm_checkpoint, tmp_path):
    """The checkpoint the ROCm job writes, read on CPU by the pin's own sglang (the MTP witness's
    probe, gfx950 emulated): the draft layer's modules, their quant methods and how their tensors
    load. What only the ROCm runner adds is the server around it."""
    from conftest import REAL_PINS, apply_rendition, pristine_subtree, skip_unless_required
    from sglpatch.witnesses import cpu_envs
    from sglpatch.witnesses import mtp_exclude

    pin = REAL_PINS.select([version])[0]
    tree = pristine_subtree(version, tmp_path / "tree")
    if patched:
        tree = apply_rendition(tree, "0002-quark-keep-mtp-draft-excluded-modules-unquantized.patch", version)
    try:
        answer = mtp_exclude.resolve_mtp_modules(tree, pin, checkpoint=rocm_checkpoint)
    except cpu_envs.EnvUnavailable as exc:
        skip_unless_required(f"the pin's CPU Python cannot be built here: {exc}")
    case = answer["cases"]["checkpoint"]
    assert "error" not in case or not case["error"], case
    modules = case["modules"]
    if patched:
        for name in ("shared_experts.gate_up_proj", "shared_experts.down_proj", "eh_proj", "self_attn.o_proj"):
            assert (modules[name]["quant_method"], modules[name]["load"]) == ("UnquantizedLinearMethod", "ok"), (name, modules[name])
        assert modules["shared_experts.gate_up_proj"]["prefix"] == "model.decoder.mlp.shared_experts.gate_up_proj"
    else:
        # The bring-up's bug: the bf16 shared expert built into the MXFP4 routed experts, not as
        # its own bf16 module; on 0.5.14 eh_proj too is built MXFP4 and its load refused.
        assert modules["shared_experts.gate_up_proj"]["load"] in ("fused", "shape-mismatch", "silent-wrong")
        if version == "0.5.14":
            assert modules["eh_proj"]["load"] == "shape-mismatch", modules["eh_proj"]
