"""Probe for the ``mtp-quark-exclude`` witness: which quantization the MTP draft layer gets.

Runs inside a pin's CPU Python (``sglpatch.pyenv``) with the pin's tree first on the path, and
asks sglang's own code, for a GlmMoeDsa-shaped model with a Quark MXFP4 ``quantization_config``:

1. the loader's steps: the draft class's ``packed_modules_mapping``, ``QuarkConfig.from_config``,
   ``apply_weight_name_mapper`` with the draft class's mapper;
2. the draft class's real ``__init__`` (the class ``ModelConfig`` renames a GlmMoeDsa draft to),
   with the MTP layer, the LM head and the parallel/server-args getters recorded, for the quant
   config the MTP layer is built with;
3. the real layers with that config and the draft's prefixes: ``DeepseekV2MLP`` (the shared
   expert), ``ReplicatedLinear`` ``model.eh_proj`` where the release builds it so, and
   ``RowParallelLinear`` ``model.decoder.self_attn.o_proj`` (not excluded: a control that must
   stay quantized), each with the quant method it got;
4. the checkpoint's tensors, read from safetensors files with sglang's own iterator and fed
   through each parameter's own ``weight_loader``, as the model loader does: an excluded module
   holds full-width bf16 tensors, which a 4-bit MXFP4 slot refuses (shape mismatch) or takes
   silently wrong (narrowed and cast);
5. whether the draft fuses its shared expert into the routed MoE on the emulated GPU (an excluded,
   bf16 shared expert cannot join MXFP4 routed experts).

Without ``--checkpoint`` it writes its own tiny checkpoints, one per exclude-list spelling of "the
MTP shared expert and eh_proj are kept bf16": ``fused`` (gate_up_proj), ``unfused``
(gate_proj/up_proj, as Quark writes them), ``regex`` (``re:`` patterns), and ``none`` (a control:
nothing excluded). With ``--checkpoint DIR`` (config.json with ``quantization_config`` beside
``*.safetensors``) it reports that checkpoint alone. The JSON answer goes to ``--out``.

The GPU is a test double (``hip_emulation``, gfx950 by default); GPU-only packages are stand-ins
(``standins``), named in the answer.
"""

from __future__ import annotations

import argparse
import copy
import glob
import importlib
import inspect
import json
import logging
import os
import sys
import tempfile
import time
import traceback
import warnings

from quark_checkpoint import quark_config_dict, save_bf16_tensors

N = 2  # num_hidden_layers of the synthetic model: its MTP layer is model.layers.2.*
H = 64  # hidden_size
I = 32  # moe_intermediate_size (one shared expert)
SPELLINGS = ("fused", "unfused", "regex", "none")

# module key -> (sglang prefix, checkpoint names of its weight, relative to the MTP layer)
MODULES = {
    "shared_experts.gate_up_proj": (
        "model.decoder.mlp.shared_experts.gate_up_proj",
        ["mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"],
    ),
    "shared_experts.down_proj": ("model.decoder.mlp.shared_experts.down_proj", ["mlp.shared_experts.down_proj.weight"]),
    "eh_proj": ("model.eh_proj", ["eh_proj.weight"]),
    "self_attn.o_proj": ("model.decoder.self_attn.o_proj", ["self_attn.o_proj.weight"]),
}
CONTROL = "self_attn.o_proj"
O_PROJ_IN = 16  # num_attention_heads * v_head_dim


def hf_config_dict(num_layers: int = N) -> dict:
    """A GLM-5-shaped (GlmMoeDsa) config, tiny: 256 routed experts and one shared, as GLM-5."""
    return dict(
        architectures=["GlmMoeDsaForCausalLM"],
        model_type="glm_moe_dsa",
        num_hidden_layers=num_layers,
        num_nextn_predict_layers=1,
        hidden_size=H,
        intermediate_size=2 * H,
        moe_intermediate_size=I,
        n_shared_experts=1,
        n_routed_experts=256,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=0,
        moe_layer_freq=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=32,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=8,
        vocab_size=128,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        max_position_embeddings=256,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )


def exclude_list(spelling: str, layer: int = N) -> list[str]:
    """Quark's exclude list keeping the MTP shared expert and eh_proj bf16, spelled one way."""
    L = f"model.layers.{layer}"
    if spelling == "fused":
        return ["lm_head", f"{L}.mlp.shared_experts.gate_up_proj", f"{L}.mlp.shared_experts.down_proj", f"{L}.eh_proj"]
    if spelling == "unfused":
        return ["lm_head", f"{L}.mlp.shared_experts.gate_proj", f"{L}.mlp.shared_experts.up_proj",
                f"{L}.mlp.shared_experts.down_proj", f"{L}.eh_proj"]
    if spelling == "regex":
        return ["lm_head", rf"re:model\.layers\.{layer}\.mlp\.shared_experts\..*", rf"re:model\.layers\.{layer}\.eh_proj$"]
    if spelling == "none":
        return ["lm_head"]
    raise ValueError(spelling)


def write_checkpoint(folder: str, spelling: str, seed: int = 0) -> str:
    """config.json plus one safetensors file holding the MTP layer's excluded modules in bf16."""
    config = hf_config_dict()
    config["quantization_config"] = quark_config_dict(exclude_list(spelling))
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(config, handle, indent=1)
    if spelling != "none":
        L = f"model.layers.{N}"
        shapes = {
            f"{L}.mlp.shared_experts.gate_proj.weight": (I, H),
            f"{L}.mlp.shared_experts.up_proj.weight": (I, H),
            f"{L}.mlp.shared_experts.down_proj.weight": (H, I),
            f"{L}.eh_proj.weight": (H, 2 * H),
        }
        save_bf16_tensors(folder, shapes, seed)
    return folder


# -- sglang, as its loader drives it --------------------------------------------------------


class Permissive:
    """Server args / parallel context with the values given, None for anything else."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


def _false(*args, **kwargs):
    return False


def filtered_kwargs(fn, **kw):
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kw.items() if k in params}


def setup_parallel() -> None:
    """TP 1 for sglang's linear layers where the release keeps it in a runtime context."""
    try:
        from sglang.srt.runtime_context import get_parallel
    except ImportError:
        return
    parallel = get_parallel()
    if hasattr(type(parallel), "override_permanently"):
        parallel.override_permanently(tp_size=1, tp_rank=0)


def draft_class():
    """The class sglang's ModelConfig gives a GlmMoeDsa draft, and its name."""
    from sglang.srt.configs import model_config

    source = inspect.getsource(model_config.ModelConfig._config_draft_model)
    if '"GlmMoeDsaForCausalLMNextN"' in source:
        name, module = "GlmMoeDsaForCausalLMNextN", "sglang.srt.models.glm4_moe"
    else:
        if "GlmMoeDsaForCausalLM" not in source:
            raise RuntimeError("this release's ModelConfig does not turn GlmMoeDsaForCausalLM into an MTP draft")
        name, module = "DeepseekV3ForCausalLMNextN", "sglang.srt.models.deepseek_nextn"
    return getattr(importlib.import_module(module), name), name


def loader_quant_config(cls, hf_config, quant_dict: dict):
    """model_loader's get_quant_config and the draft mapper's rewrite of the exclude list."""
    from sglang.srt.layers.quantization.quark.quark import QuarkConfig

    d = copy.deepcopy(quant_dict)
    # The draft class's mapping; DeepseekV2ForCausalLM.__init__ adds this entry (q_lora_rank set).
    packed = dict(getattr(cls, "packed_modules_mapping", {}) or {})
    packed.setdefault("fused_qkv_a_proj_with_mqa", ["q_a_proj", "kv_a_proj_with_mqa"])
    d["packed_modules_mapping"] = packed
    weight_utils = inspect.getsource(importlib.import_module("sglang.srt.model_loader.weight_utils"))
    if 'hf_quant_config["hf_config"]' in weight_utils:
        d["hf_config"] = hf_config
    qc = QuarkConfig.from_config(d)
    getter = getattr(cls, "get_hf_to_sglang_mapper", None)
    mapper = getter(hf_config) if getter is not None else getattr(cls, "hf_to_sglang_mapper", None)
    if mapper is not None:
        qc.apply_weight_name_mapper(mapper)
    return qc


def _patch(saved: list, obj, name: str, value) -> None:
    if hasattr(obj, name):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)


def _restore(saved: list) -> None:
    for obj, name, value in reversed(saved):
        setattr(obj, name, value)


def draft_mtp_quant_config(cls, hf_config, qc):
    """Run the draft class's own __init__; the quant config and prefix its MTP layer gets."""
    nextn = importlib.import_module("sglang.srt.models.deepseek_nextn")
    server_args = Permissive(enable_dp_lm_head=False, disable_shared_experts_fusion=False,
                             speculative_draft_model_path=None, model_path="/nonexistent", quantization="quark")
    parallel = Permissive(tp_size=1, tp_rank=0, pp_group=None, attn_cp_rank=0, attn_cp_size=1,
                          enable_dp_lm_head=False, moe_ep_size=1)
    captured = {}

    class Recorded:
        def __init__(self, *args, **kwargs):
            pass

    class DeepseekModelNextN(Recorded):
        def __init__(self, config, quant_config=None, prefix="", **kwargs):
            captured["quant_config"] = quant_config
            captured["prefix"] = prefix

    replacements = {
        "DeepseekModelNextN": DeepseekModelNextN,
        "ParallelLMHead": Recorded,
        "LogitsProcessor": Recorded,
        "get_tensor_model_parallel_world_size": lambda: 1,
        "get_pp_group": lambda: None,
        "get_attention_cp_rank": lambda: 0,
        "get_attention_cp_size": lambda: 1,
        "is_nsa_enable_prefill_cp": _false,
        "is_dsa_enable_prefill_cp": _false,
        "is_mla_prefill_cp_enabled": _false,
        "get_global_server_args": lambda: server_args,
        "get_server_args": lambda: server_args,
        "get_parallel": lambda: parallel,
        "get_num_fused_shared_experts": lambda: 0,
    }
    saved: list = []
    for module in {nextn, sys.modules[cls.__module__]}:
        for name, value in replacements.items():
            _patch(saved, module, name, value)

    class Draft(cls):
        def determine_num_fused_shared_experts(self, *args, **kwargs):
            self.num_fused_shared_experts = 0

    Draft.__name__ = cls.__name__
    try:
        Draft(hf_config, qc, prefix="")
    finally:
        _restore(saved)
    return captured["quant_config"], captured["prefix"]


def build_layers(qc) -> dict:
    """The MTP modules as sglang builds them with the draft's quant config, TP 1."""
    import torch

    from sglang.srt.layers.linear import ReplicatedLinear, RowParallelLinear
    from sglang.srt.models import deepseek_nextn
    from sglang.srt.models.deepseek_v2 import DeepseekV2MLP

    tp = dict(tp_rank=0, tp_size=1)
    torch.set_default_dtype(torch.bfloat16)
    dsv2 = sys.modules[DeepseekV2MLP.__module__]
    saved: list = []
    # The activation reads global server args when built; it plays no part here.
    _patch(saved, dsv2, "SiluAndMul", torch.nn.Identity)
    try:
        mlp = DeepseekV2MLP(**filtered_kwargs(
            DeepseekV2MLP.__init__, hidden_size=H, intermediate_size=I, hidden_act="silu", quant_config=qc,
            reduce_results=False, prefix=MODULES["shared_experts.gate_up_proj"][0].rsplit(".", 1)[0], **tp))
        layers = {"shared_experts.gate_up_proj": mlp.gate_up_proj, "shared_experts.down_proj": mlp.down_proj}
        # eh_proj is a quantizable ReplicatedLinear only where the release builds it so (0.5.11 on).
        if "ReplicatedLinear(" in inspect.getsource(deepseek_nextn.DeepseekModelNextN):
            layers["eh_proj"] = ReplicatedLinear(2 * H, H, bias=False, quant_config=qc, prefix=MODULES["eh_proj"][0],
                                                 **filtered_kwargs(ReplicatedLinear.__init__, **tp))
        layers[CONTROL] = RowParallelLinear(
            O_PROJ_IN, H, bias=False, quant_config=qc, prefix=MODULES[CONTROL][0],
            **filtered_kwargs(RowParallelLinear.__init__, reduce_results=False, **tp))
    finally:
        _restore(saved)
        torch.set_default_dtype(torch.float32)
    return layers


def quant_method_name(layer) -> str:
    method = getattr(layer, "quant_method", None)
    name = type(method).__name__
    scheme = getattr(layer, "scheme", None)
    if scheme is not None and not name.startswith("Unquantized"):
        name += f"({type(scheme).__name__})"
    return name


def read_checkpoint(folder: str) -> dict:
    """Every tensor of the folder's safetensors files, read with sglang's own iterator."""
    from sglang.srt.model_loader import weight_utils

    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        return {}
    return dict(weight_utils.safetensors_weights_iterator(files))


def load_module(key: str, layer, tensors: dict, layer_id: int) -> tuple[str, str]:
    """Feed the module's checkpoint tensors through its parameter's weight_loader."""
    import torch

    names = [f"model.layers.{layer_id}.{name}" for name in MODULES[key][1]]
    present = [name for name in names if name in tensors]
    if not present:
        return "absent", "no tensor for it in the checkpoint"
    if len(present) != len(names):
        return "absent", f"only {', '.join(present)} in the checkpoint"
    param = dict(layer.named_parameters())["weight"]
    loader = getattr(param, "weight_loader", None) or layer.weight_loader
    shards = [(index if len(names) > 1 else None, tensors[name]) for index, name in enumerate(names)]
    full = torch.cat([tensor for _, tensor in shards], dim=0)
    shape = f"param {str(param.dtype).removeprefix('torch.')}{list(param.shape)} <- checkpoint {str(full.dtype).removeprefix('torch.')}{list(full.shape)}"
    try:
        for shard_id, tensor in shards:
            if shard_id is None:
                loader(param, tensor)
            else:
                loader(param, tensor, shard_id)
    except Exception as exc:  # noqa: BLE001 - the loader's refusal is the answer
        message = (str(exc).strip().splitlines() or [""])[0][:120]
        return "shape-mismatch", f"{type(exc).__name__}: {message} [{shape}]"
    if param.dtype != full.dtype or param.shape != full.shape:
        return "silent-wrong", f"no error, but the tensor was narrowed/cast [{shape}]"
    if not torch.equal(param.data, full):
        return "wrong-values", f"loaded values differ from the checkpoint [{shape}]"
    return "ok", f"loaded exactly [{shape}]"


def draft_fusion(cls, hf_config, qc) -> str:
    """'on' / 'off' / 'unknown (...)': the release's own decision to fuse the draft's shared
    expert into its routed MoE on the emulated GPU, default flags."""
    dsv2 = importlib.import_module("sglang.srt.models.deepseek_v2")
    nextn = importlib.import_module("sglang.srt.models.deepseek_nextn")
    server_args = Permissive(disable_shared_experts_fusion=False, enforce_shared_experts_fusion=False)
    a2a = Permissive(is_deepep=_false, is_mori=_false, is_none=lambda: True)
    moe_flags = Permissive(enforce_shared_experts_fusion=False, disable_shared_experts_fusion=False,
                           enable_waterfill=False)
    parallel = Permissive(tp_size=1, tp_rank=0, pp_group=None, attn_cp_rank=0, attn_cp_size=1,
                          enable_dp_lm_head=False, moe_ep_size=1)
    saved: list = []
    try:
        modules = {dsv2, nextn, sys.modules[cls.__module__],
                   importlib.import_module("sglang.srt.layers.quantization.quark.quark")}
        for module in modules:
            _patch(saved, module, "_is_hip", True)
            _patch(saved, module, "_is_cuda", False)
            _patch(saved, module, "_is_musa", False)
            _patch(saved, module, "get_global_server_args", lambda: server_args)
            _patch(saved, module, "get_server_args", lambda: server_args)
            _patch(saved, module, "get_moe_expert_parallel_world_size", lambda: 1)
            _patch(saved, module, "get_moe_a2a_backend", lambda: a2a)
            _patch(saved, module, "get_moe_runner_backend", lambda: Permissive(is_marlin=_false))
            for name in ("is_sbo_enabled", "is_tbo_enabled", "is_deepep_class_backend", "is_sm90_supported",
                         "is_nsa_enable_prefill_cp", "is_dsa_enable_prefill_cp", "is_mla_prefill_cp_enabled"):
                _patch(saved, module, name, _false)
            _patch(saved, module, "get_parallel", lambda: parallel)
            _patch(saved, module, "get_exec", lambda: Permissive(moe=moe_flags))
            _patch(saved, module, "get_tensor_model_parallel_world_size", lambda: 1)
            _patch(saved, module, "get_pp_group", lambda: None)
        try:  # 0.5.16 records a disabled fusion through the runtime context
            overrides = importlib.import_module("sglang.srt.arg_groups.overrides")
            _patch(saved, overrides, "declare_load_time_override", lambda *a, **k: None)
        except ImportError:
            pass
        gate = getattr(cls, "shared_experts_fusion_disable_reason", None)
        if gate is not None:  # 0.5.22 on: decided by the loader before the model is built
            return "off" if gate(hf_config, qc) else "on"

        class _Stop(Exception):
            pass

        def stop(*args, **kwargs):
            raise _Stop

        holder = {}
        for module in {nextn, sys.modules[cls.__module__]}:
            # stop right before the MTP layer is built: the decision is settled by then
            _patch(saved, module, "DeepseekModelNextN", stop)

        class Probe(cls):
            def determine_num_fused_shared_experts(self, *args, **kwargs):
                super().determine_num_fused_shared_experts(*args, **kwargs)
                holder["draft"] = self

        Probe.__name__ = cls.__name__
        try:
            Probe(hf_config, qc, prefix="")
        except _Stop:
            pass
        draft = holder.get("draft")
        if draft is None:
            return "unknown (the draft never decided)"
        return "on" if draft.num_fused_shared_experts > 0 else "off"
    except Exception as exc:  # noqa: BLE001 - a best-effort extra, reported as such
        return f"unknown ({type(exc).__name__}: {str(exc)[:80]})"
    finally:
        _restore(saved)


def resolve(cls, hf_config, quant_dict: dict, checkpoint: str) -> dict:
    """One checkpoint: per MTP module its prefix, quant method and load outcome."""
    layer_id = 0 if hf_config.num_hidden_layers == 1 else hf_config.num_hidden_layers
    qc = loader_quant_config(cls, hf_config, quant_dict)
    mtp_qc, mtp_prefix = draft_mtp_quant_config(cls, hf_config, qc)
    answer = {"draft_prefix": mtp_prefix,
              "draft_quant_config": None if mtp_qc is None else type(mtp_qc).__name__,
              "exclude": list(quant_dict.get("exclude") or []), "modules": {}}
    tensors = read_checkpoint(checkpoint)
    for key, layer in build_layers(mtp_qc).items():
        method = quant_method_name(layer)
        load, detail = load_module(key, layer, tensors, layer_id)
        answer["modules"][key] = {
            "prefix": MODULES[key][0],
            "checkpoint_names": [f"model.layers.{layer_id}.{name}" for name in MODULES[key][1]],
            "quant_method": method,
            "unquantized": method.startswith("Unquantized"),
            "load": load,
            "load_detail": detail,
        }
    answer["draft_fusion"] = draft_fusion(cls, hf_config, loader_quant_config(cls, hf_config, quant_dict))
    return answer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where the JSON answer goes")
    parser.add_argument("--checkpoint", help="a checkpoint folder (config.json + *.safetensors)")
    parser.add_argument("--arch", default="gfx950:sramecc+:xnack-", help="the emulated GPU")
    args = parser.parse_args(argv)
    result: dict = {"ok": False}
    try:
        run(args, result)
        result["ok"] = True
    except Exception as exc:  # noqa: BLE001 - the parent reports it
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc(limit=-8)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1, default=str)
    return 0 if result["ok"] else 1


def run(args, result: dict) -> None:
    started = time.time()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="sglpatch-mtp-") as work:
        import hip_emulation
        import standins

        # torchvision: the index's wheel does not load beside torch 2.13 CPU; cutlass and
        # cuda-python: 0.5.15's DSA indexer imports them unguarded. sgl_kernel: only kvcacheio
        # (0.5.10's host memory pool imports it unguarded); a catch-all would break sglang's own
        # checks for missing kernels.
        result["standins"] = standins.install(
            "torchvision", "cutlass", "cuda", partial={"sgl_kernel": ["sgl_kernel.kvcacheio"]})
        import torch  # noqa: F401
        from transformers import PretrainedConfig

        from sglang.srt.layers.quantization.quark import quark

        # The GPU double comes after sglang's import: emulated at import time, sglang's module-level
        # HIP flags pull in ROCm-only imports (sgl_kernel's ROCm ops, triton's HIP driver) that a
        # CPU machine cannot provide. The runtime queries (device capability, which Quark asserts
        # on) answer as the emulated GPU; the fusion check sets the HIP flags it reads itself.
        hip_emulation.emulate(args.arch, workdir=os.path.join(work, "rocm"))
        result["emulated_gpu"] = args.arch

        tree = os.environ.get("SGLPATCH_TREE")
        if tree and not os.path.abspath(quark.__file__).startswith(os.path.abspath(tree)):
            raise RuntimeError(f"sglang was imported from {quark.__file__}, not from the tree {tree}")
        from sglang.version import __version__

        result["sglang"] = __version__
        result["import_s"] = round(time.time() - started, 1)
        setup_parallel()
        cls, name = draft_class()
        result["draft_class"] = name
        result["draft_import_s"] = round(time.time() - started - result["import_s"], 1)
        if args.checkpoint:
            cases = {"checkpoint": args.checkpoint}
        else:
            cases = {s: write_checkpoint(os.path.join(work, s), s, seed=i) for i, s in enumerate(SPELLINGS)}
        result["cases"] = {}
        for case, folder in cases.items():
            with open(os.path.join(folder, "config.json")) as handle:
                config = json.load(handle)
            quant_dict = config.pop("quantization_config", None)
            if not quant_dict or quant_dict.get("quant_method") != "quark":
                raise RuntimeError(f"{folder}/config.json has no Quark quantization_config")
            hf_config = PretrainedConfig(**config)
            hf_config.architectures = [name]  # as ModelConfig._config_draft_model does
            case_started = time.time()
            try:
                result["cases"][case] = resolve(cls, hf_config, quant_dict, folder)
                result["cases"][case]["seconds"] = round(time.time() - case_started, 1)
            except Exception as exc:  # noqa: BLE001 - one case failing is an answer about it
                result["cases"][case] = {"error": f"{type(exc).__name__}: {exc}",
                                         "traceback": traceback.format_exc(limit=-8)}
    result["total_s"] = round(time.time() - started, 1)


if __name__ == "__main__":
    sys.exit(main())
