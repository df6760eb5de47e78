"""The mtp-quark-exclude witness on the real releases: each pristine pin gets some case of the
MTP draft's bf16-excluded modules wrong (an MXFP4 slot, or the shared expert fused into the
MXFP4 routed experts), and every case is right once patch 0002 is applied; and its decision rule,
case by case, on hand-made probe answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REAL_PINS as PINS
from conftest import apply_rendition, one_pin_per_rendition, pristine_subtree, skip_unless_required, witnessed
from sglpatch.witnesses import cpu_envs
from sglpatch.witnesses import mtp_exclude
from sglpatch.witnesses.probes.quark_checkpoint import quark_config_dict
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE

PATCH = "0002-quark-keep-mtp-draft-excluded-modules-unquantized.patch"


def _tree(version: str, dest: Path, patched: bool) -> Path:
    """The pin's python/sglang as released, with patch 0002's rendition for it applied if asked."""
    tree = pristine_subtree(version, dest)
    return apply_rendition(tree, PATCH, version) if patched else tree


def _skip_if_env_unavailable(result) -> None:
    if result.state == UNAVAILABLE and result.detail.startswith("CPU environment:"):
        skip_unless_required(f"the pin's CPU Python cannot be built here: {result.detail}")


@pytest.mark.network
@pytest.mark.parametrize("patched", [False, True], ids=["pristine", "patched"])
@pytest.mark.parametrize("version", one_pin_per_rendition(PATCH))
def test_every_case_is_clean_on_the_patched_pin_and_some_case_a_bug_on_the_pristine_one(version, patched, tmp_path):
    # The shipped series' trees, asked as apply asks (one run serves both, by tree and fingerprint).
    result = witnessed(mtp_exclude.MtpQuarkExcludeWitness(), version, patched, tmp_path / "tree")
    print(f"{version} {'patched' if patched else 'pristine'}: {result} {result.cases}")
    _skip_if_env_unavailable(result)
    assert result.level.startswith("build+load gfx950"), result
    assert set(result.cases) == set(mtp_exclude.CASES), result.cases
    if patched:
        assert result.state == CLEAN, result
        assert set(result.cases.values()) == {CLEAN}, result.cases
    else:
        assert result.state == BUG, result
        # No release carries re: patterns over to the draft: that case fails on every pin.
        assert result.cases["regex/shared-expert-unquantized"] == BUG, result.cases
        assert result.cases[mtp_exclude.CONTROL_CASE] == CLEAN, result.cases


def _glm_checkpoint(folder: Path) -> Path:
    """A tiny GlmMoeDsa checkpoint (3 layers, so the MTP layer is model.layers.3) whose Quark config
    keeps the MTP shared expert bf16 by the unfused names Quark writes; only the MTP layer's
    shared expert is stored."""
    from sglpatch.witnesses.probes.quark_checkpoint import I, H, hf_config_dict, save_bf16_tensors

    folder.mkdir()
    config = hf_config_dict(num_layers=3)
    config["quantization_config"] = quark_config_dict(
        ["lm_head", *(f"model.layers.3.mlp.shared_experts.{p}" for p in ("gate_proj", "up_proj", "down_proj"))]
    )
    (folder / "config.json").write_text(json.dumps(config))
    save_bf16_tensors(str(folder), {
        "model.layers.3.mlp.shared_experts.gate_proj.weight": (I, H),
        "model.layers.3.mlp.shared_experts.up_proj.weight": (I, H),
        "model.layers.3.mlp.shared_experts.down_proj.weight": (H, I),
    }, seed=7)
    return folder


@pytest.mark.network
@pytest.mark.parametrize("patched", [False, True], ids=["pristine", "patched"])
def test_resolve_mtp_modules_reports_each_module_of_a_given_checkpoint(patched, tmp_path):
    pin = PINS.select(["0.5.23"])[0]
    tree = _tree(pin.version, tmp_path / "tree", patched)
    try:
        answer = mtp_exclude.resolve_mtp_modules(tree, pin, checkpoint=_glm_checkpoint(tmp_path / "ckpt"))
    except cpu_envs.EnvUnavailable as exc:
        skip_unless_required(f"the pin's CPU Python cannot be built here: {exc}")
    case = answer["cases"]["checkpoint"]
    modules = case["modules"]
    gate_up = modules["shared_experts.gate_up_proj"]
    assert gate_up["checkpoint_names"] == [f"model.layers.3.mlp.shared_experts.{p}_proj.weight" for p in ("gate", "up")]
    if patched:
        # The prefix sglang asked the quant config about, as it built the module.
        assert gate_up["prefix"] == "model.decoder.mlp.shared_experts.gate_up_proj"
        assert (gate_up["quant_method"], gate_up["load"]) == ("UnquantizedLinearMethod", "ok"), gate_up
        assert modules["shared_experts.down_proj"]["load"] == "ok"
        assert case["draft_fusion"] == "off"
    else:
        # 0.5.23's draft fuses the shared expert into the MXFP4 routed experts on gfx950.
        assert case["draft_fusion"] == "on" and gate_up["load"] == "fused", gate_up
        assert not gate_up["unquantized"]
    # Not excluded and not in the checkpoint: quantized, nothing to load.
    assert not modules["self_attn.o_proj"]["unquantized"] and modules["self_attn.o_proj"]["load"] == "absent"
    assert modules["eh_proj"]["load"] == "absent"


# -- the decision rule, on hand-made probe answers -------------------------------------------------

MXFP4 = "QuarkLinearMethod(QuarkW4A4MXFP4)"
MOE = "QuarkFusedMoEMethod(QuarkW4A4MXFp4MoE)"
UNQ = "UnquantizedLinearMethod"
UNQ_MOE = "UnquantizedFusedMoEMethod"


def _module(method: str, load: str) -> dict:
    return {"prefix": "p", "module": "p", "checkpoint_names": [], "quant_method": method,
            "unquantized": method.startswith("Unquantized"), "load": load, "load_detail": "d"}


def _fused() -> dict:
    return {"prefix": None, "module": None, "fused_into": "model.decoder.mlp.experts", "checkpoint_names": [],
            "quant_method": MOE, "unquantized": False, "load": "fused", "load_detail": "built into the experts"}


def _answer(excluded: dict, fusion: str = "off", control: str = MXFP4, unfused: dict | None = None,
            control_fusion: str = "off") -> dict:
    """Every spelling answers ``excluded`` for its three modules as launched (draft fusion
    ``fusion``) and ``unfused`` (default: ``excluded``) when built with the fusion off; the routed
    experts are MXFP4 but for ``whole-moe``'s; ``none`` is all MXFP4 (draft fusion as launched
    ``control_fusion``)."""
    def case(modules: dict, fused: str, spelling: str = "none") -> dict:
        routed = _module(UNQ_MOE if spelling == "whole-moe" else MOE, "not-loaded-here")
        return {"draft_fusion": fused, "missing": [],
                "modules": {**modules, mtp_exclude.ROUTED_EXPERTS: routed,
                            "self_attn.o_proj": _module(control, "absent")}}
    quantized = {name: _module(MXFP4, "shape-mismatch") for name in mtp_exclude.EXCLUDED_MODULES}
    cases = {spelling: {**case(dict(excluded), fusion, spelling),
                        "fusion_disabled": case(dict(unfused or excluded), "off", spelling)}
             for spelling in mtp_exclude.EXCLUDED_SPELLINGS}
    none = {**case(quantized, control_fusion), "fusion_disabled": case(quantized, "off")}
    return {"emulated_gpu": "gfx950:sramecc+:xnack-", "cases": {**cases, "none": none}}


OK = {name: _module(UNQ, "ok") for name in mtp_exclude.EXCLUDED_MODULES}
FUSED = {**OK, "shared_experts.gate_up_proj": _fused(), "shared_experts.down_proj": _fused()}


def test_judge_says_clean_only_when_every_case_is():
    result = mtp_exclude.judge(_answer(OK))
    assert (result.state, result.level) == (CLEAN, "build+load gfx950"), result
    assert result.cases == dict.fromkeys(mtp_exclude.CASES, CLEAN)


@pytest.mark.parametrize(
    "module, got, case",
    [
        ("shared_experts.gate_up_proj", _module(MXFP4, "shape-mismatch"), "shared-expert-unquantized"),
        ("shared_experts.down_proj", _module(MXFP4, "silent-wrong"), "shared-expert-unquantized"),
        ("shared_experts.down_proj", _module(UNQ, "wrong-values"), "shared-expert-unquantized"),
        ("shared_experts.down_proj", _module(UNQ, "not-loaded"), "shared-expert-unquantized"),
        ("eh_proj", _module(MXFP4, "shape-mismatch"), "eh-proj-unquantized"),
    ],
    ids=["gate-up-mxfp4", "down-silently-wrong", "unquantized-but-wrong-values", "dropped-by-loader", "eh-proj-mxfp4"],
)
def test_judge_says_bug_for_the_case_of_the_module_quantized_or_loaded_wrong(module, got, case):
    modules = {**OK, module: got}
    result = mtp_exclude.judge(_answer(modules))
    assert result.state == BUG, result
    bugs = {name for name, verdict in result.cases.items() if verdict == BUG}
    assert bugs == {f"{spelling}/{case}" for spelling in mtp_exclude.EXCLUDED_SPELLINGS}, result.cases
    assert module in result.detail, result


def test_the_shared_expert_is_judged_as_built_with_the_fusion_off_and_the_fusion_apart():
    # As launched the draft fuses the excluded shared expert; built with the fusion off it is
    # unquantized and loads exactly: only the fusion is a bug (0.5.22-0.5.23 as released).
    # Where the routed experts are excluded too (whole-moe), bf16 is fused into bf16: clean.
    result = mtp_exclude.judge(_answer(FUSED, fusion="on", unfused=OK))
    assert result.state == BUG and "fused into the QuarkW4A4MXFp4MoE routed experts" in result.detail, result
    bugs = {name for name, verdict in result.cases.items() if verdict == BUG}
    assert bugs == {"exact/draft-fusion-off", "regex/draft-fusion-off"}, result.cases


def test_routed_experts_built_quantized_though_excluded_expert_by_expert_are_a_bug():
    answer = _answer(OK)
    answer["cases"]["whole-moe"]["modules"][mtp_exclude.ROUTED_EXPERTS] = _module(MOE, "not-loaded-here")
    result = mtp_exclude.judge(answer)
    bugs = {name for name, verdict in result.cases.items() if verdict == BUG}
    assert bugs == {"whole-moe/routed-experts-unquantized"} and "QuarkW4A4MXFp4MoE" in result.detail, result


def test_a_draft_that_turns_off_the_fusion_of_bf16_into_bf16_experts_is_a_bug_where_the_release_fuses():
    # The control (nothing excluded) fuses; whole-moe's experts are all unquantized, yet the draft
    # turned the fusion off: the gate asked too much. Where the control does not fuse, no verdict.
    result = mtp_exclude.judge(_answer(OK, control_fusion="on"))
    assert {n for n, v in result.cases.items() if v == BUG} == {"whole-moe/draft-fusion-kept"}, result.cases
    assert mtp_exclude.judge(_answer(OK, control_fusion="off")).state == CLEAN


def test_judge_cannot_tell_when_the_control_routed_experts_are_unquantized():
    answer = _answer(OK)
    answer["cases"]["none"]["fusion_disabled"]["modules"][mtp_exclude.ROUTED_EXPERTS] = _module(UNQ_MOE, "x")
    result = mtp_exclude.judge(answer)
    assert result.state == UNAVAILABLE and "routed_experts is unquantized" in result.detail, result


def test_a_shared_expert_fused_even_with_the_fusion_turned_off_is_no_verdict():
    answer = _answer(OK)
    answer["cases"]["exact"]["fusion_disabled"]["draft_fusion"] = "on"
    result = mtp_exclude.judge(answer)
    assert result.state == UNAVAILABLE and "--disable-shared-experts-fusion" in result.detail, result
    assert set(result.cases.values()) == {UNAVAILABLE}


def test_judge_counts_a_module_missing_from_the_built_draft_as_a_failure_of_the_probe():
    # A module the check needs is not in the draft sglang built: never skipped, never clean.
    answer = _answer(OK)
    del answer["cases"]["exact"]["modules"]["eh_proj"]
    result = mtp_exclude.judge(answer)
    assert result.state == UNAVAILABLE and "exact: eh_proj" in result.detail, result
    answer = _answer(OK)
    answer["cases"]["regex"]["fusion_disabled"]["missing"] = ["mlp.shared_experts.gate_up_proj"]
    assert mtp_exclude.judge(answer).state == UNAVAILABLE


def test_judge_says_unavailable_when_the_draft_fusion_could_not_be_read():
    answer = _answer(OK)
    answer["cases"]["exact"]["draft_fusion"] = "unavailable: neither the draft nor its MoE layer has num_fused_shared_experts"
    result = mtp_exclude.judge(answer)
    assert result.state == UNAVAILABLE and "fusion cannot be read" in result.detail, result


def test_judge_says_unavailable_when_the_loader_failed_on_a_tensor_the_module_could_hold():
    modules = {**OK, "eh_proj": {**_module(UNQ, "error"), "load_detail": "AssertionError: Torch not compiled with CUDA"}}
    result = mtp_exclude.judge(_answer(modules))
    assert result.state == UNAVAILABLE and "Torch not compiled with CUDA" in result.detail, result


def test_judge_cannot_tell_when_the_never_excluded_control_is_unquantized():
    result = mtp_exclude.judge(_answer(OK, control=UNQ))
    assert result.state == UNAVAILABLE and "cannot tell" in result.detail, result
    assert result.cases[mtp_exclude.CONTROL_CASE] == UNAVAILABLE


def test_judge_cannot_tell_when_a_case_failed_to_build():
    answer = _answer(OK)
    answer["cases"]["regex"] = {"error": "ValueError: boom"}
    result = mtp_exclude.judge(answer)
    assert result.state == UNAVAILABLE and "regex: ValueError: boom" in result.detail, result
    answer = _answer(OK)
    answer["cases"]["exact"]["fusion_disabled"] = {"error": "ValueError: bang"}
    assert "exact (fusion off): ValueError: bang" in mtp_exclude.judge(answer).detail


def test_a_probe_that_gave_no_answer_is_unavailable_with_its_reason():
    witness = mtp_exclude.MtpQuarkExcludeWitness()
    result = witness.judge_probe(None, "the CPU probe runner for tree hung in 'mtp: exact: build the draft'", None)
    assert result.state == UNAVAILABLE and "hung in 'mtp: exact: build the draft'" in result.detail


def test_the_witness_answer_carries_the_cases_of_its_judgement():
    witness = mtp_exclude.MtpQuarkExcludeWitness()
    result = witness.judge_probe(_answer(FUSED, fusion="on", unfused=OK), None, None)
    assert result.cases["exact/draft-fusion-off"] == BUG and result.cases["exact/shared-expert-unquantized"] == CLEAN


@pytest.mark.parametrize("leaning", [{"standins_called_in_load": ["aiter.ops.shuffle.shuffle_weight"]},
                                     {"standin_parts": ["quant_method"]}], ids=["called-while-loading", "built-in"])
def test_an_answer_whose_judged_module_rests_on_a_stand_in_is_unavailable_never_clean(leaning):
    modules = {**OK, "eh_proj": {**OK["eh_proj"], **leaning}}
    result = mtp_exclude.judge(_answer(modules))
    assert result.state == UNAVAILABLE and "eh_proj" in result.detail and "stand-in" in result.detail, result


def test_a_stand_in_called_only_while_the_rest_of_the_draft_was_built_judges_nothing():
    answer = _answer(OK)
    for case in answer["cases"].values():
        case["standins_called"] = ["aiter.rotary_embedding.get_rope"]  # the attention's rope
    assert mtp_exclude.judge(answer).state == CLEAN
