"""Probe for the ``mtp-quark-exclude`` witness: what the pin's sglang builds for the MTP draft of
a Quark MXFP4 checkpoint that keeps the MTP shared expert and ``eh_proj`` in bf16.

Runs in the pin's CPU Python under ``runner.py`` (the tree's sglang, the emulated MI355X box of
``rocm_box``). Per case (a checkpoint folder: config.json with a Quark ``quantization_config``
and ``*.safetensors``) it does what sglang's draft worker does, with sglang's own code:

1. ``ServerArgs`` from the launch profile's flags (TP 1, the case's folder as the model), made the
   process's server args; a one-rank process group (gloo);
2. ``ModelConfig.from_server_args(..., is_draft_model=True)``, which renames the architecture to
   the draft class; the model loader's ``_get_quantization_config`` (the class's packed-modules
   mapping, ``QuarkConfig``, the weight-name mapper) and ``_initialize_model``: the draft class's
   ``__init__`` builds ``DeepseekModelNextN`` and its decoder layer, attention, MoE, shared
   expert, norms and heads, with the prefixes sglang gives them;
3. the checkpoint's tensors read by the loader's own weights iterator and fed, one module at a
   time, through the draft's ``load_weights`` (its renames, stacked-parameter and expert
   mappings), then compared with what the parameters hold.

Each module is found by what it is (``mlp.shared_experts.gate_up_proj``, ``eh_proj``,
``self_attn.o_proj`` under whatever prefix sglang built it at) and reported with the prefix the
quant config was asked about and the quant method it got. The draft's own decision to fuse its
shared expert into the routed experts (``num_fused_shared_experts``) is read off the built draft.

What is stood in, because it cannot run on CPU: the GPU (``hip_emulation``: HIP torch, gfx950),
the kernel packages (``rocm_box``), the draft's device (built on the host: the emulated GPU
cannot hold tensors, so the process group is made as for a CPU rank), and the weight
post-processing that prepares GPU kernel layouts (``process_weights_after_loading``, the draft's
``post_load_weights``): not run. Stand-ins
called while building are listed in each case (``standins_called``).

Spec: ``{"argv": [...server flags, the model as "{model}"...], "cases": {name: folder} | null,
"fusion_disabled_build": bool}``; without cases the probe writes its own, one per exclude-list
spelling (``quark_checkpoint``). With ``fusion_disabled_build`` each case is built a second time
with ``--disable-shared-experts-fusion`` added (the flag a user passes to keep the shared expert a
module of its own), answered under the case's ``fusion_disabled``: what the draft builds for its
shared expert when it is not fused.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import socket

import quark_checkpoint
import standins

# module key -> (the module's path relative to the MTP layer as sglang builds it, the names of
# its weights in the checkpoint relative to model.layers.{N}, in shard order)
MODULES = {
    "shared_experts.gate_up_proj": ("mlp.shared_experts.gate_up_proj",
                                    ["mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"]),
    "shared_experts.down_proj": ("mlp.shared_experts.down_proj", ["mlp.shared_experts.down_proj.weight"]),
    "eh_proj": ("eh_proj", ["eh_proj.weight"]),
    "self_attn.o_proj": ("self_attn.o_proj", ["self_attn.o_proj.weight"]),
}
SHARED_EXPERT = ("shared_experts.gate_up_proj", "shared_experts.down_proj")
ROUTED_EXPERTS = "routed_experts"  # the draft's fused MoE (mlp.experts), reported by how it was built
MODEL_PLACEHOLDER = "{model}"
# What stands in for what cannot run on CPU here, besides the box's GPU and packages.
DOUBLES = (
    "the draft is built on the host (the emulated GPU holds no tensor) in a one-rank gloo process group",
    "not run: process_weights_after_loading and the draft's post_load_weights (GPU kernel layouts)",
)


def filtered_kwargs(fn, **kw):
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kw
    return {k: v for k, v in kw.items() if k in params}


# -- the draft worker's steps ----------------------------------------------------------------


def server_args(argv: list[str]):
    """The pin's ServerArgs for ``argv``, resolved as the launcher does."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli_args(parser.parse_args(argv))
    if hasattr(args, "resolve_once"):  # 0.5.19 on: resolution runs on demand
        args.resolve_once()
    return args


def publish(args) -> None:
    """Make ``args`` this process's server args, as the scheduler does (rank 0 of one)."""
    try:
        from sglang.srt import runtime_context
    except ImportError:
        runtime_context = None
    if runtime_context is not None and hasattr(runtime_context, "SpawnRanks") and \
            "ranks" in inspect.signature(runtime_context.publish).parameters:
        runtime_context.publish(args, role="scheduler", ranks=runtime_context.SpawnRanks(world_rank=0, gpu_id=0))
        return
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(args)
    if runtime_context is not None and hasattr(runtime_context, "get_parallel"):
        parallel = runtime_context.get_parallel()
        if hasattr(type(parallel), "override_permanently"):
            parallel.override_permanently(tp_size=1, tp_rank=0)


def init_process_group(args, model_config) -> None:
    """A one-rank world on gloo, and sglang's model-parallel and DP-attention state on top of it.

    The groups are made as for a CPU rank (``is_cuda_alike`` answers False while they are
    built): the emulated GPU cannot hold the tensors GroupCoordinator puts on the device."""
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers.dp_attention import initialize_dp_attention

    if parallel_state.model_parallel_is_initialized():
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    saved = parallel_state.is_cuda_alike
    parallel_state.is_cuda_alike = lambda: False
    try:
        init_distributed_environment(**filtered_kwargs(
            init_distributed_environment, backend="gloo", world_size=1, rank=0, local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}"))
        initialize_model_parallel(**filtered_kwargs(initialize_model_parallel, tensor_model_parallel_size=1))
        initialize_dp_attention(**filtered_kwargs(initialize_dp_attention, server_args=args, model_config=model_config))
    finally:
        parallel_state.is_cuda_alike = saved


@contextlib.contextmanager
def recorded_prefixes(quant_config, asked: dict):
    """Record, per layer object, the prefix sglang asks the quant config (and its copies) about."""
    if quant_config is None:
        yield
        return
    cls = type(quant_config)
    original = cls.get_quant_method

    def get_quant_method(self, layer, prefix, *args, **kwargs):
        asked[id(layer)] = (prefix, type(self).__name__)
        return original(self, layer, prefix, *args, **kwargs)

    cls.get_quant_method = get_quant_method
    try:
        yield
    finally:
        cls.get_quant_method = original


def build_draft(args, folder: str):
    """The draft model for ``folder`` as sglang's loader builds it; with what the quant config was
    asked per layer, the model config and the load config."""
    import torch
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import loader
    from sglang.srt.model_loader.utils import set_default_torch_dtype

    model_config = ModelConfig.from_server_args(
        args, **filtered_kwargs(ModelConfig.from_server_args, model_path=folder, is_draft_model=True))
    init_process_group(args, model_config)
    load_config = LoadConfig(**filtered_kwargs(LoadConfig, load_format="auto"))
    quant_config = loader._get_quantization_config(model_config, load_config)
    asked: dict = {}
    with recorded_prefixes(quant_config, asked), set_default_torch_dtype(model_config.dtype), torch.device("cpu"):
        model = loader._initialize_model(model_config, load_config, quant_config)
    return model, asked, model_config, load_config


def checkpoint_tensors(model, model_config, load_config) -> dict:
    """Every tensor of the checkpoint, read by the default loader's own weights iterator."""
    from sglang.srt.model_loader.loader import DefaultModelLoader

    return dict(DefaultModelLoader(load_config)._get_all_weights(model_config, model))


# -- what the built draft says -----------------------------------------------------------------


def find(model, relative: str) -> list[tuple[str, object]]:
    return [(name, module) for name, module in model.named_modules()
            if name == relative or name.endswith("." + relative)]


def quant_method_name(layer) -> str:
    method = getattr(layer, "quant_method", None)
    if method is None:
        where = "torch.nn." if type(layer).__module__.startswith("torch.nn") else f"{type(layer).__module__}."
        return f"{where}{type(layer).__name__} (no quant method)"
    name = type(method).__name__
    scheme = getattr(layer, "scheme", None)
    if scheme is not None and not name.startswith("Unquantized"):
        name += f"({type(scheme).__name__})"
    return name


def is_unquantized(layer) -> bool:
    method = getattr(layer, "quant_method", None)
    return method is None or type(method).__name__.startswith("Unquantized")


def draft_fusion(model) -> tuple[str, str]:
    """('on' | 'off' | 'unavailable: ...', how it was read): whether the draft's MoE layer fused
    its shared expert into the routed experts, as sglang decided while building it. The MoE's
    own ``num_fused_shared_experts`` decides what is built; the draft model's, what its weight
    loader expects. Where they disagree the MoE's is the answer, and the detail says so."""
    draft = getattr(model, "num_fused_shared_experts", None)
    moe = [(name, module.num_fused_shared_experts) for name, module in model.named_modules()
           if name.endswith(".mlp") and isinstance(getattr(module, "num_fused_shared_experts", None), int)]
    if len(moe) == 1:
        name, value = moe[0]
        detail = f"{name}.num_fused_shared_experts = {value}"
        if isinstance(draft, int) and draft != value:
            detail += f", but the draft's own num_fused_shared_experts = {draft} (its weight loader expects the other layout)"
        return ("on" if value > 0 else "off"), detail
    if isinstance(draft, int):
        return ("on" if draft > 0 else "off"), f"the draft's num_fused_shared_experts = {draft}"
    return "unavailable: neither the draft nor its MoE layer has num_fused_shared_experts", ""


def standin_parts(layer) -> list[str]:
    """The parts of a judged module that are stand-ins' placeholders, by name."""
    parts = {"module": layer, "quant_method": getattr(layer, "quant_method", None),
             "scheme": getattr(layer, "scheme", None), "weight": dict(layer.named_parameters()).get("weight")}
    return [name for name, value in parts.items() if value is not None and standins.is_standin(value)]


def load_module(model, layer, names: list[str], tensors: dict) -> tuple[str, str]:
    """Feed the module's checkpoint tensors through the draft's load_weights and compare."""
    import torch

    present = [name for name in names if name in tensors]
    if not present:
        return "absent", "no tensor for it in the checkpoint"
    if len(present) != len(names):
        return "absent", f"only {', '.join(present)} in the checkpoint"
    param = dict(layer.named_parameters()).get("weight")
    if param is None:
        return "no-weight", f"{type(layer).__name__} has no weight parameter"
    full = torch.cat([tensors[name] for name in names], dim=0)
    before = param.data.clone()
    shape = (f"param {str(param.dtype).removeprefix('torch.')}{list(param.shape)} <- checkpoint "
             f"{str(full.dtype).removeprefix('torch.')}{list(full.shape)}")
    fits = param.dtype == full.dtype and param.shape == full.shape
    try:
        model.load_weights([(name, tensors[name]) for name in names])
    except Exception as exc:  # noqa: BLE001 - judged below
        message = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"
        if fits:  # the parameter could hold the tensor exactly: this is not the bug, it is a failure
            return "error", f"{message} [{shape}]"
        return "shape-mismatch", f"{message} [{shape}]"
    if param.dtype != full.dtype or param.shape != full.shape:
        return "silent-wrong", f"no error, but the tensor was narrowed/cast [{shape}]"
    if torch.equal(param.data, before) and not torch.equal(full, before):
        return "not-loaded", f"load_weights left the parameter as it was [{shape}]"
    if not torch.equal(param.data, full):
        return "wrong-values", f"loaded values differ from the checkpoint [{shape}]"
    return "ok", f"loaded exactly [{shape}]"


def resolve(args, folder: str, context) -> dict:
    """One checkpoint folder: the draft's prefix, fusion, and per module what it got."""
    standins.reset_calls()
    context.phase(f"{os.path.basename(folder)}: build the draft")
    model, asked, model_config, load_config = build_draft(args, folder)
    hf_config = model_config.hf_config
    layer_id = 0 if hf_config.num_hidden_layers == 1 else hf_config.num_hidden_layers
    fusion, fusion_detail = draft_fusion(model)
    answer: dict = {"draft_class": type(model).__name__, "draft_fusion": fusion, "draft_fusion_detail": fusion_detail,
                    "exclude": list((getattr(hf_config, "quantization_config", None) or {}).get("exclude") or []),
                    "modules": {}, "missing": []}
    decoder = find(model, "self_attn")
    answer["draft_prefix"] = decoder[0][0].rsplit(".", 2)[0] if decoder and decoder[0][0].count(".") >= 2 else ""
    answer["draft_layer"] = decoder[0][0].rsplit(".", 1)[0] if decoder else None
    layer_quant = [asked.get(id(module)) for name, module in model.named_modules()
                   if answer["draft_layer"] and name.startswith(answer["draft_layer"] + ".")]
    answer["draft_quant_config"] = next((q[1] for q in layer_quant if q), None)
    context.phase(f"{os.path.basename(folder)}: read the checkpoint")
    tensors = checkpoint_tensors(model, model_config, load_config)
    # The draft's post_load_weights (MLA weight absorption of kv_b_proj into w_kc/w_vc, on the
    # device) prepares GPU kernel layouts and cannot run here; it touches no module checked.
    model.post_load_weights = lambda *args, **kwargs: None
    experts = find(model, "mlp.experts")
    for key, (relative, weights) in MODULES.items():
        names = [f"model.layers.{layer_id}.{w}" for w in weights]
        found = find(model, relative)
        if len(found) != 1:
            if key in SHARED_EXPERT and answer["draft_fusion"] == "on" and len(experts) == 1:
                path, moe = experts[0]
                answer["modules"][key] = {
                    "prefix": None, "module": None, "fused_into": path, "checkpoint_names": names,
                    "quant_method": quant_method_name(moe), "unquantized": is_unquantized(moe),
                    "load": "fused", "load_detail": f"built into the routed experts {path}, not as a module of its own",
                    "standins_called_in_load": [], "standin_parts": standin_parts(moe)}
            else:
                answer["missing"].append(f"{relative}: {len(found)} modules match" if found else relative)
            continue
        path, layer = found[0]
        context.phase(f"{os.path.basename(folder)}: load {key}")
        before = standins.call_counts()
        load, detail = load_module(model, layer, names, tensors)
        after = standins.call_counts()
        prefix, _ = asked.get(id(layer), (None, None))
        answer["modules"][key] = {
            "prefix": prefix if prefix is not None else path, "module": path,
            "quant_config_asked": prefix is not None, "checkpoint_names": names,
            "quant_method": quant_method_name(layer), "unquantized": is_unquantized(layer),
            "load": load, "load_detail": detail,
            # What the judged values rest on: a stand-in called while the module's tensors
            # loaded, or one built into the module, its quant method or its weight.
            "standins_called_in_load": sorted(n for n, count in after.items() if count > before.get(n, 0)),
            "standin_parts": standin_parts(layer)}
    # The routed experts: only how they were built (the checkpoint stores none of their tensors).
    if len(experts) == 1:
        path, moe = experts[0]
        prefix, _ = asked.get(id(moe), (None, None))
        answer["modules"][ROUTED_EXPERTS] = {
            "prefix": prefix if prefix is not None else path, "module": path,
            "quant_config_asked": prefix is not None, "checkpoint_names": [],
            "quant_method": quant_method_name(moe), "unquantized": is_unquantized(moe),
            "load": "not-loaded-here", "load_detail": "how it was built only: no routed expert tensor is stored",
            "standins_called_in_load": [], "standin_parts": standin_parts(moe)}
    else:
        answer["missing"].append(f"mlp.experts: {len(experts)} modules match" if experts else "mlp.experts")
    answer["standins_called"] = standins.calls()
    answer["standin_reads"] = standins.reads()
    return answer


def run(spec: dict, context) -> dict:
    cases = spec.get("cases")
    if not cases:
        context.phase("write the checkpoints")
        root = os.path.join(context.workdir, "mtp-checkpoints")
        cases = {s: quark_checkpoint.write_mtp_checkpoint(os.path.join(root, s), s, seed=i)
                 for i, s in enumerate(quark_checkpoint.SPELLINGS)}
    first = next(iter(cases.values()))
    context.phase("resolve the server args")
    argv = [first if a == MODEL_PLACEHOLDER else a for a in spec["argv"]]
    args = server_args(argv)
    result: dict = {"cases": {}, "doubles": list(DOUBLES), "server_args": {
        name: getattr(args, name, None) for name in ("tp_size", "speculative_algorithm", "kv_cache_dtype",
                                                     "disable_shared_experts_fusion", "device")}}
    for case, folder in cases.items():
        result["cases"][case] = _resolve_case(argv, folder, context)
        if spec.get("fusion_disabled_build") and "error" not in result["cases"][case]:
            result["cases"][case]["fusion_disabled"] = _resolve_case(
                [*argv, "--disable-shared-experts-fusion"], folder, context)
    return result


def _resolve_case(argv: list[str], folder: str, context) -> dict:
    """``resolve`` with the server args of ``argv`` made the process's, resolved afresh for each
    build (a release may write its own decisions into them); a failure is the case's answer."""
    try:
        args = server_args(argv)
        publish(args)
        return resolve(args, folder, context)
    except Exception as exc:  # noqa: BLE001 - one case failing is an answer about it
        import traceback

        return {"error": f"{type(exc).__name__}: {exc}"[:2000], "phase": context.phase_name,
                "traceback": traceback.format_exc(limit=-8)}
