"""The rocm-flags witness on the real releases: every pin's own ServerArgs, resolved on CPU with the
GLM-5.2 MI355X launch profile, misses the fusion / fp8 KV defaults or stays silent about an inert
fusion (bug); with patch 0003's rendition for the pin it does neither (clean)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REAL_PINS as PINS
from conftest import apply_rendition, one_pin_per_rendition, pristine_subtree, witnessed
from sglpatch.witnesses import probing, rocm_flags
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE

PATCH = "0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default"



def _pristine_tree(pin, dest: Path) -> Path:
    return pristine_subtree(pin.version, dest)


def _patched(tree: Path, version: str) -> Path:
    return apply_rendition(tree, PATCH, version)


@pytest.mark.network
@pytest.mark.parametrize("version", one_pin_per_rendition(PATCH))
def test_pristine_pin_misses_the_defaults_or_hides_the_inert_fusion(version, tmp_path):
    result = witnessed(rocm_flags.RocmFlagsWitness(), version, False, tmp_path / "tree")
    print(f"{version}: {result}")
    assert result.state == BUG, result
    # Every pin: the profile's KV default is bf16 on gfx950 and no pin warns about the inert fusion.
    assert "defaults: kv_cache_dtype bfloat16, want fp8_e4m3" in result.detail
    assert "profile: silent" in result.detail


@pytest.mark.network
@pytest.mark.parametrize("version", one_pin_per_rendition(PATCH))
def test_patched_pin_defaults_fusion_and_fp8_and_names_every_inert_gate(version, tmp_path):
    result = witnessed(rocm_flags.RocmFlagsWitness(), version, True, tmp_path / "tree")
    print(f"{version}: {result}")
    assert result.state == CLEAN, result
    # Every answer proves it leaned on no stand-in while resolving (else it is unavailable).
    assert "called: none" in result.detail, result


@pytest.mark.network
def test_resolve_server_args_reports_depth_normalisation_and_rejected_argv(tmp_path):
    pin = PINS.select(["0.5.23"])[0]
    depth3 = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "6"]
    resolved = rocm_flags.resolve_server_args(
        _pristine_tree(pin, tmp_path),
        pin,
        {
            # The profile is depth 5 (5/1/6); depth 3 with a stale draft-token count: sglang
            # forces D = N + 1 when top-k is 1.
            "depth3": (depth3, {}),
            "bad-tp": (["--tp-size", "eight"], {}),
        },
    )
    depth = resolved["depth3"]
    assert depth["error"] is None, depth
    assert (depth["speculative_algorithm"], depth["speculative_num_steps"], depth["speculative_eagle_topk"]) == (
        "EAGLE",
        3,
        1,
    )
    assert depth["speculative_num_draft_tokens"] == 4
    assert isinstance(depth["warnings"], list)
    assert resolved["bad-tp"]["error"] and "SystemExit" in resolved["bad-tp"]["error"]


def test_profile_argv_edits_drop_and_override_the_profiles_flags():
    profile = rocm_flags.load_profile(rocm_flags.PROFILE)
    edits = ["!--kv-cache-dtype", "!--disable-custom-all-reduce", "--tp-size", "6"]
    argv = probing.profile_argv(profile, "/m", edits)
    assert "--kv-cache-dtype" not in argv and "--disable-custom-all-reduce" not in argv
    assert argv[:2] == ["--model-path", "/m"]
    # argparse keeps the last value, so the scenario's --tp-size wins over the profile's.
    assert argv[len(argv) - 1 - argv[::-1].index("--tp-size") + 1] == "6"
    assert "--enable-aiter-allreduce-fusion" in argv and argv[argv.index("--device") + 1] == "cuda"


# -- the stand-ins change nothing judged -----------------------------------------------------------


@pytest.mark.network
@pytest.mark.parametrize("patched", [False, True], ids=["pristine", "patched"])
@pytest.mark.parametrize("version", [PINS.pins[0].version, PINS.newest.version])
def test_the_judged_resolution_reads_nothing_from_the_stand_ins(version, patched, tmp_path):
    """sgl_kernel and aiter are stood in by name. While the witness's scenarios resolve, sglang's
    code reads no attribute of them (present or absent: no hasattr probe, no version check) and
    calls none, so the judged values are as sglang computes them; the one read besides
    ``from m import name`` is the ``aiter.QuantType`` enum, taken as a constant at the top level
    of fp8_utils when a scenario first imports it."""
    from sglpatch.witnesses import probe_runs

    pin = PINS.select([version])[0]
    tree = _pristine_tree(pin, tmp_path / "tree")
    if patched:
        _patched(tree, version)
    request = rocm_flags.probe_request(rocm_flags.load_profile(rocm_flags.PROFILE), rocm_flags.SCENARIOS, tmp_path)
    run = probe_runs.cpu_python(pin).run_probes(tree, [request])
    assert run.failure(rocm_flags.PROBE) is None, run.failure(rocm_flags.PROBE)
    answer = run.answers[rocm_flags.PROBE]
    print(f"{version}: {answer['standins']}; feature probes {answer['feature_probes']}; "
          f"read at import {run.runner['standin_reads_at_import']}")
    assert any(s.startswith("aiter (named") for s in answer["standins"])
    assert set(answer["scenarios"]) == set(rocm_flags.SCENARIOS)
    assert answer["standins_called"] == []
    for read in [*answer["standin_reads"], *run.runner["standin_reads_at_import"]]:
        assert read.startswith("aiter.QuantType (read at ") and read.endswith(", module level)"), read


def test_an_answer_that_leaned_on_a_stand_in_is_unavailable_never_clean():
    witness = rocm_flags.RocmFlagsWitness()
    answer = {"scenarios": _fixed(), "standins": ["aiter (named: 40 names)"], "emulated_gpu": "gfx950"}
    assert witness.judge_probe(answer, None, PINS.newest).state == CLEAN
    for leaned in ({"standins_called": ["aiter.fused_moe"]},
                   {"standin_reads": ["aiter.get_hip_quant (read at sglang/srt/server_args.py:12)"]}):
        result = witness.judge_probe({**answer, **leaned}, None, PINS.newest)
        assert result.state == UNAVAILABLE and "used a stand-in" in result.detail, result
    allowed = {"standin_reads": ["aiter.QuantType (read at sglang/srt/layers/quantization/fp8_utils.py:30, module level)"]}
    assert witness.judge_probe({**answer, **allowed}, None, PINS.newest).state == CLEAN


# -- the decision rule, on hand-made probe answers: behaviour, whatever the words ------------------


def _scenario(fusion=True, kv="fp8_e4m3", records=(), prefill=True) -> dict:
    return {"error": None, "enable_aiter_allreduce_fusion": fusion, "disable_aiter_allreduce_fusion_in_prefill": prefill,
            "kv_cache_dtype": kv, "log_records": [{"level": lvl, "logger": "sglang.srt.server_args", "message": m}
                                                 for lvl, m in records], "warnings": []}


def _fixed(words: str = "{flag}: it cannot engage here") -> dict:
    """Resolved scenarios as a fixed release would give them, its warning worded by ``words``."""
    warn = [("WARNING", words.format(flag="--enable-aiter-allreduce-fusion"))]
    return {"profile": _scenario(records=warn), "defaults": _scenario(records=warn), "custom-all-reduce": _scenario(),
            "no-SGLANG_USE_AITER": _scenario(kv=None, records=warn), "dp-attention": _scenario(kv=None, records=warn),
            "tp6": _scenario(kv=None, records=warn), "user-bf16": _scenario(kv="bfloat16"), "gfx942": _scenario(kv="bfloat16")}


@pytest.mark.parametrize("words", [
    "{flag} has no effect: --disable-custom-all-reduce is set. The unfused all-reduce is used.",  # 0003's
    "ignoring {flag} (no custom all-reduce communicator)",
    "enable_aiter_allreduce_fusion=True will not take effect on this configuration",
])
def test_a_warning_naming_the_flag_in_any_words_is_enough(words):
    resolved = _fixed(words)
    assert rocm_flags.check(resolved) == []
    assert rocm_flags.judge({"scenarios": resolved, "seconds": 1.0}).state == CLEAN


def test_a_warning_that_does_not_name_the_flag_or_is_not_a_warning_is_silence():
    for records in ([("WARNING", "the all-reduce fusion cannot run")], [("INFO", "--enable-aiter-allreduce-fusion is inert")]):
        resolved = _fixed()
        resolved["profile"] = _scenario(records=records)
        problems = rocm_flags.check(resolved)
        assert [name for name, _ in problems] == ["profile"] and "silent" in problems[0][1], problems


def test_a_warning_where_every_gate_is_open_is_a_bug():
    resolved = _fixed()
    resolved["custom-all-reduce"] = _scenario(records=[("WARNING", "--enable-aiter-allreduce-fusion has no effect")])
    assert [name for name, _ in rocm_flags.check(resolved)] == ["custom-all-reduce"]


def test_a_scenario_the_probe_did_not_answer_is_unavailable_not_clean():
    resolved = _fixed()
    del resolved["tp6"]
    assert rocm_flags.judge({"scenarios": resolved}).state == UNAVAILABLE


@pytest.mark.parametrize("error", ["ValueError: tp_size 6 does not divide 64 heads", "SystemExit: 2",
                                   "AttributeError: 'NoneType' object has no attribute 'get_device_capability'"])
def test_an_exception_while_resolving_is_unavailable_with_the_exception_never_bug(error):
    resolved = _fixed()
    resolved["tp6"] = {**_scenario(kv=None), "error": error}
    result = rocm_flags.judge({"scenarios": resolved, "seconds": 1.0})
    assert result.state == UNAVAILABLE, result
    assert f"tp6: {error}" in result.detail
