"""The aiter all-reduce fusion is turned on only where it can run, and the flag says when it cannot.

The fused all-reduce + RMSNorm runs on ROCm with SGLANG_USE_AITER, on the TP group's
aiter custom all-reduce (so not with --disable-custom-all-reduce, SGLANG_USE_AITER_AR=0
or SGLANG_USE_1STAGE_ALLREDUCE=1), without DP attention and with tp_size other than 6;
elsewhere the all-reduce and the RMSNorm run unfused. GlmMoeDsaForCausalLM's ROCm default
turned it on regardless, so the EAGLE launch AMD needs (--disable-custom-all-reduce)
resolved to a fusion that never runs, and an explicit --enable-aiter-allreduce-fusion was
as silently inert. The default also ran before the hooks that undo it: deterministic
inference turned it off again, warning about a flag nobody passed, and context parallelism
refused the launch. Server arguments are resolved as launch_server resolves them, on an
emulated 8x MI355X node.

    python3 test/registered/unit/server_args/test_aiter_allreduce_fusion_inert_warning.py -v
"""

import json
import logging
import os
import re
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

register_cpu_ci(est_time=10, suite="base-a-test-cpu")

FLAG = "--enable-aiter-allreduce-fusion"
# Where deterministic inference turns the fusion off, with a warning.
ATTENTION_HOOK_LOGGER = "sglang.srt.arg_groups.attention_hook"
# Deterministic inference refuses the DSA attention backend; triton serves GLM-5.
DETERMINISTIC = ("--enable-deterministic-inference", "--attention-backend=triton")
EAGLE = (
    "--speculative-algorithm=EAGLE",
    "--speculative-num-steps=5",
    "--speculative-eagle-topk=1",
    "--speculative-num-draft-tokens=6",
)
# GLM-5 (GlmMoeDsaForCausalLM) shapes; no weights are read.
GLM5_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
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
    "num_nextn_predict_layers": 1,
    "vocab_size": 154880,
    "max_position_embeddings": 202752,
    "torch_dtype": "bfloat16",
}
MI355X = SimpleNamespace(
    gcnArchName="gfx950:sramecc+:xnack-",
    name="AMD Instinct MI355X",
    major=9,
    minor=5,
    total_memory=288 * 1024**3,
    multi_processor_count=256,
)


def forget_device_probes():
    # Memoized: ask the emulated GPU, not the one an earlier test emulated.
    common.is_gfx95_supported.cache_clear()


@contextmanager
def mi355x_node(env):
    """Eight MI355X GPUs (HIP, gfx950), and the launch's environment (None unsets)."""
    with (
        override_platform(is_hip=True, is_cuda=False, is_npu=False, is_xpu=False),
        patch.dict(os.environ),
        patch.object(torch.version, "hip", "7.0.0"),
        patch.object(torch.cuda, "is_available", return_value=True),
        patch.object(torch.cuda, "device_count", return_value=8),
        patch.object(torch.cuda, "get_device_capability", return_value=(9, 5)),
        patch.object(torch.cuda, "get_device_properties", return_value=MI355X),
    ):
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        forget_device_probes()
        try:
            yield
        finally:
            forget_device_probes()


class TestAiterAllreduceFusionInertWarning(CustomTestCase):
    @classmethod
    def setUpClass(cls):
        cls.models = tempfile.TemporaryDirectory()
        cls.model_paths = {}
        for name, config in (("glm5", GLM5_CONFIG),):
            path = os.path.join(cls.models.name, name)
            os.makedirs(path)
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(config, f)
            cls.model_paths[name] = path

    @classmethod
    def tearDownClass(cls):
        cls.models.cleanup()

    def launch(self, *argv, model="glm5", **env):
        """Resolve `sglang serve --model-path MODEL --tp-size 8 ARGV` as launch_server does."""
        environ = {"SGLANG_USE_AITER": "1", **env}
        with mi355x_node(environ):
            server_args = prepare_server_args(
                [
                    f"--model-path={self.model_paths[model]}",
                    "--tp-size=8",
                    "--trust-remote-code",
                    "--device=cuda",
                    *argv,
                ]
            )
            server_args.resolve_once()
            return server_args.resolved_dict()

    @contextmanager
    def fusion_warnings(self):
        """Collects the warning-level records that name the fusion flag. Unlike
        assertLogs, it asks for no record at all: the loggers that decide the
        fusion also warn about DSA settings, so assertNoLogs cannot be used on
        them either."""
        warnings = []
        handler = logging.Handler(level=logging.WARNING)
        handler.emit = lambda record: (
            warnings.append(record.getMessage())
            if FLAG in record.getMessage()
            else None
        )
        sglang_logger = logging.getLogger("sglang")
        sglang_logger.addHandler(handler)
        try:
            yield warnings
        finally:
            sglang_logger.removeHandler(handler)

    def assert_one_warning_naming(self, pattern, *argv, **env):
        with self.fusion_warnings() as warnings:
            self.launch(FLAG, *argv, **env)
        self.assertEqual(
            len(warnings), 1, f"want one warning naming {FLAG}: {warnings}"
        )
        self.assertRegex(warnings[0], pattern)

    # GLM-5's default: on for decode where the fused kernel runs, off elsewhere.

    def test_glm5_default_turns_the_fusion_on_for_decode_where_it_runs(self):
        resolved = self.launch(*EAGLE)
        self.assertTrue(resolved["enable_aiter_allreduce_fusion"])
        self.assertTrue(resolved["disable_aiter_allreduce_fusion_in_prefill"])

    def test_glm5_default_leaves_the_fusion_off_without_custom_all_reduce(self):
        resolved = self.launch("--disable-custom-all-reduce", *EAGLE)
        self.assertFalse(resolved["enable_aiter_allreduce_fusion"])

    def test_glm5_default_says_at_info_why_it_leaves_the_fusion_off(self):
        with self.assertLogs("sglang", level=logging.INFO) as logs:
            self.launch("--disable-custom-all-reduce", *EAGLE)
        info = [
            r.getMessage() for r in logs.records if "AllReduce Fusion" in r.getMessage()
        ]
        self.assertEqual(len(info), 1, info)
        self.assertRegex(
            info[0], r"not enabled by default.*--disable-custom-all-reduce"
        )

    def test_glm5_default_launch_warns_about_no_flag_it_was_not_given(self):
        with self.fusion_warnings() as warnings:
            self.launch("--disable-custom-all-reduce", *EAGLE)
        self.assertEqual(warnings, [])

    def test_glm5_default_leaves_the_fusion_off_without_sglang_use_aiter(self):
        resolved = self.launch(*EAGLE, SGLANG_USE_AITER=None)
        self.assertFalse(resolved["enable_aiter_allreduce_fusion"])

    def test_glm5_default_leaves_the_fusion_off_with_sglang_use_aiter_ar_off(self):
        resolved = self.launch(*EAGLE, SGLANG_USE_AITER_AR="0")
        self.assertFalse(resolved["enable_aiter_allreduce_fusion"])

    def test_glm5_default_leaves_the_fusion_off_with_the_1stage_all_reduce(self):
        resolved = self.launch(*EAGLE, SGLANG_USE_1STAGE_ALLREDUCE="1")
        self.assertFalse(resolved["enable_aiter_allreduce_fusion"])

    def test_glm5_default_leaves_the_fusion_off_with_tp_size_6(self):
        resolved = self.launch(*EAGLE, "--tp-size=6")
        self.assertFalse(resolved["enable_aiter_allreduce_fusion"])

    def test_glm5_default_leaves_the_fusion_off_with_dp_attention(self):
        resolved = self.launch(*EAGLE, "--enable-dp-attention", "--dp-size=8")
        self.assertFalse(resolved["enable_aiter_allreduce_fusion"])

    def test_glm5_default_with_deterministic_inference_warns_about_no_flag(self):
        # handle_deterministic_inference runs after the default: it would turn
        # the fusion off again, warning about a flag nobody passed.
        with self.assertNoLogs(ATTENTION_HOOK_LOGGER, level=logging.WARNING):
            resolved = self.launch(*EAGLE, *DETERMINISTIC)
        self.assertFalse(resolved["enable_aiter_allreduce_fusion"])

    def test_glm5_default_leaves_the_fusion_off_with_context_parallelism(self):
        # handle_context_parallelism asserts the fusion is off.
        resolved = self.launch(*EAGLE, "--attn-cp-size=2")
        self.assertFalse(resolved["enable_aiter_allreduce_fusion"])

    # The flag, where the fused kernel cannot run: one warning, naming why.

    def test_flag_warns_without_sglang_use_aiter(self):
        self.assert_one_warning_naming(r"SGLANG_USE_AITER\b", SGLANG_USE_AITER=None)

    def test_flag_warns_with_custom_all_reduce_disabled(self):
        self.assert_one_warning_naming(
            r"--disable-custom-all-reduce", "--disable-custom-all-reduce"
        )

    def test_flag_warns_with_sglang_use_aiter_ar_off(self):
        self.assert_one_warning_naming(r"SGLANG_USE_AITER_AR", SGLANG_USE_AITER_AR="0")

    def test_flag_warns_with_the_1stage_all_reduce(self):
        self.assert_one_warning_naming(
            r"SGLANG_USE_1STAGE_ALLREDUCE", SGLANG_USE_1STAGE_ALLREDUCE="1"
        )

    def test_flag_warns_with_dp_attention(self):
        self.assert_one_warning_naming(
            re.compile(r"dp.attention", re.IGNORECASE),
            "--enable-dp-attention",
            "--dp-size=8",
        )

    def test_flag_warns_with_tp_size_6(self):
        self.assert_one_warning_naming(
            re.compile(r"tp.size\D*6", re.IGNORECASE), "--tp-size=6"
        )

    def test_flag_warns_once_with_deterministic_inference(self):
        # handle_deterministic_inference's own warning; nothing more.
        self.assert_one_warning_naming(
            re.compile(r"deterministic", re.IGNORECASE), *DETERMINISTIC
        )

    def test_flag_with_context_parallelism_is_refused_without_a_warning(self):
        # handle_context_parallelism refuses the launch; nothing warns first.
        with self.fusion_warnings() as warnings:
            with self.assertRaisesRegex(AssertionError, "context parallelism"):
                self.launch(FLAG, "--attn-cp-size=2")
        self.assertEqual(warnings, [])

    def test_flag_does_not_warn_where_the_fusion_runs(self):
        with self.fusion_warnings() as warnings:
            resolved = self.launch(FLAG, *EAGLE)
        self.assertEqual(warnings, [])
        self.assertTrue(resolved["enable_aiter_allreduce_fusion"])


if __name__ == "__main__":
    unittest.main()
