"""Probe (runs in a pin's CPU Python): import modules of the patched tree as a ROCm box would.

Usage: import_smoke.py MODULE...   (PYTHONPATH holds <tree>/python and this folder)

The GPU-only packages are the witnesses' stand-ins; after the imports torch is made to look like
an 8x MI355X HIP build (``hip_emulation``), as in the witnesses. Prints one JSON line:
``{"modules": {name: "" or the error}, "hip": torch.version.hip}``; exits 1 if any import failed.
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback


# The witnesses' stand-ins: torchvision (the index's wheel does not load beside torch CPU), aiter,
# cutlass and cuda-python (some releases import them unguarded), and of sgl_kernel only kvcacheio:
# a catch-all would defeat sglang's own checks for missing kernels.
STANDINS = ("torchvision", "aiter", "cutlass", "cuda")
PARTIAL = {"sgl_kernel": ["sgl_kernel.kvcacheio"]}


def main(modules: list[str]) -> int:
    import hip_emulation
    import standins

    stood_in = standins.install(*STANDINS, partial=PARTIAL)
    with tempfile.TemporaryDirectory(prefix="sglpatch-import-smoke-") as workdir:
        import importlib

        import torch

        answers = {}
        for module in modules:
            try:
                importlib.import_module(module)
                answers[module] = ""
            except BaseException as exc:  # a module that calls sys.exit or raises SystemExit counts too
                last = traceback.extract_tb(exc.__traceback__)[-1:]
                where = f" at {last[0].filename.split('/python/')[-1]}:{last[0].lineno}" if last else ""
                answers[module] = f"{type(exc).__name__}: {exc}{where}"[:500]
        # As in the witnesses, the GPU double comes after the imports: emulated at import time,
        # sglang's module-level HIP flags pull in triton's HIP driver, which needs a real ROCm.
        # The runtime queries then answer as the MI355X; the kernel loaders must still resolve.
        hip_emulation.emulate(workdir=workdir)
        answers.update(_loaders_under_emulation(modules))
        print(json.dumps({"modules": answers, "hip": getattr(torch.version, "hip", None), "standins": stood_in}))
    return 1 if any(answers.values()) else 0


def _loaders_under_emulation(modules: list[str]) -> dict[str, str]:
    """Each imported JIT kernel module's loader functions exist (the callers look them up by name)."""
    import sys as _sys

    answers = {}
    for name in modules:
        module = _sys.modules.get(name)
        loaders = [attr for attr in dir(module) if attr.startswith("_jit_") and attr.endswith("_module")] if module else []
        if name.endswith("fused_metadata_copy"):
            missing = {"_jit_fused_metadata_copy_module", "_jit_fused_metadata_copy_multi_module"} - set(loaders)
            answers[f"{name} loaders"] = f"missing {sorted(missing)}" if missing else ""
    return answers


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
