"""Probe (runs in a pin's CPU Python): write a tiny GlmMoeDsa checkpoint shaped like the pin's own.

Usage: glm_checkpoint.py OUT_DIR

The config starts from the ``GlmMoeDsaConfig`` of the transformers the pin pins (GLM-5's shape:
78 hidden layers, so the MTP layer is ``model.layers.78``, 256 routed experts and one shared), with
every width divided down so the tensors are a few kilobytes; layer count, expert counts and the
MTP layer's index stay as they are. Its ``quantization_config`` is Quark MXFP4 as Quark writes it
for GLM-5.2: the MTP layer's shared expert and ``eh_proj`` excluded (kept bf16) by their exact
checkpoint names, and the safetensors file holds those bf16 tensors at full width.

Prints one JSON line: {"folder", "mtp_layer", "excluded", "shape"}; as a probe of ``runner.py``
(``run``) that is its answer.
"""

from __future__ import annotations

import json
import os
import sys

from quark_checkpoint import quark_config_dict, save_bf16_tensors

# Width divisors: 6144 -> 64 hidden, 2048 -> 32 expert width; heads and ranks become tiny.
SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 8,
    "qk_head_dim": 16,
    "v_head_dim": 8,
    "index_head_dim": 16,
    "index_n_heads": 2,
    "index_topk": 16,
    "vocab_size": 128,
    "max_position_embeddings": 256,
}

def glm_config() -> dict:
    from transformers import GlmMoeDsaConfig

    config = {k: v for k, v in GlmMoeDsaConfig().to_dict().items() if not k.startswith("_") and k != "transformers_version"}
    config.update({key: value for key, value in SMALL.items() if key in config})
    config.update(architectures=["GlmMoeDsaForCausalLM"], num_nextn_predict_layers=1, torch_dtype="bfloat16")
    # Fields GLM-5's config.json carries that sglang's DeepSeek-family code reads and the pin's
    # transformers class may not define (the router; the dense layers before the MoE ones).
    config.setdefault("topk_method", "noaux_tc")
    config.setdefault("scoring_func", "sigmoid")
    config.setdefault("first_k_dense_replace", 3)
    return config


def write(out: str) -> dict:
    """Write the checkpoint into ``out``; what was written (folder, MTP layer, excluded names, shape)."""
    config = glm_config()
    layer = config["num_hidden_layers"]  # the MTP layer's index in the checkpoint
    hidden, expert = config["hidden_size"], config["moe_intermediate_size"] * config.get("n_shared_experts", 1)
    prefix = f"model.layers.{layer}"
    excluded = {
        f"{prefix}.mlp.shared_experts.gate_proj": (expert, hidden),
        f"{prefix}.mlp.shared_experts.up_proj": (expert, hidden),
        f"{prefix}.mlp.shared_experts.down_proj": (hidden, expert),
        f"{prefix}.eh_proj": (hidden, 2 * hidden),
    }
    config["quantization_config"] = quark_config_dict(["lm_head", *excluded])
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w") as handle:
        json.dump(config, handle, indent=1)
    save_bf16_tensors(out, {f"{name}.weight": shape for name, shape in excluded.items()}, seed=78)
    shape = {key: config[key] for key in ("num_hidden_layers", "hidden_size", "moe_intermediate_size",
                                          "n_routed_experts", "n_shared_experts", "num_experts_per_tok")}
    return {"folder": out, "mtp_layer": layer, "excluded": list(excluded), "shape": shape}


def run(spec: dict, context) -> dict:
    """As a probe of ``runner.py`` (before the MTP probe that reads the folder, in one child)."""
    context.phase("write the GlmMoeDsa checkpoint")
    return write(spec["folder"])


def main(out: str) -> int:
    print(json.dumps(write(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
