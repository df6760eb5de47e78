"""Probe (runs in a pin's CPU Python): import modules of the patched tree as a ROCm box would.

Usage: import_smoke.py MODULE...   (PYTHONPATH holds <tree>/python and this folder)

The box is the witnesses' (``rocm_box``): torch and triton report an 8x MI355X HIP node before
anything of sglang is imported, and the GPU-only packages are its named stand-ins. The
environment is the caller's (``SGLPATCH_IMPORT_ENV``, a JSON object, is applied on top). Prints
one JSON line: ``{"modules": {name: "" or the error}, "hip": torch.version.hip, "standins": [...]}``;
exits 1 if any import failed.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback


def import_all(modules: list[str]) -> dict[str, str]:
    """Each module: "" when it imported, else the error and where it was raised."""
    import importlib

    answers = {}
    for module in modules:
        try:
            importlib.import_module(module)
            answers[module] = ""
        except BaseException as exc:  # a module that calls sys.exit or raises SystemExit counts too
            last = traceback.extract_tb(exc.__traceback__)[-1:]
            where = f" at {last[0].filename.split('/python/')[-1]}:{last[0].lineno}" if last else ""
            answers[module] = f"{type(exc).__name__}: {exc}{where}"[:500]
    answers.update(_loaders(modules))
    return answers


def run(spec: dict, context) -> dict:
    """As a probe of ``runner.py``: the box is the runner's, sglang imported already."""
    import torch

    context.phase("import the patched modules")
    return {"modules": import_all(spec["modules"]), "hip": getattr(torch.version, "hip", None)}


def main(modules: list[str]) -> int:
    import rocm_box

    with tempfile.TemporaryDirectory(prefix="sglpatch-import-smoke-") as workdir:
        box = rocm_box.prepare(json.loads(os.environ.get("SGLPATCH_IMPORT_ENV") or "{}"), workdir=workdir)
        import torch

        answers = import_all(modules)
        print(json.dumps({"modules": answers, "hip": getattr(torch.version, "hip", None), "standins": box["standins"]}))
    return 1 if any(answers.values()) else 0


def _loaders(modules: list[str]) -> dict[str, str]:
    """Each imported JIT kernel module's loader functions exist (the callers look them up by name)."""
    answers = {}
    for name in modules:
        module = sys.modules.get(name)
        loaders = [attr for attr in dir(module) if attr.startswith("_jit_") and attr.endswith("_module")] if module else []
        if name.endswith("fused_metadata_copy"):
            missing = {"_jit_fused_metadata_copy_module", "_jit_fused_metadata_copy_multi_module"} - set(loaders)
            answers[f"{name} loaders"] = f"missing {sorted(missing)}" if missing else ""
    return answers


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
