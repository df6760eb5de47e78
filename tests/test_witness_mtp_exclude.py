"""The mtp-quark-exclude witness on the real releases: the MTP draft builds the bf16-excluded
shared expert as MXFP4 on every pristine pin, and unquantized (loading the bf16 tensors exactly)
once patch 0002 is applied; and its decision rule on hand-made probe answers."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import pytest

from conftest import REAL_PINS as PINS
from conftest import apply_rendition, pristine_subtree, skip_unless_required
from sglpatch import pyenv
from sglpatch.witnesses import BUG, CLEAN, UNAVAILABLE, mtp_exclude
from sglpatch.witnesses.probes.quark_checkpoint import quark_config_dict

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
@pytest.mark.parametrize("version", [pin.version for pin in PINS.pins])
def test_mtp_draft_builds_excluded_shared_expert_mxfp4_until_patched(version, patched, tmp_path):
    pin = PINS.select([version])[0]
    result = mtp_exclude.MtpQuarkExcludeWitness().run(_tree(version, tmp_path, patched), pin)
    print(f"{version} {'patched' if patched else 'pristine'}: {result}")
    _skip_if_env_unavailable(result)
    assert result.level.startswith("build+load gfx950"), result
    if patched:
        assert result.state == CLEAN, result
        assert "shared_experts.gate_up_proj" in result.detail and "shared_experts.down_proj" in result.detail
    else:
        assert result.state == BUG, result
        # Upstream's own remapping (0.5.16 on) covers exact fused names only; the unfused names
        # Quark writes and re: patterns fail on every pin.
        for spelling in ("unfused", "regex"):
            assert spelling in result.detail, result


def _bf16_safetensors(path: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    """A safetensors file of bf16 tensors (finite values), written by hand: no torch here."""
    rng = random.Random(7)
    header, blobs, offset = {}, [], 0
    for name, shape in shapes.items():
        count = shape[0] * shape[1]
        data = b"".join(struct.pack("<f", rng.uniform(-1, 1))[2:] for _ in range(count))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def _glm_checkpoint(folder: Path) -> Path:
    """A tiny GlmMoeDsa checkpoint whose Quark config keeps the MTP shared expert bf16 (unfused
    names, as Quark writes them); only the MTP layer's shared expert is stored."""
    folder.mkdir()
    config = {
        "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "num_hidden_layers": 3,
        "num_nextn_predict_layers": 1, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
        "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
        "first_k_dense_replace": 0, "moe_layer_freq": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
        "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
        "vocab_size": 128, "rms_norm_eps": 1e-5, "hidden_act": "silu", "max_position_embeddings": 256,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    config["quantization_config"] = quark_config_dict(
        ["lm_head", *(f"model.layers.3.mlp.shared_experts.{p}" for p in ("gate_proj", "up_proj", "down_proj"))]
    )
    (folder / "config.json").write_text(json.dumps(config))
    _bf16_safetensors(folder / "model.safetensors", {
        "model.layers.3.mlp.shared_experts.gate_proj.weight": (32, 64),
        "model.layers.3.mlp.shared_experts.up_proj.weight": (32, 64),
        "model.layers.3.mlp.shared_experts.down_proj.weight": (64, 32),
    })
    return folder


@pytest.mark.network
@pytest.mark.parametrize("patched", [False, True], ids=["pristine", "patched"])
def test_resolve_mtp_modules_reports_each_module_of_a_given_checkpoint(patched, tmp_path):
    pin = PINS.select(["0.5.23"])[0]
    tree = _tree(pin.version, tmp_path / "tree", patched)
    try:
        answer = mtp_exclude.resolve_mtp_modules(tree, pin, checkpoint=_glm_checkpoint(tmp_path / "ckpt"))
    except pyenv.EnvUnavailable as exc:
        skip_unless_required(f"the pin's CPU Python cannot be built here: {exc}")
    modules = answer["cases"]["checkpoint"]["modules"]
    gate_up = modules["shared_experts.gate_up_proj"]
    assert gate_up["prefix"] == "model.decoder.mlp.shared_experts.gate_up_proj"
    assert gate_up["checkpoint_names"] == [f"model.layers.3.mlp.shared_experts.{p}_proj.weight" for p in ("gate", "up")]
    if patched:
        assert (gate_up["quant_method"], gate_up["load"]) == ("UnquantizedLinearMethod", "ok"), gate_up
        assert modules["shared_experts.down_proj"]["load"] == "ok"
    else:
        assert not gate_up["unquantized"] and gate_up["load"] == "shape-mismatch", gate_up
        # 0.5.23's own remapping copies exact names, and down_proj is not a fused module: it works.
        assert modules["shared_experts.down_proj"]["load"] == "ok"
    # Not excluded and not in the checkpoint: quantized, nothing to load.
    assert not modules["self_attn.o_proj"]["unquantized"] and modules["self_attn.o_proj"]["load"] == "absent"
    assert modules["eh_proj"]["load"] == "absent"


# -- the decision rule, on hand-made probe answers -------------------------------------------------

MXFP4 = "QuarkLinearMethod(QuarkW4A4MXFP4)"
UNQ = "UnquantizedLinearMethod"


def _module(method: str, load: str) -> dict:
    return {"prefix": "p", "checkpoint_names": [], "quant_method": method, "unquantized": method == UNQ,
            "load": load, "load_detail": "d"}


def _answer(excluded: dict, fusion: str = "off", control: str = MXFP4) -> dict:
    """Every spelling answers ``excluded`` for its three modules; ``none`` is all MXFP4."""
    def case(modules: dict, fused: str) -> dict:
        return {"draft_fusion": fused, "modules": {**modules, "self_attn.o_proj": _module(control, "absent")}}
    quantized = {name: _module(MXFP4, "absent") for name in mtp_exclude.EXCLUDED_MODULES}
    cases = {spelling: case(excluded, fusion) for spelling in mtp_exclude.EXCLUDED_SPELLINGS}
    return {"emulated_gpu": "gfx950:sramecc+:xnack-", "cases": {**cases, "none": case(quantized, "on")}}


def test_judge_says_clean_only_when_every_excluded_module_is_unquantized_and_loads_exactly():
    ok = {name: _module(UNQ, "ok") for name in mtp_exclude.EXCLUDED_MODULES}
    result = mtp_exclude.judge(_answer(ok))
    assert (result.state, result.level) == (CLEAN, "build+load gfx950"), result


@pytest.mark.parametrize(
    "module, got",
    [
        ("shared_experts.gate_up_proj", _module(MXFP4, "shape-mismatch")),
        ("shared_experts.down_proj", _module(MXFP4, "silent-wrong")),
        ("eh_proj", _module(MXFP4, "shape-mismatch")),
        ("shared_experts.down_proj", _module(UNQ, "wrong-values")),
    ],
    ids=["gate-up-mxfp4", "down-silently-wrong", "eh-proj-mxfp4", "unquantized-but-wrong-values"],
)
def test_judge_says_bug_when_one_excluded_module_is_quantized_or_loads_wrong(module, got):
    modules = {name: _module(UNQ, "ok") for name in mtp_exclude.EXCLUDED_MODULES}
    modules[module] = got
    result = mtp_exclude.judge(_answer(modules))
    assert result.state == BUG, result
    assert module in result.detail and "fused, unfused, regex: " in result.detail, result


def test_judge_says_bug_when_the_draft_fuses_the_excluded_shared_expert():
    ok = {name: _module(UNQ, "ok") for name in mtp_exclude.EXCLUDED_MODULES}
    result = mtp_exclude.judge(_answer(ok, fusion="on"))
    assert result.state == BUG and "fused into the MXFP4 routed experts" in result.detail, result


def test_judge_without_a_quantized_eh_proj_checks_the_shared_expert_alone():
    # Before 0.5.11 eh_proj is a plain nn.Linear, so the probe does not report it.
    ok = {name: _module(UNQ, "ok") for name in mtp_exclude.SHARED_EXPERT}
    assert mtp_exclude.judge(_answer(ok)).state == CLEAN


def test_judge_cannot_tell_when_the_never_excluded_control_is_unquantized():
    ok = {name: _module(UNQ, "ok") for name in mtp_exclude.EXCLUDED_MODULES}
    result = mtp_exclude.judge(_answer(ok, control=UNQ))
    assert result.state == UNAVAILABLE and "cannot tell" in result.detail, result


def test_judge_cannot_tell_when_a_case_failed_to_build():
    answer = _answer({name: _module(UNQ, "ok") for name in mtp_exclude.EXCLUDED_MODULES})
    answer["cases"]["regex"] = {"error": "ValueError: boom"}
    result = mtp_exclude.judge(answer)
    assert result.state == UNAVAILABLE and "regex: ValueError: boom" in result.detail, result
