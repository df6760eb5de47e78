"""`--enable-aiter-allreduce-fusion` warns, naming the reason, when it cannot engage.

The fused all-reduce + RMSNorm runs only on a ROCm build with SGLANG_USE_AITER set,
without DP attention, with tp_size other than 6 and with the custom all-reduce on.
Otherwise the unfused all-reduce runs and, without a warning, the flag is silently
inert.

    python3 test/registered/unit/server_args/test_aiter_allreduce_fusion_inert_warning.py -v
"""

import json
import logging
import os
import tempfile
import unittest
from types import SimpleNamespace
from unittest.mock import patch

import torch

from sglang.srt.runtime_context import override_platform
from sglang.srt.server_args import ServerArgs
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=5, suite="base-a-test-cpu")

FUSION_FLAG = "--enable-aiter-allreduce-fusion"


class TestAiterAllreduceFusionInertWarning(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.model_dir = tempfile.TemporaryDirectory()
        config = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "num_hidden_layers": 2,
            "vocab_size": 256,
            "max_position_embeddings": 512,
            "torch_dtype": "bfloat16",
        }
        with open(os.path.join(cls.model_dir.name, "config.json"), "w") as f:
            json.dump(config, f)

    @classmethod
    def tearDownClass(cls):
        cls.model_dir.cleanup()

    def resolve(self, env, **kwargs):
        server_args = ServerArgs(
            model_path=self.model_dir.name,
            device="cuda",
            tp_size=8,
            enable_aiter_allreduce_fusion=True,
            **kwargs,
        )
        properties = SimpleNamespace(
            gcnArchName="gfx950:sramecc+:xnack-",
            name="AMD Instinct MI355X",
            major=9,
            minor=5,
            total_memory=288 * 1024**3,
            multi_processor_count=256,
        )
        with (
            override_platform(is_hip=True, is_cuda=False, is_npu=False, is_xpu=False),
            patch.dict(os.environ, env),
            patch.object(torch.version, "hip", "7.0.0"),
            patch.object(torch.cuda, "is_available", return_value=True),
            patch.object(torch.cuda, "device_count", return_value=8),
            patch.object(torch.cuda, "get_device_capability", return_value=(9, 5)),
            patch.object(torch.cuda, "get_device_properties", return_value=properties),
            self.assertLogs("sglang", level=logging.WARNING) as logs,
        ):
            logging.getLogger("sglang").warning("resolving")
            server_args.resolve_once()
        return [m for m in logs.output if FUSION_FLAG in m]

    def test_warns_when_sglang_use_aiter_is_unset(self):
        env = {"SGLANG_USE_AITER": "0"}
        warnings = self.resolve(env)
        self.assertTrue(warnings, "no warning names " + FUSION_FLAG)
        self.assertIn("SGLANG_USE_AITER", warnings[0])

    def test_warns_when_custom_all_reduce_is_disabled(self):
        env = {"SGLANG_USE_AITER": "1"}
        warnings = self.resolve(env, disable_custom_all_reduce=True)
        self.assertTrue(warnings, "no warning names " + FUSION_FLAG)
        self.assertIn("custom-all-reduce", warnings[0])

    def test_no_warning_when_every_gate_is_open(self):
        env = {"SGLANG_USE_AITER": "1"}
        self.assertEqual(self.resolve(env), [])


if __name__ == "__main__":
    unittest.main()
