"""Synthetic Quark MXFP4 checkpoints, as Quark writes them, for the probes and the tests.

One definition of the ``quantization_config`` (MXFP4 weights and activations, an exclude list),
of the tiny GLM-5-shaped model the MTP witness builds, and of the bf16 tensors an excluded module
is stored with, shared by the MTP witness's probe, the matrix's GLM checkpoint probe and the
tests. Only the standard library is used (the safetensors file is written by hand), so the test
process and ``sglpatch`` itself import it too (``sglpatch.witnesses.probes.quark_checkpoint``).
"""

from __future__ import annotations

import json
import os
import random
import struct

N = 2  # num_hidden_layers of the tiny model: its MTP layer is model.layers.2.*
H = 64  # hidden_size
I = 32  # moe_intermediate_size (one shared expert)
ROUTED_EXPERTS = 256  # n_routed_experts, as GLM-5
SPELLINGS = ("exact", "whole-moe", "regex", "none")
# The MTP layer's modules a GLM-5.2 Quark checkpoint keeps bf16, by the names of their weights
# in the checkpoint, relative to model.layers.{N}: (rows, columns) of each.
MTP_BF16_TENSORS = {
    "mlp.shared_experts.gate_proj.weight": (I, H),
    "mlp.shared_experts.up_proj.weight": (I, H),
    "mlp.shared_experts.down_proj.weight": (H, I),
    "eh_proj.weight": (H, 2 * H),
}


def _mxfp4(dynamic: bool) -> dict:
    return {
        "dtype": "fp4", "is_dynamic": dynamic, "qscheme": "per_group", "ch_axis": -1, "group_size": 32,
        "symmetric": None, "round_method": "half_even", "scale_type": "float", "scale_format": "e8m0",
        "scale_calculation_mode": "even", "mx_element_dtype": None, "observer_cls": "PerBlockMXObserver",
        "is_scale_quant": False,
    }


def quark_config_dict(exclude: list[str]) -> dict:
    """A ``quantization_config`` as Quark writes it for MXFP4 weights and activations."""
    return {
        "quant_method": "quark", "version": "0.10", "quant_mode": "eager_mode",
        "export": {"kv_cache_group": [], "min_kv_scale": 0.0, "pack_method": "reorder",
                   "weight_format": "real_quantized", "weight_merge_groups": None},
        "global_quant_config": {"weight": _mxfp4(False), "input_tensors": _mxfp4(True), "output_tensors": None,
                                "bias": None, "target_device": None},
        "exclude": exclude, "algo_config": None, "layer_quant_config": {}, "layer_type_quant_config": {},
        "kv_cache_quant_config": {},
    }


def hf_config_dict(num_layers: int = N) -> dict:
    """A GLM-5 config.json (GlmMoeDsaForCausalLM), tiny: the fields sglang's DeepSeek-family
    code reads (MoE routing, MLA ranks, the DSA indexer), 256 routed experts and one shared as
    GLM-5, widths divided down."""
    return dict(
        architectures=["GlmMoeDsaForCausalLM"], model_type="glm_moe_dsa", num_hidden_layers=num_layers,
        num_nextn_predict_layers=1, hidden_size=H, intermediate_size=2 * H, moe_intermediate_size=I,
        n_shared_experts=1, n_routed_experts=ROUTED_EXPERTS, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=0, moe_layer_freq=1, topk_method="noaux_tc", scoring_func="sigmoid",
        routed_scaling_factor=2.5, norm_topk_prob=True, num_attention_heads=2, num_key_value_heads=2,
        q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
        index_topk=16, index_head_dim=16, index_n_heads=2, vocab_size=128, rms_norm_eps=1e-5,
        hidden_act="silu", max_position_embeddings=256, rope_theta=10000.0, tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )


def exclude_list(spelling: str, layer: int = N) -> list[str]:
    """Quark's exclude list keeping the MTP shared expert and eh_proj bf16, spelled one way:
    ``exact`` (the names Quark writes: the checkpoint's own ``gate_proj``/``up_proj``/``down_proj``,
    with the routed experts quantized), ``whole-moe`` (the same, and every routed expert of the
    MTP layer by its exact names too, expert by expert: the MTP layer's MoE all bf16, as upstream
    describes amd/GLM-5.2-MXFP4), ``regex`` (``re:`` patterns, the other form Quark's
    ``exclude`` takes), ``none`` (a control: nothing of the MTP layer excluded)."""
    L = f"model.layers.{layer}"
    if spelling == "exact":
        return ["lm_head", f"{L}.mlp.shared_experts.gate_proj", f"{L}.mlp.shared_experts.up_proj",
                f"{L}.mlp.shared_experts.down_proj", f"{L}.eh_proj"]
    if spelling == "whole-moe":
        return [*exclude_list("exact", layer), *(f"{L}.mlp.experts.{e}.{p}" for e in range(ROUTED_EXPERTS)
                                                  for p in ("gate_proj", "up_proj", "down_proj"))]
    if spelling == "regex":
        return ["lm_head", rf"re:model\.layers\.{layer}\.mlp\.shared_experts\..*", rf"re:model\.layers\.{layer}\.eh_proj$"]
    if spelling == "none":
        return ["lm_head"]
    raise ValueError(spelling)


def write_mtp_checkpoint(folder: str, spelling: str, seed: int = 0) -> str:
    """config.json (tiny GLM-5, Quark MXFP4, the MTP exclusions spelled ``spelling``) and one
    safetensors file holding the MTP layer's shared expert and eh_proj in bf16 at full width."""
    config = hf_config_dict()
    config["quantization_config"] = quark_config_dict(exclude_list(spelling))
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(config, handle, indent=1)
    # The control writes the same tensors: sglang refuses a checkpoint without weights.
    save_bf16_tensors(folder, {f"model.layers.{N}.{name}": shape for name, shape in MTP_BF16_TENSORS.items()}, seed)
    return folder


def save_bf16_tensors(folder: str, shapes: dict[str, tuple[int, ...]], seed: int) -> None:
    """``model-mtp.safetensors`` in ``folder``: seeded random bf16 tensors of the given shapes,
    written in the safetensors format by hand (an 8-byte header length, the JSON header, data)."""
    rng = random.Random(seed)
    header, blobs, offset = {}, [], 0
    for name, shape in shapes.items():
        count = 1
        for size in shape:
            count *= size
        # bf16 is the high half of a float32; values in [-1, 1) are finite and exact in bf16.
        data = b"".join(struct.pack("<f", rng.uniform(-1, 1))[2:] for _ in range(count))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(folder, "model-mtp.safetensors"), "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# -- whole checkpoints, gigabytes of them: the ROCm tier's synthetic GLM-5 (glm_checkpoint.py) ----

DTYPE_BYTES = {"BF16": 2, "F32": 4, "U8": 1}
# The high byte of a bf16 whose exponent is 120 or 121 (the low byte's top bit picks which), with
# the sign of the random byte it replaces: magnitudes in [2^-7, 2^-5), small enough that a random
# model's activations stay finite through its layers, never NaN or infinite.
_BF16_HIGH = bytes(0x3C | (b & 0x80) for b in range(256))
# e8m0 scales of an MXFP4 block: 2^-9 .. 2^-7 (biased 118..120); an fp4 value is at most 6, so
# dequantized weights stay in the bf16 weights' range.
_E8M0 = bytes(118 + b % 3 for b in range(256))


def tensor_bytes(rng: random.Random, dtype: str, count: int, fill: str) -> bytes:
    """``count`` values: "random" (seeded: bf16 as above; U8 any byte, i.e. any two fp4 codes, all
    finite), "scale" (U8 e8m0 MXFP4 scales), "ones" or "zeros". Bulk byte operations only, so
    gigabytes take seconds in any Python."""
    if fill == "zeros":
        return bytes(count * DTYPE_BYTES[dtype])
    if fill == "ones":
        one = {"BF16": struct.pack("<H", 0x3F80), "F32": struct.pack("<f", 1.0), "U8": b"\x01"}[dtype]
        return one * count
    if fill == "scale" and dtype == "U8":
        return rng.randbytes(count).translate(_E8M0)
    if fill == "random" and dtype == "U8":
        return rng.randbytes(count)
    if fill == "random" and dtype == "BF16":
        out = bytearray(2 * count)
        out[0::2] = rng.randbytes(count)
        out[1::2] = rng.randbytes(count).translate(_BF16_HIGH)
        return bytes(out)
    raise ValueError(f"no {fill!r} fill for {dtype}")


def save_tensors(path: str, tensors: list[tuple[str, str, tuple[int, ...], str]], seed: int) -> int:
    """A safetensors file of (name, dtype, shape, fill) tensors, streamed one tensor at a time (a
    whole checkpoint never sits in memory); its size in bytes."""
    rng = random.Random(seed)
    header, offset = {}, 0
    for name, dtype, shape, _ in tensors:
        count = 1
        for size in shape:
            count *= size
        size = count * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(text)) + text)
        for name, dtype, shape, fill in tensors:
            start, end = header[name]["data_offsets"]
            handle.write(tensor_bytes(rng, dtype, (end - start) // DTYPE_BYTES[dtype], fill))
    return 8 + len(text) + offset


def read_safetensors_header(path: str) -> dict:
    """A safetensors file's header (name -> dtype, shape, offsets), without reading its data."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(length))
