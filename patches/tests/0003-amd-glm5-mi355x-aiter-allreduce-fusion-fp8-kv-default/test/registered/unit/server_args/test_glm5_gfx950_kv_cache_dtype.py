"""GLM-5 (GlmMoeDsaForCausalLM) on gfx950 (MI355X) defaults its DSA KV cache to fp8_e4m3.

The DSA KV cache default is keyed on the CUDA capability major (fp8_e4m3 from 10 on);
gfx950 reports 9.5, so ``--kv-cache-dtype auto`` resolved to bfloat16 there and the
log called the GPU an "SM9 device". Server arguments are resolved as launch_server
resolves them, on an emulated 8-GPU ROCm node.

    python3 test/registered/unit/server_args/test_glm5_gfx950_kv_cache_dtype.py -v
"""

import json
import logging
import os
import tempfile
import unittest
from contextlib import contextmanager
from types import SimpleNamespace
from unittest.mock import patch

import torch

from sglang.srt.runtime_context import override_platform
from sglang.srt.server_args import prepare_server_args
from sglang.srt.utils import common
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=5, suite="base-a-test-cpu")

# DSA shapes shared by GLM-5 and DeepSeek-V3.2; no weights are read.
DSA_CONFIG = {
    "hidden_size": 6144,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 78,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "kv_lora_rank": 512,
    "q_lora_rank": 2048,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "vocab_size": 154880,
    "max_position_embeddings": 202752,
    "torch_dtype": "bfloat16",
}
MODELS = {
    "glm5": {"architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa"},
    "deepseek_v32": {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
    },
}
GPUS = {
    "gfx950": ("gfx950:sramecc+:xnack-", "AMD Instinct MI355X", (9, 5)),
    "gfx942": ("gfx942:sramecc+:xnack-", "AMD Instinct MI300X", (9, 4)),
}


@contextmanager
def rocm_node(gpu):
    gcn_arch, name, capability = GPUS[gpu]
    properties = SimpleNamespace(
        gcnArchName=gcn_arch,
        name=name,
        major=capability[0],
        minor=capability[1],
        total_memory=192 * 1024**3,
        multi_processor_count=256,
    )
    with (
        override_platform(is_hip=True, is_cuda=False, is_npu=False, is_xpu=False),
        patch.dict(os.environ, {"SGLANG_USE_AITER": "1"}),
        patch.object(torch.version, "hip", "7.0.0"),
        patch.object(torch.cuda, "is_available", return_value=True),
        patch.object(torch.cuda, "device_count", return_value=8),
        patch.object(torch.cuda, "get_device_capability", return_value=capability),
        patch.object(torch.cuda, "get_device_properties", return_value=properties),
    ):
        # Memoized: ask the emulated GPU, not the one an earlier test emulated.
        common.is_gfx95_supported.cache_clear()
        try:
            yield
        finally:
            common.is_gfx95_supported.cache_clear()


class TestGlm5Gfx950KvCacheDtype(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.models = tempfile.TemporaryDirectory()
        for name, identity in MODELS.items():
            os.makedirs(os.path.join(cls.models.name, name))
            with open(os.path.join(cls.models.name, name, "config.json"), "w") as f:
                json.dump({**identity, **DSA_CONFIG}, f)

    @classmethod
    def tearDownClass(cls):
        cls.models.cleanup()

    def kv_cache_dtype(self, *argv, model="glm5", gpu="gfx950"):
        """The KV cache dtype of `sglang serve --model-path MODEL --tp-size 8 ARGV`,
        resolved as launch_server resolves it."""
        with rocm_node(gpu):
            server_args = prepare_server_args(
                [
                    f"--model-path={os.path.join(self.models.name, model)}",
                    "--tp-size=8",
                    "--trust-remote-code",
                    "--device=cuda",
                    *argv,
                ]
            )
            server_args.resolve_once()
            return server_args.resolved_dict()["kv_cache_dtype"]

    def test_auto_is_fp8_e4m3_for_glm5_on_gfx950(self):
        self.assertEqual(self.kv_cache_dtype(), "fp8_e4m3")

    def test_the_default_is_logged_for_gfx950_not_an_sm_capability(self):
        with self.assertLogs("sglang", level=logging.WARNING) as logs:
            self.kv_cache_dtype()
        lines = [m for m in logs.output if "Setting KV cache dtype" in m]
        self.assertEqual(len(lines), 1, logs.output)
        self.assertIn("for GLM-5 DSA on gfx950", lines[0])
        self.assertNotIn("SM9", lines[0])

    def test_explicit_bfloat16_is_kept_on_gfx950(self):
        self.assertEqual(self.kv_cache_dtype("--kv-cache-dtype=bfloat16"), "bfloat16")

    def test_auto_stays_bfloat16_on_gfx942(self):
        self.assertEqual(self.kv_cache_dtype(gpu="gfx942"), "bfloat16")

    def test_auto_stays_bfloat16_for_deepseek_v32_on_gfx950(self):
        # Only GLM-5 has fp8 KV results on gfx950 (the GLM-5.x MI35x CI and
        # cookbook recipes pass --kv-cache-dtype fp8_e4m3); the DeepSeek-V3.2 MI35x
        # accuracy CI runs the bfloat16 default, so it keeps that.
        self.assertEqual(self.kv_cache_dtype(model="deepseek_v32"), "bfloat16")


if __name__ == "__main__":
    unittest.main()
