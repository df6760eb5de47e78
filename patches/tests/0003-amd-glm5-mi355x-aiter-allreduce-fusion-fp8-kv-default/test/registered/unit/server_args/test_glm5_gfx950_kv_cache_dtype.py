"""GLM-5 (GlmMoeDsaForCausalLM) on gfx950 (MI355X) defaults its DSA KV cache to fp8_e4m3.

gfx950 reports compute capability 9.5, so a default keyed on the capability major
alone resolves ``--kv-cache-dtype auto`` to bfloat16 there.

    python3 test/registered/unit/server_args/test_glm5_gfx950_kv_cache_dtype.py -v
"""

import unittest
from types import SimpleNamespace
from unittest.mock import patch

import torch

from sglang.srt.arg_groups import overrides
from sglang.srt.runtime_context import override_platform
from sglang.srt.utils import common
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=2, suite="base-a-test-cpu")

GFX950 = ("gfx950:sramecc+:xnack-", (9, 5))
GFX942 = ("gfx942:sramecc+:xnack-", (9, 4))


def forget_device_probes():
    # The device probes in utils.common are memoized; each case emulates its own GPU.
    for probe in vars(common).values():
        if callable(getattr(probe, "cache_clear", None)):
            probe.cache_clear()


def resolve_kv_cache_dtype(
    *, gpu, kv_cache_dtype="auto", architecture="GlmMoeDsaForCausalLM"
):
    gcn_arch, capability = gpu
    view = SimpleNamespace(
        kv_cache_dtype=kv_cache_dtype,
        dsa_prefill_backend=None,
        dsa_decode_backend=None,
    )
    hf_config = SimpleNamespace(
        architectures=[architecture], index_topk=2048, learnable_sink=False
    )
    properties = SimpleNamespace(gcnArchName=gcn_arch, major=capability[0])
    with (
        override_platform(is_hip=True, is_cuda=False, is_npu=False, is_xpu=False),
        patch.object(torch.version, "hip", "7.0.0"),
        patch.object(torch.cuda, "get_device_capability", return_value=capability),
        patch.object(torch.cuda, "get_device_properties", return_value=properties),
        patch.object(
            overrides,
            "model_config_of",
            return_value=SimpleNamespace(hf_config=hf_config),
        ),
    ):
        forget_device_probes()
        try:
            declared = overrides._dsa_kv_cache_dtype_default(view)
        finally:
            forget_device_probes()
    return declared.get("kv_cache_dtype", kv_cache_dtype)


class TestGlm5Gfx950KvCacheDtype(CustomTestCase):
    def test_auto_is_fp8_for_glm5_on_gfx950(self):
        self.assertEqual(resolve_kv_cache_dtype(gpu=GFX950), "fp8_e4m3")

    def test_explicit_bfloat16_is_kept_on_gfx950(self):
        self.assertEqual(
            resolve_kv_cache_dtype(gpu=GFX950, kv_cache_dtype="bfloat16"), "bfloat16"
        )

    def test_auto_stays_bfloat16_on_gfx942(self):
        self.assertEqual(resolve_kv_cache_dtype(gpu=GFX942), "bfloat16")

    def test_auto_stays_bfloat16_for_other_dsa_models_on_gfx950(self):
        self.assertEqual(
            resolve_kv_cache_dtype(gpu=GFX950, architecture="DeepseekV32ForCausalLM"),
            "bfloat16",
        )


if __name__ == "__main__":
    unittest.main()
