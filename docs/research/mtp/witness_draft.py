#!/usr/bin/env python3
"""CPU witness: Quark exclude lookup for the MTP (NextN) draft of a GlmMoeDsa
model in a given sglang tree.

usage: witness.py SGLANG_PARENT_DIR [--json OUT] [--quiet]

SGLANG_PARENT_DIR is the directory that contains the `sglang` package.

What it does, using sglang's own code wherever the question is decided:
  1. Builds a tiny GLM-5-shaped hf config (num_hidden_layers=N=2, one MTP
     layer) and a Quark MXFP4 `quantization_config` as Quark writes it, for
     three exclude-list spellings of "MTP shared expert (+ eh_proj) kept bf16":
       fused  : model.layers.N.mlp.shared_experts.gate_up_proj / down_proj
       unfused: model.layers.N.mlp.shared_experts.gate_proj / up_proj / down_proj
       regex  : re:model\\.layers\\.N\\.mlp\\.shared_experts\\..*
  2. Mirrors the loader: packed_modules_mapping of the draft class,
     QuarkConfig.from_config, apply_weight_name_mapper(draft mapper).
  3. Runs the draft class's real __init__ (DeepseekV3ForCausalLMNextN or
     GlmMoeDsaForCausalLMNextN, as model_config renames the draft) with
     DeepseekModelNextN / ParallelLMHead / LogitsProcessor and the
     distributed / server-args getters replaced by recorders, to capture the
     quant config the MTP layer is built with.
  4. Builds the real layers with that config and the MTP prefixes:
     DeepseekV2MLP("model.decoder.mlp.shared_experts") -> gate_up_proj,
     down_proj; ReplicatedLinear("model.eh_proj") where the version builds it
     so; RowParallelLinear("model.decoder.self_attn.o_proj") as a control
     that must stay quantized. Reports each layer's quant method.
  5. Loads full-width bf16 tensors (what the checkpoint holds for excluded
     modules) through each parameter's weight_loader, as the model loader does.
  6. Draft shared-expert fusion (best effort): decides fusion for the draft
     with the platform simulated as gfx950 (MI35x), default flags.
"""

import argparse
import importlib
import importlib.abc
import importlib.machinery
import inspect
import json
import os
import re
import sys
import time
import traceback
import types
import warnings

N = 2  # num_hidden_layers; the MTP layer is model.layers.2.*
H = 64  # hidden_size
I = 32  # moe_intermediate_size (x n_shared_experts=1)


# --------------------------------------------------------------------------
# Stand-ins for packages that cannot load on this CPU-only machine.
# --------------------------------------------------------------------------
class _PlaceholderMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        # used as a decorator at import time: leave the function as it is
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return _placeholder(f"{cls.__qualname__}()")


def _placeholder(name):
    """A class standing in for any attribute of a stand-in module: usable in
    annotations, isinstance() checks, dict values and attribute chains."""
    return _PlaceholderMeta(name.rsplit(".", 1)[-1], (), {"__qualname__": name})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{self.__name__}.{name}")


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names, prefixes):
        self.names = set(names)
        self.prefixes = tuple(prefixes)

    def find_spec(self, fullname, path, target=None):
        if fullname in self.names or fullname.startswith(self.prefixes):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _StandInModule(spec.name)
        mod.__path__ = []
        mod.__version__ = "0.0.0"
        return mod

    def exec_module(self, module):
        if module.__name__ == "torchvision.transforms":
            import enum

            module.InterpolationMode = enum.Enum(
                "InterpolationMode",
                {
                    k: k.lower()
                    for k in (
                        "NEAREST NEAREST_EXACT BILINEAR BICUBIC BOX HAMMING LANCZOS"
                    ).split()
                },
            )


STANDINS = []


def install_standins():
    # torchvision: the PyPI wheel does not load beside torch 2.13 CPU.
    try:
        import torchvision  # noqa: F401
    except Exception:
        for k in [k for k in sys.modules if k.split(".")[0] == "torchvision"]:
            del sys.modules[k]
        sys.meta_path.insert(0, _StandInFinder(["torchvision"], ["torchvision."]))
        STANDINS.append("torchvision")
    # cutlass (nvidia-cutlass-dsl) and cuda-python: 0.5.15's DSA indexer imports
    # them unguarded; only module-level attribute reads happen at import time.
    for top in ("cutlass", "cuda"):  # cuda: cuda-python's cuda.bindings
        try:
            importlib.import_module(top if top != "cuda" else "cuda.bindings.driver")
        except Exception:
            for k in [k for k in sys.modules if k.split(".")[0] == top]:
                del sys.modules[k]
            sys.meta_path.insert(0, _StandInFinder([top], [top + "."]))
            STANDINS.append(top)
    # sgl_kernel: CUDA-only wheel. Only sgl_kernel.kvcacheio is provided (it is
    # imported unguarded by 0.5.10's memory_pool_host); everything else stays
    # "not installed" so sglang keeps its no-kernel fallbacks.
    try:
        import sgl_kernel  # noqa: F401
    except Exception:
        for k in [k for k in sys.modules if k.split(".")[0] == "sgl_kernel"]:
            del sys.modules[k]

        class _TopLevel(types.ModuleType):
            pass

        top = _TopLevel("sgl_kernel")
        top.__path__ = []
        top.__version__ = "0.0.0"
        sys.modules["sgl_kernel"] = top
        sys.meta_path.insert(0, _StandInFinder(["sgl_kernel.kvcacheio"], []))
        STANDINS.append("sgl_kernel(kvcacheio only)")


# --------------------------------------------------------------------------
# Test inputs
# --------------------------------------------------------------------------
def hf_config():
    from transformers import PretrainedConfig

    cfg = PretrainedConfig(
        architectures=["GlmMoeDsaForCausalLM"],
        model_type="glm_moe_dsa",
        num_hidden_layers=N,
        num_nextn_predict_layers=1,
        hidden_size=H,
        intermediate_size=2 * H,
        moe_intermediate_size=I,
        n_shared_experts=1,
        n_routed_experts=256,  # GLM-5: 256 routed + 1 shared
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
    return cfg


def quark_config_dict(variant):
    mxfp4 = lambda dynamic: {  # noqa: E731
        "dtype": "fp4",
        "is_dynamic": dynamic,
        "qscheme": "per_group",
        "ch_axis": -1,
        "group_size": 32,
        "symmetric": None,
        "round_method": "half_even",
        "scale_type": "float",
        "scale_format": "e8m0",
        "scale_calculation_mode": "even",
        "mx_element_dtype": None,
        "observer_cls": "PerBlockMXObserver",
        "is_scale_quant": False,
    }
    L = f"model.layers.{N}"
    exclude = ["lm_head"]
    if variant == "fused":
        exclude += [
            f"{L}.mlp.shared_experts.gate_up_proj",
            f"{L}.mlp.shared_experts.down_proj",
            f"{L}.eh_proj",
        ]
    elif variant == "unfused":
        exclude += [
            f"{L}.mlp.shared_experts.gate_proj",
            f"{L}.mlp.shared_experts.up_proj",
            f"{L}.mlp.shared_experts.down_proj",
            f"{L}.eh_proj",
        ]
    elif variant == "none":  # control: the MTP layer is quantized like the rest
        pass
    elif variant == "layer61":  # a main-model layer 61 entry (use --num-layers 78)
        exclude += [
            "model.layers.61.mlp.shared_experts.gate_up_proj",
            "model.layers.61.mlp.shared_experts.down_proj",
        ]
    elif variant == "regex":
        exclude += [
            rf"re:model\.layers\.{N}\.mlp\.shared_experts\..*",
            rf"re:model\.layers\.{N}\.eh_proj$",
        ]
    else:
        raise ValueError(variant)
    return {
        "quant_method": "quark",
        "version": "0.10",
        "quant_mode": "eager_mode",
        "export": {
            "kv_cache_group": [],
            "min_kv_scale": 0.0,
            "pack_method": "reorder",
            "weight_format": "real_quantized",
            "weight_merge_groups": None,
        },
        "global_quant_config": {
            "weight": mxfp4(False),
            "input_tensors": mxfp4(True),
            "output_tensors": None,
            "bias": None,
            "target_device": None,
        },
        "exclude": exclude,
        "algo_config": None,
        "layer_quant_config": {},
        "layer_type_quant_config": {},
        "kv_cache_quant_config": {},
    }


# --------------------------------------------------------------------------
# Helpers around sglang
# --------------------------------------------------------------------------
class Permissive:
    """Stand-in for server args / parallel context: known values, else None."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class Recorder:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        Recorder.calls.append((type(self).__name__, args, kwargs))


def sglang_version(tree):
    ns = {}
    with open(os.path.join(tree, "sglang", "version.py")) as f:
        exec(f.read(), ns)
    return ns["__version__"]


def setup_parallel():
    """World size 1 for sglang's linear layers."""
    try:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        if hasattr(type(p), "override_permanently"):
            p.override_permanently(tp_size=1, tp_rank=0)
            return "runtime_context.override_permanently(tp_size=1)"
    except ImportError:
        pass
    return "tp_rank=0/tp_size=1 passed to the layers"


def filtered_kwargs(fn, **kw):
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kw.items() if k in params}


def draft_class(cfg):
    """The class sglang's ModelConfig picks for a GlmMoeDsa draft."""
    from sglang.srt.configs import model_config as mc

    src = inspect.getsource(mc.ModelConfig._config_draft_model)
    if re.search(r'"GlmMoeDsaForCausalLMNextN"', src):
        name, module = "GlmMoeDsaForCausalLMNextN", "sglang.srt.models.glm4_moe"
    else:
        # GlmMoeDsaForCausalLM is listed with DeepseekV3ForCausalLM there.
        assert "GlmMoeDsaForCausalLM" in src
        name, module = "DeepseekV3ForCausalLMNextN", "sglang.srt.models.deepseek_nextn"
    return getattr(importlib.import_module(module), name), name


def loader_quant_config(cls, cfg, variant):
    """Mirror of model_loader's get_quant_config + hf_to_sglang_mapper step."""
    import copy

    from sglang.srt.layers.quantization.quark.quark import QuarkConfig

    d = quark_config_dict(variant)
    # The draft class's mapping; DeepseekV2ForCausalLM.__init__ adds this entry
    # (q_lora_rank set) and shares the class dict, so the draft sees it.
    packed = dict(getattr(cls, "packed_modules_mapping", {}) or {})
    packed.setdefault("fused_qkv_a_proj_with_mqa", ["q_a_proj", "kv_a_proj_with_mqa"])
    d["packed_modules_mapping"] = packed
    src = inspect.getsource(importlib.import_module("sglang.srt.model_loader.weight_utils"))
    if 'hf_quant_config["hf_config"]' in src:
        d["hf_config"] = cfg
    qc = QuarkConfig.from_config(copy.deepcopy(d) if "hf_config" not in d else d)
    getter = getattr(cls, "get_hf_to_sglang_mapper", None)
    mapper = getter(cfg) if getter is not None else getattr(cls, "hf_to_sglang_mapper", None)
    if mapper is not None:
        qc.apply_weight_name_mapper(mapper)
    return qc


def run_draft_init(cls, cfg, qc, fused=0):
    """Run the draft class's own __init__ with heavy parts recorded."""
    nextn = importlib.import_module("sglang.srt.models.deepseek_nextn")
    server_args = Permissive(
        enable_dp_lm_head=False,
        disable_shared_experts_fusion=False,
        speculative_draft_model_path=None,
        model_path="/nonexistent",
        quantization="quark",
    )
    parallel = Permissive(
        tp_size=1, tp_rank=0, pp_group=None, attn_cp_rank=0, attn_cp_size=1,
        enable_dp_lm_head=False, moe_ep_size=1,
    )
    captured = {}

    class DeepseekModelNextN(Recorder):
        def __init__(self, config, quant_config=None, prefix="", **kw):
            captured["quant_config"] = quant_config
            captured["prefix"] = prefix

    class ParallelLMHead(Recorder):
        pass

    class LogitsProcessor(Recorder):
        pass

    replacements = {
        "DeepseekModelNextN": DeepseekModelNextN,
        "ParallelLMHead": ParallelLMHead,
        "LogitsProcessor": LogitsProcessor,
        "get_tensor_model_parallel_world_size": lambda: 1,
        "get_pp_group": lambda: None,
        "get_attention_cp_rank": lambda: 0,
        "get_attention_cp_size": lambda: 1,
        "is_nsa_enable_prefill_cp": lambda: False,
        "is_dsa_enable_prefill_cp": lambda: False,
        "is_mla_prefill_cp_enabled": lambda: False,
        "get_global_server_args": lambda: server_args,
        "get_server_args": lambda: server_args,
        "get_parallel": lambda: parallel,
        "get_num_fused_shared_experts": lambda: fused,
    }
    saved = {}
    modules = {nextn}
    modules.add(sys.modules[cls.__module__])
    for mod in modules:
        for k, v in replacements.items():
            if hasattr(mod, k):
                saved[(mod, k)] = getattr(mod, k)
                setattr(mod, k, v)

    class Draft(cls):
        def determine_num_fused_shared_experts(self, *a, **k):
            self.num_fused_shared_experts = fused

    Draft.__name__ = cls.__name__
    Recorder.calls = []
    try:
        model = Draft(cfg, qc, prefix="")
    finally:
        for (mod, k), v in saved.items():
            setattr(mod, k, v)
    return model, captured, server_args


def describe_method(layer):
    qm = getattr(layer, "quant_method", None)
    name = type(qm).__name__
    scheme = getattr(layer, "scheme", None)
    if scheme is not None and name != "UnquantizedLinearMethod":
        name += f"({type(scheme).__name__})"
    return name


def _build_mlp(DeepseekV2MLP, qc, tp):
    return DeepseekV2MLP(
        **filtered_kwargs(
            DeepseekV2MLP.__init__,
            hidden_size=H,
            intermediate_size=I,
            hidden_act="silu",
            quant_config=qc,
            reduce_results=False,
            prefix="model.decoder.mlp.shared_experts",
            **tp,
        )
    )


def build_layers(qc, tp_note):
    import torch

    from sglang.srt.layers.linear import ReplicatedLinear, RowParallelLinear
    from sglang.srt.models import deepseek_nextn
    from sglang.srt.models.deepseek_v2 import DeepseekV2MLP

    tp = dict(tp_rank=0, tp_size=1)
    torch.set_default_dtype(torch.bfloat16)
    layers = {}
    # The activation reads global server args at construction; it plays no
    # part here, so DeepseekV2MLP gets a plain module for it.
    dsv2 = sys.modules[DeepseekV2MLP.__module__]
    saved_act = getattr(dsv2, "SiluAndMul", None)
    if saved_act is not None:
        dsv2.SiluAndMul = torch.nn.Identity
    try:
        mlp = _build_mlp(DeepseekV2MLP, qc, tp)
    finally:
        if saved_act is not None:
            dsv2.SiluAndMul = saved_act
    layers["shared_experts.gate_up_proj"] = mlp.gate_up_proj
    layers["shared_experts.down_proj"] = mlp.down_proj
    # eh_proj: a quantizable ReplicatedLinear only where the version builds it so
    if "ReplicatedLinear(" in inspect.getsource(deepseek_nextn.DeepseekModelNextN):
        layers["eh_proj"] = ReplicatedLinear(
            2 * H, H, bias=False, quant_config=qc, prefix="model.eh_proj",
            **filtered_kwargs(ReplicatedLinear.__init__, **tp),
        )
    layers["self_attn.o_proj(control)"] = RowParallelLinear(
        2 * 8, H, bias=False, quant_config=qc, prefix="model.decoder.self_attn.o_proj",
        **filtered_kwargs(RowParallelLinear.__init__, reduce_results=False, **tp),
    )
    torch.set_default_dtype(torch.float32)
    return layers


def load_full_width(name, layer):
    """Feed the bf16 checkpoint tensors through sglang's weight loaders."""
    import torch

    p = dict(layer.named_parameters())["weight"]
    wl = getattr(p, "weight_loader", None) or layer.weight_loader
    if name.endswith("gate_up_proj"):
        shards = [(0, torch.randn(I, H, dtype=torch.bfloat16)),
                  (1, torch.randn(I, H, dtype=torch.bfloat16))]
    elif name.endswith("down_proj"):
        shards = [(None, torch.randn(H, I, dtype=torch.bfloat16))]
    elif name == "eh_proj":
        shards = [(None, torch.randn(H, 2 * H, dtype=torch.bfloat16))]
    else:
        return "n/a"
    full = torch.cat([w for _, w in shards], dim=0)
    shape = f"param {str(p.dtype)[6:]}{list(p.shape)} <- ckpt bf16{list(full.shape)}"
    try:
        for shard_id, w in shards:
            if shard_id is None:
                wl(p, w)
            else:
                wl(p, w, shard_id)
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()[0] if str(e).strip() else "shape mismatch"
        return f"FAIL {type(e).__name__}: {msg[:60]} [{shape}]"
    if p.dtype == full.dtype and p.shape == full.shape:
        return "ok, exact" if torch.equal(p.data, full) else f"WRONG VALUES [{shape}]"
    return f"SILENT truncate+cast [{shape}]"


def draft_fusion_probe(cls, cfg, qc):
    """Decide draft shared-expert fusion with the platform simulated as gfx950."""
    import torch

    dsv2 = importlib.import_module("sglang.srt.models.deepseek_v2")
    server_args = Permissive(disable_shared_experts_fusion=False,
                             enforce_shared_experts_fusion=False)
    saved = []

    def patch(obj, name, value):
        if hasattr(obj, name):
            saved.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)

    false = lambda *a, **k: False  # noqa: E731
    a2a = Permissive(is_deepep=false, is_mori=false, is_none=lambda: True)
    moe_flags = Permissive(enforce_shared_experts_fusion=False,
                           disable_shared_experts_fusion=False, enable_waterfill=False)
    for mod in {dsv2, sys.modules[cls.__module__],
                importlib.import_module("sglang.srt.models.deepseek_nextn"),
                importlib.import_module("sglang.srt.layers.quantization.quark.quark")}:
        patch(mod, "_is_hip", True)
        patch(mod, "_is_cuda", False)
        patch(mod, "_is_musa", False)
        patch(mod, "get_global_server_args", lambda: server_args)
        patch(mod, "get_server_args", lambda: server_args)
        patch(mod, "get_moe_expert_parallel_world_size", lambda: 1)
        patch(mod, "get_moe_a2a_backend", lambda: a2a)
        patch(mod, "get_moe_runner_backend", lambda: Permissive(is_marlin=false))
        patch(mod, "is_sbo_enabled", false)
        patch(mod, "is_tbo_enabled", false)
        patch(mod, "is_deepep_class_backend", false)
        patch(mod, "is_sm90_supported", false)
        patch(mod, "get_parallel", lambda: Permissive(moe_ep_size=1))
        patch(mod, "get_exec", lambda: Permissive(moe=moe_flags))
    patch(torch.cuda, "get_device_capability", lambda *a, **k: (9, 5))
    try:  # 0.5.16 records a "disable" through the runtime context
        ov = importlib.import_module("sglang.srt.arg_groups.overrides")
        patch(ov, "declare_load_time_override", lambda *a, **k: None)
    except ImportError:
        pass
    try:
        gate = getattr(cls, "shared_experts_fusion_disable_reason", None)
        if gate is not None:  # >= 0.5.23: decided before the model is built
            reason = gate(cfg, qc)
            return "off: " + reason[:70] if reason else "ON"
        # older: decided inside the draft's __init__
        nextn = importlib.import_module("sglang.srt.models.deepseek_nextn")
        parallel = Permissive(tp_size=1, tp_rank=0, pp_group=None, attn_cp_rank=0,
                              attn_cp_size=1, enable_dp_lm_head=False, moe_ep_size=1)

        class _Stop(Exception):
            pass

        def stop(*a, **k):
            raise _Stop

        holder = {}
        for mod in {nextn, sys.modules[cls.__module__]}:
            patch(mod, "get_tensor_model_parallel_world_size", lambda: 1)
            patch(mod, "get_pp_group", lambda: None)
            patch(mod, "get_parallel", lambda: parallel)
            patch(mod, "is_nsa_enable_prefill_cp", false)
            patch(mod, "is_dsa_enable_prefill_cp", false)
            patch(mod, "is_mla_prefill_cp_enabled", false)
            # stop right before the MTP layer is built: fusion is settled by then
            patch(mod, "DeepseekModelNextN", stop)

        class Probe(cls):
            def determine_num_fused_shared_experts(self, *a, **k):
                super().determine_num_fused_shared_experts(*a, **k)
                holder["obj"] = self

        Probe.__name__ = cls.__name__
        try:
            Probe(cfg, qc, prefix="")
        except _Stop:
            pass
        obj = holder.get("obj")
        if obj is None:
            return "unknown (determine not reached)"
        n = obj.num_fused_shared_experts
        return "ON" if n > 0 else "off"
    except Exception as e:  # noqa: BLE001
        if os.environ.get("WITNESS_DEBUG"):
            traceback.print_exc()
        return f"unknown ({type(e).__name__}: {str(e)[:60]})"
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


# --------------------------------------------------------------------------
def main():
    global N
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--json")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--num-layers", type=int, default=N,
                    help="num_hidden_layers of the synthetic model (MTP layer index)")
    ap.add_argument("--variants", default="fused,unfused,regex,none",
                    help="comma list of: fused, unfused, regex, none, layer61")
    args = ap.parse_args()
    N = args.num_layers
    tree = os.path.abspath(args.tree)
    sys.path.insert(0, tree)
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    t0 = time.time()
    install_standins()
    import torch  # noqa: F401

    from sglang.srt.layers.quantization.quark import quark as quark_mod

    assert os.path.dirname(quark_mod.__file__).startswith(tree), quark_mod.__file__
    t_import = time.time() - t0
    # CPU reports capability (None, None); Quark asserts on it. Report gfx950's.
    quark_mod.get_device_capability = lambda *a, **k: (9, 5)
    version = sglang_version(tree)
    patched = hasattr(quark_mod.QuarkConfig, "for_nextn_layer")
    tp_note = setup_parallel()
    cfg = hf_config()
    cls, cls_name = draft_class(cfg)
    cfg.architectures = [cls_name]  # as ModelConfig._config_draft_model does
    result = {
        "version": version, "tree": tree, "patched": patched, "draft_class": cls_name,
        "standins": STANDINS, "parallel": tp_note, "import_s": round(t_import, 1),
        "num_hidden_layers": N, "variants": {},
    }
    for variant in args.variants.split(","):
        row = {}
        try:
            qc = loader_quant_config(cls, cfg, variant)
            model, captured, _ = run_draft_init(cls, cfg, qc)
            dqc = captured["quant_config"]
            row["draft_prefix"] = captured["prefix"]
            row["draft_quant_config"] = None if dqc is None else type(dqc).__name__
            layers = build_layers(dqc, tp_note)
            row["layers"] = {
                name: {
                    "method": describe_method(l),
                    # bf16 tensors are what an excluded module holds in the checkpoint
                    "load": load_full_width(name, l) if variant in ("fused", "unfused", "regex") else "n/a",
                }
                for name, l in layers.items()
            }
            row["draft_fusion_gfx950"] = draft_fusion_probe(
                cls, cfg, loader_quant_config(cls, cfg, variant)
            )
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"
            row["traceback"] = traceback.format_exc(limit=-6)
        result["variants"][variant] = row
    result["total_s"] = round(time.time() - t0, 1)
    # installed distributions whose top-level modules this run imported
    from importlib.metadata import packages_distributions
    from importlib.metadata import version as dist_version

    pd = packages_distributions()
    dists = sorted({d for m in list(sys.modules) if "." not in m for d in pd.get(m, [])})
    result["imported_distributions"] = {d: dist_version(d) for d in dists}

    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    if not args.quiet:
        print(f"sglang {version} ({'PATCHED' if patched else 'pristine'}) "
              f"draft={cls_name} stand-ins={STANDINS or 'none'} "
              f"import={result['import_s']}s total={result['total_s']}s")
        for variant, row in result["variants"].items():
            print(f"  [{variant}]")
            if "error" in row:
                print("    ERROR", row["error"])
                print(row["traceback"])
                continue
            for name, r in row["layers"].items():
                print(f"    {name:28s} {r['method']:40s} load: {r['load']}")
            for k in ("draft_fusion_gfx950",):
                if k in row:
                    print(f"    {k}: {row[k]}")
    ok = all("error" not in r for r in result["variants"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
