"""Synthetic Quark MXFP4 checkpoints, as Quark writes them, for the probes and the tests.

One definition of the ``quantization_config`` (MXFP4 weights and activations, an exclude list)
and of the bf16 tensors an excluded module is stored with, shared by the MTP witness's probe, the
matrix's GLM checkpoint probe and the tests. ``quark_config_dict`` needs only the standard
library, so the test process imports it too (``sglpatch.witnesses.probes.quark_checkpoint``).
"""

from __future__ import annotations

import os


def _mxfp4(dynamic: bool) -> dict:
    return {
        "dtype": "fp4", "is_dynamic": dynamic, "qscheme": "per_group", "ch_axis": -1, "group_size": 32,
        "symmetric": None, "round_method": "half_even", "scale_type": "float", "scale_format": "e8m0",
        "scale_calculation_mode": "even", "mx_element_dtype": None, "observer_cls": "PerBlockMXObserver",
        "is_scale_quant": False,
    }


def quark_config_dict(exclude: list[str]) -> dict:
    """A ``quantization_config`` as Quark writes it for MXFP4 weights and activations."""
    return {
        "quant_method": "quark", "version": "0.10", "quant_mode": "eager_mode",
        "export": {"kv_cache_group": [], "min_kv_scale": 0.0, "pack_method": "reorder",
                   "weight_format": "real_quantized", "weight_merge_groups": None},
        "global_quant_config": {"weight": _mxfp4(False), "input_tensors": _mxfp4(True), "output_tensors": None,
                                "bias": None, "target_device": None},
        "exclude": exclude, "algo_config": None, "layer_quant_config": {}, "layer_type_quant_config": {},
        "kv_cache_quant_config": {},
    }


def save_bf16_tensors(folder: str, shapes: dict[str, tuple[int, ...]], seed: int) -> None:
    """``model-mtp.safetensors`` in ``folder``: seeded random bf16 tensors of the given shapes."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    tensors = {name: torch.randn(shape, generator=generator).to(torch.bfloat16) for name, shape in shapes.items()}
    save_file(tensors, os.path.join(folder, "model-mtp.safetensors"))
