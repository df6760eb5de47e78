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

``glm_checkpoint.py OUT_DIR --size rocm``: the same model scaled for the ROCm tier's bug-level
cells (``sglpatch.rocm.job`` runs it in the pin's patched image): every tensor a server
loads (random, seeded; the final norms zero, so target and draft agree), the MXFP4 modules
stored as Quark stores them (packed fp4 codes and e8m0 scales), the exclusions bf16 as above,
and a byte-level tokenizer, about 1.0 GB. The widths the
ROCm kernels are built for stay GLM-5's (MLA ranks and head dims, the DSA indexer, 256 experts,
top 8); only depth, hidden and MoE widths, heads and vocabulary shrink (``ROCM``). Standard library
only; the config starts from the image's transformers ``GlmMoeDsaConfig`` where it has one, else
from GLM-5's published fields (``GLM5``), and says which (``config_from``).
"""

from __future__ import annotations

import json
import os
import sys

from quark_checkpoint import quark_config_dict, save_bf16_tensors, save_tensors

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


def write(out: str, size: str = "cpu") -> dict:
    """Write the checkpoint into ``out``; what was written (folder, MTP layer, excluded names, shape).
    ``size="rocm"``: the whole model, for a server (``write_rocm``)."""
    if size == "rocm":
        return write_rocm(out)
    if size != "cpu":
        raise ValueError(f"size {size!r}: cpu or rocm")
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


# -- the ROCm tier's checkpoint: a server loads every tensor of it -------------------------------

# GLM-5's config.json fields sglang reads, as transformers' GlmMoeDsaConfig defaults them (its
# docstring's checkpoint, zai-org/GLM-5), for an image whose transformers predates the class.
GLM5 = {
    "model_type": "glm_moe_dsa", "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288,
    "moe_intermediate_size": 2048, "num_hidden_layers": 78, "num_attention_heads": 64, "num_key_value_heads": 64,
    "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
    "q_lora_rank": 2048, "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1,
    "topk_group": 1, "num_experts_per_tok": 8, "norm_topk_prob": True, "hidden_act": "silu",
    "max_position_embeddings": 202752, "rms_norm_eps": 1e-5, "bos_token_id": 0, "eos_token_id": 1,
    "tie_word_embeddings": False, "attention_bias": False, "index_topk": 2048, "index_head_dim": 128,
    "index_n_heads": 32, "first_k_dense_replace": 3, "rope_theta": 10000.0,
}
# What shrinks, and why the rest does not. The ROCm tier serves it at TP2 (ROCM_TP), four servers
# on one node at once.
ROCM_TP = 2
ROCM = {
    # One dense layer, three MoE layers, then the MTP layer model.layers.4: the bring-up's
    # mismatch is about model.layers.{num_hidden_layers}, whatever the count.
    "num_hidden_layers": 4,
    "first_k_dense_replace": 1,
    # Per rank at TP2 what GLM-5 has per rank at TP8, the write-up's single-stream layout: 256 MoE
    # columns (2048 / 8) and 8 heads (64 / 8). Widths stay multiples of 256.
    "hidden_size": 1024,
    "intermediate_size": 2048,
    "moe_intermediate_size": 512,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": 512,  # a plain GEMM's width, not a kernel's
    # The tokenizer written beside it: 256 bytes (id 0 is "!"), 3 specials, reserved tokens up to 512.
    "vocab_size": 512,
    "bos_token_id": 256,
    "eos_token_id": 257,
    "pad_token_id": 258,
    # The checks send short prompts; the rope cache and KV pool follow this.
    "max_position_embeddings": 8192,
}
SPECIAL_TOKENS = ("<|bos|>", "<|eos|>", "<|pad|>")


def rocm_config() -> tuple[dict, str]:
    """(the ROCm checkpoint's config, where its fields come from)."""
    try:
        import transformers
        from transformers import GlmMoeDsaConfig
    except ImportError:
        config, source = {**GLM5, **ROCM}, "GLM-5's published fields (no GlmMoeDsaConfig in this Python)"
    else:
        # Built with the sizes, not updated after: the class derives per-layer lists from the depth.
        config = {k: v for k, v in GlmMoeDsaConfig(**ROCM).to_dict().items()
                  if not k.startswith("_") and k != "transformers_version"}
        source = f"transformers {transformers.__version__} GlmMoeDsaConfig"
    config.update(architectures=["GlmMoeDsaForCausalLM"], num_nextn_predict_layers=1, torch_dtype="bfloat16")
    # As glm_config: fields sglang's DeepSeek-family code reads that transformers' class may not
    # define (found by the pins' own sglang building the draft from this config on CPU).
    config.setdefault("topk_method", "noaux_tc")
    config.setdefault("scoring_func", "sigmoid")
    config.setdefault("moe_layer_freq", 1)
    return config, source


def _linear(name: str, rows: int, cols: int, bf16: bool) -> list[tuple]:
    """A linear layer's tensors: bf16, or MXFP4 as Quark stores it (two fp4 codes a byte, one e8m0
    scale per 32 inputs)."""
    if bf16:
        return [(f"{name}.weight", "BF16", (rows, cols), "random")]
    return [(f"{name}.weight", "U8", (rows, cols // 2), "random"), (f"{name}.weight_scale", "U8", (rows, cols // 32), "scale")]


def rocm_tensors(config: dict, excluded: set[str]) -> list[tuple]:
    """Every tensor of the model and its MTP layer, by checkpoint name, in DeepSeek-V3/GLM-5 naming."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    heads, rope, nope, v = (config[k] for k in ("num_attention_heads", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"))
    q_rank, kv_rank = config["q_lora_rank"], config["kv_lora_rank"]
    index_heads, index_dim = config["index_n_heads"], config["index_head_dim"]
    experts, inter = config["n_routed_experts"], config["moe_intermediate_size"]
    shared = inter * config["n_shared_experts"]

    def norm(name: str, width: int) -> tuple:
        return (f"{name}.weight", "BF16", (width,), "ones")

    def mlp(prefix: str, width: int) -> list[tuple]:
        return [*_linear(f"{prefix}.gate_proj", width, h, f"{prefix}.gate_proj" in excluded),
                *_linear(f"{prefix}.up_proj", width, h, f"{prefix}.up_proj" in excluded),
                *_linear(f"{prefix}.down_proj", h, width, f"{prefix}.down_proj" in excluded)]

    def layer(i: int) -> list[tuple]:
        p, a = f"model.layers.{i}", f"model.layers.{i}.self_attn"
        out = [norm(f"{p}.input_layernorm", h), norm(f"{p}.post_attention_layernorm", h),
               *_linear(f"{a}.q_a_proj", q_rank, h, True), norm(f"{a}.q_a_layernorm", q_rank),
               *_linear(f"{a}.q_b_proj", heads * (nope + rope), q_rank, True),
               *_linear(f"{a}.kv_a_proj_with_mqa", kv_rank + rope, h, True), norm(f"{a}.kv_a_layernorm", kv_rank),
               *_linear(f"{a}.kv_b_proj", heads * (nope + v), kv_rank, True),
               *_linear(f"{a}.o_proj", h, heads * v, True),
               *_linear(f"{a}.indexer.wq_b", index_heads * index_dim, q_rank, True),
               *_linear(f"{a}.indexer.wk", index_dim, h, True),
               *_linear(f"{a}.indexer.weights_proj", index_heads, h, True),
               norm(f"{a}.indexer.k_norm", index_dim), (f"{a}.indexer.k_norm.bias", "BF16", (index_dim,), "zeros")]
        if i < config["first_k_dense_replace"]:
            return out + mlp(f"{p}.mlp", config["intermediate_size"])
        out += [(f"{p}.mlp.gate.weight", "BF16", (experts, h), "random"),
                (f"{p}.mlp.gate.e_score_correction_bias", "F32", (experts,), "zeros")]
        for e in range(experts):
            out += mlp(f"{p}.mlp.experts.{e}", inter)
        return out + mlp(f"{p}.mlp.shared_experts", shared)

    # The target's and the draft's final norms are zero, so every logit is exactly 0 and greedy
    # decoding (argmax: the first of equal values) emits token 0 from both: every draft token is
    # accepted, so speculative decoding outruns plain decoding as it does on the trained model and
    # a stalled decode still shows against it. Everything before the norms is random and runs.
    final = ("model.norm.weight", "BF16", (h,), "zeros")
    tensors = [("model.embed_tokens.weight", "BF16", (vocab, h), "random"), final,
               ("lm_head.weight", "BF16", (vocab, h), "random")]
    for i in range(layers):
        tensors += layer(i)
    m = f"model.layers.{layers}"
    return tensors + layer(layers) + [
        (f"{m}.embed_tokens.weight", "BF16", (vocab, h), "random"), norm(f"{m}.enorm", h), norm(f"{m}.hnorm", h),
        *_linear(f"{m}.eh_proj", h, 2 * h, f"{m}.eh_proj" in excluded),
        (f"{m}.shared_head.norm.weight", "BF16", (h,), "zeros"),
        (f"{m}.shared_head.head.weight", "BF16", (vocab, h), "random")]


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character table, which the tokenizers library's ByteLevel steps use."""
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in visible:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tokenizer(out: str, vocab_size: int) -> None:
    """A byte-level BPE tokenizer without merges (any text encodes, one token a byte): the 256
    bytes, printable ones first (so id 0, the zero-logit model's every token, is "!"), the special
    tokens, then reserved tokens up to the model's vocabulary, so every id decodes."""
    chars = _byte_alphabet()
    vocab = {chars[b]: i for i, b in enumerate(sorted(range(256), key=lambda b: (chars[b] != chr(b), b)))}
    added = []
    for token in SPECIAL_TOKENS:
        added.append({"id": len(vocab), "content": token, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True})
        vocab[token] = len(vocab)
    for i in range(len(vocab), vocab_size):
        # Not special: a reserved id decodes to visible text, so a greedy output is never empty.
        added.append({"id": i, "content": f"<|reserved_{i}|>", "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": False})
        vocab[f"<|reserved_{i}|>"] = i
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
                 "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
                 "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                           "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                           "merges": []}}
    with open(os.path.join(out, "tokenizer.json"), "w") as handle:
        json.dump(tokenizer, handle)
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL_TOKENS[0], "eos_token": SPECIAL_TOKENS[1],
                "pad_token": SPECIAL_TOKENS[2], "model_max_length": ROCM["max_position_embeddings"], "add_bos_token": False}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as handle:
        json.dump(settings, handle, indent=1)


def rocm_excluded(config: dict) -> list[str]:
    """Quark's exclude list, exact names as Quark writes them: lm_head, every attention module (the
    MLA and indexer paths take bf16 weights), the MTP layer's shared expert and eh_proj."""
    attention = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "indexer.wq_b", "indexer.wk",
                 "indexer.weights_proj")
    layers = config["num_hidden_layers"]
    names = ["lm_head"]
    for i in range(layers + 1):
        names += [f"model.layers.{i}.self_attn.{module}" for module in attention]
    m = f"model.layers.{layers}"
    return names + [f"{m}.mlp.shared_experts.gate_proj", f"{m}.mlp.shared_experts.up_proj",
                    f"{m}.mlp.shared_experts.down_proj", f"{m}.eh_proj"]


def write_rocm(out: str, seed: int = 78) -> dict:
    """The ROCm checkpoint in ``out``: config.json, model.safetensors, the tokenizer."""
    config, source = rocm_config()
    excluded = rocm_excluded(config)
    config["quantization_config"] = quark_config_dict(excluded)
    os.makedirs(out, exist_ok=True)
    tensors = rocm_tensors(config, set(excluded))
    size = save_tensors(os.path.join(out, "model.safetensors"), tensors, seed)
    write_tokenizer(out, config["vocab_size"])
    # config.json last: a folder with one is complete.
    with open(os.path.join(out, "config.json"), "w") as handle:
        json.dump(config, handle, indent=1)
    layer = config["num_hidden_layers"]
    shape = {key: config[key] for key in ("num_hidden_layers", "hidden_size", "moe_intermediate_size",
                                          "n_routed_experts", "n_shared_experts", "num_experts_per_tok")}
    mtp_bf16 = [name for name in excluded if name.startswith(f"model.layers.{layer}.") and "self_attn" not in name]
    return {"folder": out, "mtp_layer": layer, "excluded": mtp_bf16, "shape": shape, "config_from": source,
            "tensors": len(tensors), "bytes": size, "tp": ROCM_TP}


def run(spec: dict, context) -> dict:
    """As a probe of ``runner.py`` (before the MTP probe that reads the folder, in one child)."""
    context.phase("write the GlmMoeDsa checkpoint")
    return write(spec["folder"])


def main(argv: list[str]) -> int:
    size = argv[argv.index("--size") + 1] if "--size" in argv else "cpu"
    print(json.dumps(write(argv[0], size)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
