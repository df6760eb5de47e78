"""Write the rehearsal's tiny checkpoint: a 2-layer Llama-architecture model with seeded random
weights and a byte-level tokenizer, written here, from nothing downloaded.

Usage: llama_checkpoint.py FOLDER

Runs in the rehearsal's server Python (torch, safetensors, tokenizers). The tokenizer has one
token per byte (no merges) plus three special tokens, so any text encodes and a prompt of N
ASCII characters is N tokens; the weights make the answers nonsense, which is all a rehearsal
of the checks' plumbing needs. Prints one JSON line: {"folder", "parameters", "vocab_size"}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    # GSM8K's few-shot prompts are a few thousand bytes, one token each.
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02,
}
SEED = 31


def byte_tokenizer(folder: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()  # the 256 printable stand-ins byte-level BPE maps bytes to
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[0], "eos_token": SPECIALS[1],
        "pad_token": SPECIALS[2], "model_max_length": CONFIG["max_position_embeddings"], "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
    }, indent=1))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": SPECIALS[0], "eos_token": SPECIALS[1], "pad_token": SPECIALS[2]}, indent=1))
    return tokenizer.get_vocab_size()


def weights(vocab_size: int) -> dict:
    import torch

    generator = torch.Generator().manual_seed(SEED)
    h, i, heads, kv, d = (CONFIG[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                                "num_key_value_heads", "head_dim"))

    def rand(*shape):
        return (torch.randn(*shape, generator=generator) * CONFIG["initializer_range"]).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": rand(vocab_size, h), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
               "lm_head.weight": rand(vocab_size, h)}
    for layer in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors.update({
            p + "self_attn.q_proj.weight": rand(heads * d, h), p + "self_attn.k_proj.weight": rand(kv * d, h),
            p + "self_attn.v_proj.weight": rand(kv * d, h), p + "self_attn.o_proj.weight": rand(h, heads * d),
            p + "mlp.gate_proj.weight": rand(i, h), p + "mlp.up_proj.weight": rand(i, h),
            p + "mlp.down_proj.weight": rand(h, i),
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        })
    return tensors


def write(folder: Path) -> dict:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = byte_tokenizer(folder)
    config = {**CONFIG, "vocab_size": vocab_size, "bos_token_id": 256, "eos_token_id": 257, "pad_token_id": 258}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 256, "eos_token_id": 257}))
    tensors = weights(vocab_size)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return {"folder": str(folder), "parameters": sum(t.numel() for t in tensors.values()), "vocab_size": vocab_size}


if __name__ == "__main__":
    print(json.dumps(write(Path(sys.argv[1]))))
