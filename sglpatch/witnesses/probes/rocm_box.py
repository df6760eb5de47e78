"""The one import-time environment every CPU probe runs sglang in: an MI355X node as far as
sglang's Python can tell.

On the real box (one 8x MI355X node serving GLM-5.2 with the launch profile) sglang is imported
on a HIP build of torch that sees gfx950 GPUs, with the profile's environment
(``SGLANG_USE_AITER=1``) and with the ROCm builds of ``sgl_kernel`` and ``aiter`` installed. So
here, before sglang is imported:

1. the profile's environment is set (the parent passes it: ``import_env``);
2. torch and triton are made to report the ROCm node (``hip_emulation``: HIP version, gfx950,
   capability 9.5, eight GPUs, memory, ``rocminfo``, triton's HIP driver);
3. the packages that cannot exist here are stood in for (``standins``):

   - ``torchvision``, catch-all: the index's wheel does not load beside torch 2.13 CPU; sglang
     uses it for multimodal preprocessing only, and probes none of its features on these paths.
   - ``sgl_kernel`` and ``aiter``, *named*: exactly the attributes listed
     in ``NAMED`` exist, each a placeholder. These are the names sglang imports unguarded at
     module level once ``_is_hip`` / ``_use_aiter`` are true (so the ROCm builds have them); any
     other name is missing, so ``hasattr`` probes and guarded imports take the path a box
     without that op takes, and an unguarded import that a new release adds fails the probe
     loudly (the fix is to add the name here, after reading the release's code).

Both the MTP probe and the flags probe run under this environment, in one process per tree
(``runner.py``), so their answers rest on the same doubles, which each answer lists.

Maintenance: with ``SGLPATCH_STANDIN_RECORD=FILE`` the named stand-ins become catch-alls that
record every attribute sglang takes from them (and where) into FILE, for updating ``NAMED``.

Runs inside the probe's interpreter (no sglpatch imports here).
"""

from __future__ import annotations

import atexit
import json
import os
import sys

import hip_emulation
import standins

MI355X = hip_emulation.MI355X
CATCH_ALL = ("torchvision",)
RECORD_ENV = "SGLPATCH_STANDIN_RECORD"

# module -> the attributes sglang takes from it on a HIP box with aiter on, across the pinned
# releases, while the probes import it, resolve server args and build the MTP draft (found with
# SGLPATCH_STANDIN_RECORD). All are ``from X import name`` statements, but for three attribute
# reads: ``aiter.QuantType`` (read at import by fp8_utils), and ``aiter.fused_moe``'s
# ``_moe_sorting_impl`` / ``fused_dynamic_mxfp8_quant_moe_sort`` (a guarded kernel choice in
# moe_sorting_small, which no judged value depends on).
NAMED: dict[str, list[str]] = {
    "aiter": [
        "ActivationType", "QuantType", "biased_grouped_topk", "dtypes", "dynamic_per_tensor_quant",
        "dynamic_per_token_scaled_quant", "flash_attn_varlen_func", "gemm_a4w4", "gemm_a8w8_blockscale",
        "gemm_a8w8_blockscale_bpreshuffle", "gemm_a8w8_bpreshuffle", "get_hip_quant",
        "get_mla_metadata_info_v1", "get_mla_metadata_v1", "greedy_sample", "layernorm2d_fwd",
        "mha_batch_prefill_func", "moe_sum", "paged_attention_ragged", "per_1x32_f4_quant_hip",
        "rmsnorm2d_fwd", "rmsnorm2d_fwd_with_add", "silu_and_mul", "static_per_tensor_quant"
    ],
    "aiter.dist.device_communicators.custom_all_reduce": ["CustomAllreduce"],
    "aiter.fused_moe": ["_moe_sorting_impl", "fused_dynamic_mxfp8_quant_moe_sort", "fused_moe", "fused_topk"],
    "aiter.jit.core": ["AITER_CSRC_DIR"],
    "aiter.mla": ["mla_decode_fwd", "mla_prefill_fwd"],
    "aiter.ops.cache": ["cp_gather_indexer_k_quant_cache", "indexer_k_quant_and_cache"],
    "aiter.ops.enum": ["QuantType"],
    "aiter.ops.fused_qk_norm_rope_cache_quant": ["fused_qk_rmsnorm"],
    "aiter.ops.fused_qk_rmsnorm_group_quant": ["fused_qk_rmsnorm"],
    "aiter.ops.quant": ["per_group_quant_hip"],
    "aiter.ops.rmsnorm": ["add_rmsnorm_quant", "rmsnorm_quant"],
    "aiter.ops.shuffle": [
        "moe_shuffle_scale", "moe_shuffle_weight", "shuffle_scale", "shuffle_scale_a16w4", "shuffle_weight",
        "shuffle_weight_a16w4"
    ],
    "aiter.ops.triton.batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant": [
        "batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant"
    ],
    "aiter.ops.triton.batched_gemm_afp4wfp4_pre_quant": ["batched_gemm_afp4wfp4_pre_quant"],
    "aiter.ops.triton.fused_fp8_quant": ["fused_flatten_fp8_group_quant", "fused_rms_fp8_group_quant"],
    "aiter.ops.triton.fused_kv_cache": ["fused_qk_rope_cat_and_cache_mla"],
    "aiter.ops.triton.fused_mxfp4_quant": ["fused_flatten_mxfp4_quant", "fused_rms_mxfp4_quant"],
    "aiter.ops.triton.fused_qk_concat": ["fused_qk_rope_cat"],
    "aiter.ops.triton.fusions.fused_bmm_rope_kv_cache": ["fused_fp8_bmm_rope_cat_and_cache_mla"],
    "aiter.ops.triton.gemm.fused.fused_gemm_afp4wfp4_split_cat": ["fused_gemm_afp4wfp4_split_cat"],
    "aiter.ops.triton.gemm_a16w16": ["gemm_a16w16"],
    "aiter.ops.triton.gemm_a8w8_blockscale": ["gemm_a8w8_blockscale"],
    "aiter.ops.triton.gemm_afp4wfp4": ["gemm_afp4wfp4"],
    "aiter.ops.triton.gemm_afp4wfp4_pre_quant_atomic": ["gemm_afp4wfp4_pre_quant"],
    "aiter.ops.triton.quant": ["dynamic_mxfp4_quant"],
    "aiter.rotary_embedding": ["get_rope"],
    "aiter.tuned_gemm": ["tgemm"],
    "aiter.utility.fp4_utils": ["e8m0_shuffle"],
    "sgl_kernel": [
        "build_tree_kernel_efficient", "fast_topk", "gelu_and_mul", "gelu_quick", "gelu_tanh_and_mul", "gptq_gemm",
        "gptq_shuffle", "moe_align_block_size", "silu_and_mul", "topk_sigmoid", "topk_softmax"
    ],
    "sgl_kernel.kvcacheio": [
        "transfer_kv_all_layer", "transfer_kv_all_layer_direct_lf_pf", "transfer_kv_all_layer_lf_pf",
        "transfer_kv_all_layer_lf_ph", "transfer_kv_all_layer_mla", "transfer_kv_all_layer_mla_lf_pf",
        "transfer_kv_direct", "transfer_kv_per_layer", "transfer_kv_per_layer_direct_pf_lf",
        "transfer_kv_per_layer_mla", "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_per_layer_pf_lf",
        "transfer_kv_per_layer_ph_lf"
    ],
    "sgl_kernel.scalar_type": ["ScalarType", "scalar_types"],
}


def prepare(import_env: dict[str, str | None], arch: str = MI355X, workdir: str | None = None, *,
            tree: str | None = None, registry_archs: list[str] | None = None) -> dict:
    """Set up the box before sglang is imported; returns what was emulated and stood in.

    ``registry_archs``: the architectures the probes will ask sglang's model registry for (see
    ``prepare_tree``)."""
    box = prepare_box(import_env, arch, workdir)
    box.update(prepare_tree(tree, registry_archs))
    return box


def prepare_box(import_env: dict[str, str | None], arch: str = MI355X, workdir: str | None = None) -> dict:
    """What does not depend on the tree: the environment, the stand-ins, the emulated GPU."""
    for name, value in import_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    # tvm-ffi (the JIT kernel loader's FFI) builds an optional torch DLPack addon at import time
    # when it sees a GPU torch; for the emulated ROCm GPU that is a ROCm compile that fails here,
    # several seconds per process, for an exchange no probe uses.
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    record = os.environ.pop(RECORD_ENV, None)
    if record:
        stood_in = _install_recording(record)
    else:
        stood_in = standins.install(*CATCH_ALL, names=NAMED)
    hip_emulation.emulate(arch, workdir=workdir)
    return {"emulated_gpu": arch, "standins": stood_in,
            "import_env": {k: v for k, v in import_env.items() if v is not None}}


def prepare_tree(tree: str | None, registry_archs: list[str] | None) -> dict:
    """What depends on the tree. The model registry imports every module of
    ``sglang/srt/models`` (a few hundred) on first use; with sglang's own
    ``SGLANG_DISABLED_MODEL_ARCHS`` it skips every module whose source does not name one of
    ``registry_archs``. A class is defined in a module that names it, so the registry's answer
    for these architectures is the same, in a fraction of the time."""
    if not (tree and registry_archs):
        return {}
    kept = limit_model_registry(os.path.join(tree, "sglang", "srt", "models"), registry_archs)
    return {"model_registry": f"modules naming {', '.join(registry_archs)}: {', '.join(kept)}"}


def limit_model_registry(models_dir: str, archs: list[str]) -> list[str]:
    """Set ``SGLANG_DISABLED_MODEL_ARCHS`` to every model module that names none of ``archs``;
    returns the modules kept."""
    kept, disabled = [], []
    for name in sorted(os.listdir(models_dir)):
        if not name.endswith(".py") or name == "__init__.py":
            continue
        with open(os.path.join(models_dir, name), encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        (kept if any(arch in text for arch in archs) else disabled).append(name[:-3])
    os.environ["SGLANG_DISABLED_MODEL_ARCHS"] = ",".join(disabled)
    return kept


def _install_recording(path: str) -> list[str]:
    taken: dict[str, dict[str, str]] = {}
    get = standins._CatchAllModule.__getattr__

    def recording(module, name):
        if not name.startswith("__"):
            import dis

            caller = frame = sys._getframe(1)
            while frame is not None and "sglang" not in frame.f_code.co_filename:
                frame = frame.f_back
            # How the name was taken: IMPORT_FROM (``from m import name``), LOAD_ATTR, or a call
            # such as ``hasattr`` (a feature probe, to be read before listing the name).
            how = dis.opname[caller.f_code.co_code[caller.f_lasti]] if caller is frame else "via " + (
                caller.f_code.co_filename.rsplit("/", 1)[-1])
            where = f"{frame.f_code.co_filename.split('/python/')[-1]}:{frame.f_lineno}" if frame else "?"
            taken.setdefault(module.__name__, {}).setdefault(name, f"{how} {where}")
        return get(module, name)

    standins._CatchAllModule.__getattr__ = recording

    def dump():
        old = {}
        if os.path.exists(path):
            with open(path) as handle:
                old = json.load(handle)
        for module, names in taken.items():
            old.setdefault(module, {}).update({n: w for n, w in names.items() if n not in old.get(module, {})})
        with open(path, "w") as handle:
            json.dump(old, handle, indent=1, sort_keys=True)

    atexit.register(dump)
    roots = sorted({*CATCH_ALL, *(module.split(".")[0] for module in NAMED), "sgl_kernel", "aiter", "cuda", "cutlass"})
    return standins.install(*roots)
