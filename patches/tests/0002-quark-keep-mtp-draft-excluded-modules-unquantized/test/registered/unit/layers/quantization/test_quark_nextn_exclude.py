"""A Quark exclude list that names the MTP layer as the checkpoint does keeps the
NextN draft's modules unquantized.

Quark writes the MTP layer's exclusions as ``model.layers.{num_hidden_layers}.*``
(exact names, the unfused ``gate_proj``/``up_proj`` halves, or ``re:`` patterns),
while the draft builds that layer as ``model.decoder.*`` and ``model.eh_proj``.
A missed exclusion gives the bf16 shared expert a packed MXFP4 slot, and loading
the checkpoint fails with a shape mismatch.

    python3 test/registered/unit/layers/quantization/test_quark_nextn_exclude.py -v
"""

import unittest
from types import SimpleNamespace
from unittest.mock import MagicMock, patch

import torch

from sglang.srt.layers.linear import LinearBase
from sglang.srt.layers.quantization.quark.quark import QuarkConfig
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.models import deepseek_nextn
from sglang.srt.models.glm4_moe import GlmMoeDsaForCausalLMNextN
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase

register_cpu_ci(est_time=2, suite="base-a-test-cpu")

MTP_LAYER = 78  # GLM-5's num_hidden_layers: the checkpoint's index of the MTP layer
CKPT = f"model.layers.{MTP_LAYER}"
EXCLUDED_IN_DRAFT = (
    "model.decoder.mlp.shared_experts.gate_up_proj",
    "model.decoder.mlp.shared_experts.down_proj",
    "model.eh_proj",
)
QUANTIZED_IN_DRAFT = "model.decoder.self_attn.o_proj"

EXCLUDE_SPELLINGS = {
    "exact_names": [
        "lm_head",
        f"{CKPT}.mlp.shared_experts.gate_up_proj",
        f"{CKPT}.mlp.shared_experts.down_proj",
        f"{CKPT}.eh_proj",
    ],
    "unfused_names": [
        "lm_head",
        f"{CKPT}.mlp.shared_experts.gate_proj",
        f"{CKPT}.mlp.shared_experts.up_proj",
        f"{CKPT}.mlp.shared_experts.down_proj",
        f"{CKPT}.eh_proj",
    ],
    "regex": [
        "lm_head",
        rf"re:model\.layers\.{MTP_LAYER}\.mlp\.shared_experts\..*",
        rf"re:model\.layers\.{MTP_LAYER}\.eh_proj$",
    ],
}


def mxfp4(dynamic):
    return {
        "dtype": "fp4",
        "qscheme": "per_group",
        "group_size": 32,
        "is_dynamic": dynamic,
        "scale_format": "e8m0",
        "scale_calculation_mode": "even",
        "ch_axis": -1,
        "round_method": "half_even",
        "symmetric": None,
        "observer_cls": "PerBlockMXObserver",
    }


def quark_mxfp4_config(exclude):
    return QuarkConfig.from_config(
        {
            "quant_method": "quark",
            "export": {"kv_cache_group": [], "pack_method": "reorder"},
            "global_quant_config": {
                "weight": mxfp4(False),
                "input_tensors": mxfp4(True),
                "output_tensors": None,
                "bias": None,
            },
            "exclude": exclude,
            "layer_quant_config": {},
            "layer_type_quant_config": {},
            # What the model loader adds from the model class.
            "packed_modules_mapping": dict(
                GlmMoeDsaForCausalLMNextN.packed_modules_mapping
            ),
        }
    )


def linear_layer():
    layer = LinearBase.__new__(LinearBase)
    torch.nn.Module.__init__(layer)
    return layer


def build_draft_quant_config(quant_config):
    """The quantization config the NextN draft builds its decoder layer with."""
    hf_config = SimpleNamespace(
        num_hidden_layers=MTP_LAYER, vocab_size=256, hidden_size=64
    )
    model_nextn = MagicMock()
    with (
        patch.object(deepseek_nextn, "DeepseekModelNextN", model_nextn),
        patch.object(deepseek_nextn, "ParallelLMHead", MagicMock()),
        patch.object(deepseek_nextn, "LogitsProcessor", MagicMock()),
        patch.object(deepseek_nextn, "get_parallel", MagicMock()),
        # Counting fused shared experts reads the published server args (no
        # server here); releases before v0.5.23 count them in a method.
        patch.object(
            deepseek_nextn,
            "get_num_fused_shared_experts",
            return_value=0,
            create=True,
        ),
        patch.object(
            GlmMoeDsaForCausalLMNextN,
            "determine_num_fused_shared_experts",
            create=True,
        ),
    ):
        GlmMoeDsaForCausalLMNextN(hf_config, quant_config)
    return model_nextn.call_args.args[1]


def quant_method(quant_config, prefix):
    if quant_config is None:
        return None
    return quant_config.get_quant_method(linear_layer(), prefix=prefix)


class TestQuarkNextnExclude(CustomTestCase):
    def setUp(self):
        # The MXFP4 scheme checks the device: answer as an MI355X (gfx950) does.
        for name, value in (("is_available", True), ("get_device_capability", (9, 5))):
            patcher = patch.object(torch.cuda, name, return_value=value)
            patcher.start()
            self.addCleanup(patcher.stop)

    def test_mtp_exclusions_keep_draft_modules_unquantized(self):
        for spelling, exclude in EXCLUDE_SPELLINGS.items():
            draft_config = build_draft_quant_config(quark_mxfp4_config(exclude))
            for prefix in EXCLUDED_IN_DRAFT:
                with self.subTest(spelling=spelling, prefix=prefix):
                    method = quant_method(draft_config, prefix)
                    self.assertTrue(
                        method is None or isinstance(method, UnquantizedLinearMethod),
                        f"{prefix} built with {type(method).__name__}",
                    )

    def test_modules_not_excluded_stay_quantized(self):
        for spelling, exclude in EXCLUDE_SPELLINGS.items():
            with self.subTest(spelling=spelling):
                draft_config = build_draft_quant_config(quark_mxfp4_config(exclude))
                method = quant_method(draft_config, QUANTIZED_IN_DRAFT)
                self.assertIsNotNone(method)
                self.assertNotIsInstance(method, UnquantizedLinearMethod)

    def test_target_config_is_left_as_it_was(self):
        quant_config = quark_mxfp4_config(EXCLUDE_SPELLINGS["regex"])
        build_draft_quant_config(quant_config)
        method = quant_method(quant_config, EXCLUDED_IN_DRAFT[1])
        self.assertNotIsInstance(method, UnquantizedLinearMethod)


if __name__ == "__main__":
    unittest.main()
