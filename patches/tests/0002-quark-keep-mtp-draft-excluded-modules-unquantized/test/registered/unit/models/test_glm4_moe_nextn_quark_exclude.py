"""GLM-5's MTP draft and the modules a Quark checkpoint keeps in bf16.

Quark lists the modules it leaves unquantized in ``quantization_config["exclude"]``
under the checkpoint's names, ``model.layers.{num_hidden_layers}.*`` for the MTP
layer, while the NextN draft builds that layer as ``model.decoder.*`` and
``model.eh_proj``. Each test builds the draft of a tiny GLM-5 checkpoint as the
model loader does: the loader's quantization config (with the packed-modules
mapping it adds for Quark) and ``_initialize_model``, which resolves the
shared-experts fusion and runs the draft class's ``__init__``.

The device is an MI355X (gfx950, HIP) as far as the quantization schemes and
the fusion gate ask; the rotary embedding is kept on its CPU path, so that no
GPU kernel package is imported to build it.

    python3 test/registered/unit/models/test_glm4_moe_nextn_quark_exclude.py -v
"""

import json
import shutil
import socket
import tempfile
import unittest
from unittest.mock import patch

import torch

from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed import (
    destroy_distributed_environment,
    init_distributed_environment,
    initialize_model_parallel,
    parallel_state,
)
from sglang.srt.layers.quantization.unquant import (
    UnquantizedFusedMoEMethod,
    UnquantizedLinearMethod,
)
from sglang.srt.layers.rotary_embedding import base as rotary_embedding_base
from sglang.srt.model_loader.loader import _get_quantization_config, _initialize_model
from sglang.srt.model_loader.utils import set_default_torch_dtype
from sglang.srt.models import deepseek_v2
from sglang.srt.models.deepseek_common.amd import deepseek_v2_hip_moe
from sglang.srt.runtime_context import get_exec, get_server_args, reset_context
from sglang.test.ci.ci_register import register_cpu_ci
from sglang.test.test_utils import CustomTestCase, publish_build_topology

register_cpu_ci(est_time=40, suite="base-a-test-cpu")

MTP_LAYER = 2  # num_hidden_layers: the checkpoint names its MTP layer model.layers.2
CKPT = f"model.layers.{MTP_LAYER}"

# The MTP shared expert and eh_proj kept in bf16, named as Quark exports them.
EXACT_NAMES = [
    "lm_head",
    f"{CKPT}.mlp.shared_experts.gate_proj",
    f"{CKPT}.mlp.shared_experts.up_proj",
    f"{CKPT}.mlp.shared_experts.down_proj",
    f"{CKPT}.eh_proj",
]
# The MTP layer's routed experts kept in bf16 too, expert by expert: the
# release builds them unquantized, so fusing the bf16 shared expert is fine.
EXACT_NAMES_WITH_ROUTED_EXPERTS = EXACT_NAMES + [
    f"{CKPT}.mlp.experts.{expert}.{proj}"
    for expert in range(256)
    for proj in ("gate_proj", "up_proj", "down_proj")
]
# The same modules as "re:" patterns, the other spelling Quark's exclude takes.
REGEX = [
    "lm_head",
    rf"re:model\.layers\.{MTP_LAYER}\.mlp\.shared_experts\..*",
    rf"re:model\.layers\.{MTP_LAYER}\.eh_proj$",
]


def mxfp4(dynamic):
    return {
        "dtype": "fp4",
        "qscheme": "per_group",
        "group_size": 32,
        "is_dynamic": dynamic,
        "ch_axis": -1,
        "scale_format": "e8m0",
        "scale_calculation_mode": "even",
        "round_method": "half_even",
        "symmetric": None,
        "observer_cls": "PerBlockMXObserver",
    }


def glm5_config(exclude):
    """A GLM-5 config.json, widths divided down, quantized to MXFP4 by Quark."""
    return {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "num_hidden_layers": MTP_LAYER,
        "num_nextn_predict_layers": 1,
        "hidden_size": 64,
        "intermediate_size": 128,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "n_routed_experts": 256,
        "num_experts_per_tok": 2,
        "n_group": 1,
        "topk_group": 1,
        "first_k_dense_replace": 0,
        "moe_layer_freq": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 8,
        "index_topk": 16,
        "index_head_dim": 16,
        "index_n_heads": 2,
        "vocab_size": 128,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": {
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
        },
    }


class TestGlmNextnQuarkExclude(CustomTestCase):
    longMessage = False  # the messages below say what was built

    @classmethod
    def setUpClass(cls):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        # One rank on gloo, its process groups on the CPU.
        with patch.object(parallel_state, "is_cuda_alike", return_value=False):
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{port}",
                backend="gloo",
            )
            publish_build_topology(tp_size=1)
            initialize_model_parallel(backend="gloo")

    @classmethod
    def tearDownClass(cls):
        # The model-parallel groups end with the process (one per test file);
        # destroy_model_parallel would import the server's bootstrap for it.
        reset_context()
        destroy_distributed_environment()

    def setUp(self):
        super().setUp()
        # An MI355X (gfx950): the MXFP4 scheme and the fusion gate ask the device.
        for name, value in (("is_available", True), ("get_device_capability", (9, 5))):
            patcher = patch.object(torch.cuda, name, return_value=value)
            patcher.start()
            self.addCleanup(patcher.stop)
        for module, name, value in (
            (deepseek_v2, "_is_hip", True),
            # The HIP glue deepseek_v2 imports when it is loaded on ROCm.
            (deepseek_v2, "_hip_moe", deepseek_v2_hip_moe),
            # The rotary embedding's native path: its GPU kernel is not tested.
            (rotary_embedding_base, "_is_cpu", True),
        ):
            patcher = patch.object(module, name, value)
            patcher.start()
            self.addCleanup(patcher.stop)

    def build_draft(self, exclude, *, disable_shared_experts_fusion=False):
        """The draft model, built as the loader builds it for this checkpoint."""
        folder = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, folder, True)
        with open(f"{folder}/config.json", "w") as f:
            json.dump(glm5_config(exclude), f)
        model_config = ModelConfig.from_server_args(
            get_server_args(), model_path=folder, is_draft_model=True
        )
        load_config = LoadConfig()
        quant_config = _get_quantization_config(model_config, load_config)
        with (
            get_exec().moe.override(
                disable_shared_experts_fusion=disable_shared_experts_fusion
            ),
            set_default_torch_dtype(model_config.dtype),
            torch.device("cpu"),
        ):
            return _initialize_model(model_config, load_config, quant_config)

    def assertUnquantized(self, layer, name):
        method = type(layer.quant_method).__name__
        self.assertIsInstance(
            layer.quant_method, UnquantizedLinearMethod, f"{name} built with {method}"
        )

    def test_exact_names_turn_draft_shared_experts_fusion_off(self):
        draft = self.build_draft(EXACT_NAMES)
        self.assertEqual(
            draft.model.decoder.mlp.num_fused_shared_experts,
            0,
            "the draft fused its excluded shared expert into the routed experts",
        )

    def test_exact_names_keep_shared_experts_unquantized(self):
        draft = self.build_draft(EXACT_NAMES, disable_shared_experts_fusion=True)
        shared_experts = draft.model.decoder.mlp.shared_experts
        self.assertUnquantized(shared_experts.gate_up_proj, "gate_up_proj")
        self.assertUnquantized(shared_experts.down_proj, "down_proj")

    def test_excluded_routed_experts_build_unquantized(self):
        draft = self.build_draft(EXACT_NAMES_WITH_ROUTED_EXPERTS)
        experts = draft.model.decoder.mlp.experts
        method = type(experts.quant_method).__name__
        self.assertIsInstance(
            experts.quant_method,
            UnquantizedFusedMoEMethod,
            f"routed experts built with {method}",
        )

    def test_excluded_routed_experts_keep_shared_experts_fusion(self):
        # Routed and shared experts are both bf16: the fusion stays as it is.
        draft = self.build_draft(EXACT_NAMES_WITH_ROUTED_EXPERTS)
        self.assertEqual(
            draft.model.decoder.mlp.num_fused_shared_experts,
            1,
            "the draft turned off the fusion of its bf16 experts",
        )

    def test_regex_keeps_shared_experts_unquantized(self):
        draft = self.build_draft(REGEX, disable_shared_experts_fusion=True)
        shared_experts = draft.model.decoder.mlp.shared_experts
        self.assertUnquantized(shared_experts.gate_up_proj, "gate_up_proj")
        self.assertUnquantized(shared_experts.down_proj, "down_proj")

    def test_regex_keeps_eh_proj_unquantized(self):
        draft = self.build_draft(REGEX)
        self.assertUnquantized(draft.model.eh_proj, "eh_proj")

    def test_modules_not_excluded_stay_quantized(self):
        draft = self.build_draft(REGEX)
        o_proj = draft.model.decoder.self_attn.o_proj
        self.assertNotIsInstance(
            o_proj.quant_method, UnquantizedLinearMethod, "o_proj built unquantized"
        )


if __name__ == "__main__":
    unittest.main()
