"""The rocm-flags witness on the real releases: every pin's own ServerArgs, resolved on CPU with the
GLM-5.2 MI355X launch profile, misses GLM-5's fp8 KV default on gfx950 and stays silent about an
inert fusion flag (bug; from 0.5.21 it also turns on a fusion that cannot run, or that a later hook
turns off or refuses); with patch 0003's
rendition for the pin every case is clean. Its decision rule, case by case, on hand-made answers."""

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
def test_pristine_pin_misses_the_kv_default_and_hides_the_inert_fusion_flag(version, tmp_path):
    result = witnessed(rocm_flags.RocmFlagsWitness(), version, False, tmp_path / "tree")
    print(f"{version}: {result} {result.cases}")
    assert result.state == BUG, result
    assert set(result.cases) == set(rocm_flags.CASES)
    # Every pin: bf16 on gfx950, logged for an "SM9" device, and the flag silent where it cannot run.
    for case in ("launch-kv-fp8-on-gfx950", "launch-kv-log-names-gfx950", "flag-no-custom-all-reduce-warns"):
        assert result.cases[case] == BUG, (case, result.cases)
    # From 0.5.21 the release itself turns the fusion on where it cannot run, and where a later hook
    # turns it off (deterministic inference) or refuses it (context parallelism); before, nothing
    # turns it on, and there is no default to keep.
    on_by_itself = tuple(int(x) for x in version.split(".")[:3]) >= (0, 5, 21)
    for case in ("launch-fusion-off-without-custom-all-reduce", "default-no-SGLANG_USE_AITER-stays-off",
                 "default-SGLANG_USE_AITER_AR-0-stays-off", "default-1stage-allreduce-stays-off",
                 "default-tp6-stays-off", "default-deterministic-stays-off", "default-context-parallel-stays-off"):
        assert result.cases[case] == (BUG if on_by_itself else CLEAN), (case, result.cases)
    for case in ("launch-no-warning-about-an-unpassed-flag", "default-fusion-on-for-decode-where-it-runs",
                 "default-dp-attention-stays-off", "flag-deterministic-warns-once", "flag-context-parallel-refused",
                 "flag-quiet-where-it-runs", "explicit-bf16-kept", "gfx942-keeps-bf16", "deepseek-v32-not-fp8-on-gfx950"):
        assert result.cases[case] == CLEAN, (case, result.cases)


@pytest.mark.network
@pytest.mark.parametrize("version", one_pin_per_rendition(PATCH))
def test_patched_pin_is_clean_in_every_case(version, tmp_path):
    result = witnessed(rocm_flags.RocmFlagsWitness(), version, True, tmp_path / "tree")
    print(f"{version}: {result} {result.cases}")
    assert result.state == CLEAN, result
    assert result.cases == dict.fromkeys(rocm_flags.CASES, CLEAN)
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
        assert set(result.cases.values()) == {UNAVAILABLE}
    allowed = {"standin_reads": ["aiter.QuantType (read at sglang/srt/layers/quantization/fp8_utils.py:30, module level)"]}
    assert witness.judge_probe({**answer, **allowed}, None, PINS.newest).state == CLEAN


# -- the decision rule, on hand-made probe answers: behaviour, whatever the words ------------------


def _scenario(fusion=False, kv="fp8_e4m3", records=(), prefill=False) -> dict:
    return {"error": None, "enable_aiter_allreduce_fusion": fusion, "disable_aiter_allreduce_fusion_in_prefill": prefill,
            "kv_cache_dtype": kv, "log_records": [{"level": lvl, "logger": "sglang.srt.arg_groups", "message": m}
                                                 for lvl, m in records], "warnings": []}


KV_LOG = ("WARNING", "Setting KV cache dtype to fp8_e4m3 for DeepSeek DSA on gfx950 device.")
CP_REFUSAL = "AssertionError: Aiter allreduce fusion is not supported with context parallelism"


def _fixed(words: str = "{flag}: it cannot engage here ({why})") -> dict:
    """Resolved scenarios as a fixed release gives them, its warning worded by ``words``."""
    flag = "--enable-aiter-allreduce-fusion"
    whys = {"flag-no-custom-all-reduce": "--disable-custom-all-reduce", "flag-no-SGLANG_USE_AITER": "SGLANG_USE_AITER unset",
            "flag-SGLANG_USE_AITER_AR-0": "SGLANG_USE_AITER_AR is 0", "flag-1stage-allreduce": "SGLANG_USE_1STAGE_ALLREDUCE",
            "flag-dp-attention": "DP attention", "flag-tp6": "tp_size=6"}
    fixed = {"launch": _scenario(records=[KV_LOG]), "launch-custom-all-reduce": _scenario(fusion=True, prefill=True),
             "flag": _scenario(fusion=True), "launch-bf16": _scenario(kv="bfloat16"),
             "launch-gfx942": _scenario(kv="bfloat16"), "deepseek-v32": _scenario(kv="bfloat16"),
             "flag-deterministic": _scenario(records=[("WARNING", f"Disable {flag} because deterministic inference is enabled.")]),
             "flag-context-parallel": {**_scenario(), "error": CP_REFUSAL}}
    fixed.update({scenario: _scenario(records=[KV_LOG]) for scenario in rocm_flags.SCENARIOS if scenario.startswith("default-")})
    for scenario, why in whys.items():
        fixed[scenario] = _scenario(fusion=True, records=[("WARNING", words.format(flag=flag, why=why))])
    return fixed


def test_the_answer_names_a_verdict_for_every_case_on_the_scenarios_it_resolves():
    assert set(rocm_flags.SCENARIOS) == {scenario for scenario, _ in rocm_flags.CASES.values()}
    result = rocm_flags.judge({"scenarios": _fixed(), "seconds": 1.0})
    assert result.state == CLEAN and result.cases == dict.fromkeys(rocm_flags.CASES, CLEAN), result


@pytest.mark.parametrize("words", [
    "{flag} has no effect: {why} is set. The all-reduce and the RMSNorm run unfused.",  # 0003's
    "ignoring {flag} ({why})",
    "enable_aiter_allreduce_fusion=True will not take effect: {why}",
])
def test_a_warning_naming_the_flag_and_why_in_any_words_is_enough(words):
    assert rocm_flags.judge({"scenarios": _fixed(words)}).state == CLEAN


def test_a_warning_that_does_not_name_the_flag_or_is_not_a_warning_is_silence():
    for records in ([("WARNING", "the all-reduce fusion cannot run")], [("INFO", "--enable-aiter-allreduce-fusion is inert")]):
        resolved = _fixed()
        resolved["flag-tp6"] = _scenario(fusion=True, records=records)
        result = rocm_flags.judge({"scenarios": resolved})
        assert result.state == BUG and [c for c, v in result.cases.items() if v == BUG] == ["flag-tp6-warns"]
        assert "silent" in result.detail


def test_a_warning_that_does_not_say_why_is_a_bug():
    resolved = _fixed()
    resolved["flag-dp-attention"] = _scenario(fusion=True, records=[("WARNING", "--enable-aiter-allreduce-fusion is inert")])
    result = rocm_flags.judge({"scenarios": resolved})
    assert [c for c, v in result.cases.items() if v == BUG] == ["flag-dp-attention-warns"], result


def test_the_release_turning_on_what_cannot_run_and_warning_about_a_flag_not_given_are_two_bugs():
    resolved = _fixed()
    resolved["launch"] = _scenario(fusion=True, records=[KV_LOG, ("WARNING", "--enable-aiter-allreduce-fusion has no effect")])
    result = rocm_flags.judge({"scenarios": resolved})
    assert [c for c, v in result.cases.items() if v == BUG] == [
        "launch-fusion-off-without-custom-all-reduce", "launch-no-warning-about-an-unpassed-flag"], result


def test_a_kv_default_logged_for_an_sm9_device_is_a_bug():
    resolved = _fixed()
    resolved["launch"] = _scenario(records=[("WARNING", "Setting KV cache dtype to fp8_e4m3 for DeepSeek DSA on SM9 device.")])
    assert rocm_flags.judge({"scenarios": resolved}).cases["launch-kv-log-names-gfx950"] == BUG


def test_a_default_that_also_fuses_prefill_is_a_bug():
    resolved = _fixed()
    resolved["launch-custom-all-reduce"] = _scenario(fusion=True, prefill=False)
    assert rocm_flags.judge({"scenarios": resolved}).cases["default-fusion-on-for-decode-where-it-runs"] == BUG


def test_a_warning_where_the_flag_runs_is_a_bug():
    resolved = _fixed()
    resolved["flag"] = _scenario(fusion=True, records=[("WARNING", "--enable-aiter-allreduce-fusion has no effect")])
    assert rocm_flags.judge({"scenarios": resolved}).cases["flag-quiet-where-it-runs"] == BUG


def test_a_scenario_the_probe_did_not_answer_is_unavailable_not_clean():
    resolved = _fixed()
    del resolved["flag-tp6"]
    result = rocm_flags.judge({"scenarios": resolved})
    assert result.state == UNAVAILABLE and result.cases["flag-tp6-warns"] == UNAVAILABLE
    assert result.cases["launch-kv-fp8-on-gfx950"] == CLEAN


@pytest.mark.parametrize("error", ["ValueError: tp_size 6 does not divide 64 heads", "SystemExit: 2",
                                   "AttributeError: 'NoneType' object has no attribute 'get_device_capability'"])
def test_an_exception_while_resolving_is_unavailable_with_the_exception_never_bug(error):
    resolved = _fixed()
    resolved["flag-tp6"] = {**_scenario(), "error": error}
    result = rocm_flags.judge({"scenarios": resolved, "seconds": 1.0})
    assert result.state == UNAVAILABLE, result
    assert f"flag-tp6: {error}" in result.detail


# -- GLM-5's default where a later hook turns the fusion off or refuses it; releases without one ---


def test_a_default_that_a_later_hook_turns_off_with_a_warning_about_the_flag_is_a_bug():
    resolved = _fixed()
    resolved["default-deterministic"] = _scenario(records=[
        KV_LOG, ("WARNING", "Disable --enable-aiter-allreduce-fusion because deterministic inference is enabled.")])
    result = rocm_flags.judge({"scenarios": resolved})
    assert [c for c, v in result.cases.items() if v == BUG] == ["default-deterministic-stays-off"], result


def test_a_default_that_context_parallelism_refuses_is_a_bug_not_unavailable():
    resolved = _fixed()
    resolved["default-context-parallel"] = {**_scenario(), "error": CP_REFUSAL}
    result = rocm_flags.judge({"scenarios": resolved})
    assert result.state == BUG and [c for c, v in result.cases.items() if v == BUG] == [
        "default-context-parallel-stays-off"], result


def test_another_error_with_context_parallelism_is_unavailable():
    resolved = _fixed()
    resolved["flag-context-parallel"] = {**_scenario(), "error": "ValueError: CP needs --enable-prefill-cp"}
    result = rocm_flags.judge({"scenarios": resolved})
    assert result.state == UNAVAILABLE and result.cases["flag-context-parallel-refused"] == UNAVAILABLE


def test_the_flag_with_context_parallelism_must_be_refused_and_not_warned_about():
    for got in (_scenario(fusion=True), {**_scenario(records=[("WARNING", "--enable-aiter-allreduce-fusion has no effect")]),
                                         "error": CP_REFUSAL}):
        resolved = _fixed()
        resolved["flag-context-parallel"] = got
        assert rocm_flags.judge({"scenarios": resolved}).cases["flag-context-parallel-refused"] == BUG


def test_two_warnings_about_the_flag_with_deterministic_inference_are_a_bug():
    resolved = _fixed()
    resolved["flag-deterministic"] = _scenario(records=[
        ("WARNING", "--enable-aiter-allreduce-fusion has no effect: --disable-custom-all-reduce is set."),
        ("WARNING", "Disable --enable-aiter-allreduce-fusion because deterministic inference is enabled.")])
    assert rocm_flags.judge({"scenarios": resolved}).cases["flag-deterministic-warns-once"] == BUG


def test_a_release_without_the_decode_only_field_has_no_default_to_keep():
    resolved = _fixed()
    resolved["launch-custom-all-reduce"] = {**_scenario(), "disable_aiter_allreduce_fusion_in_prefill": None}
    assert rocm_flags.judge({"scenarios": resolved}).cases["default-fusion-on-for-decode-where-it-runs"] == CLEAN
    # With the field, the default must be on for decode where the fused kernel runs.
    resolved["launch-custom-all-reduce"] = _scenario()
    assert rocm_flags.judge({"scenarios": resolved}).cases["default-fusion-on-for-decode-where-it-runs"] == BUG

