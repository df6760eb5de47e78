"""Probe (runs in a pin's CPU Python): import modules of the patched tree as a ROCm box would.

Usage: import_smoke.py MODULE...   (PYTHONPATH holds <tree>/python and this folder)

The GPU-only packages are the witnesses' stand-ins and torch is made to look like an 8x MI355X
HIP build (``hip_emulation``), so the pin takes its ROCm import paths. Prints one JSON line:
``{"modules": {name: "" or the error}, "hip": torch.version.hip}``; exits 1 if any import failed.
"""

from __future__ import annotations

import json
import sys
import tempfile
import traceback


def main(modules: list[str]) -> int:
    import hip_emulation
    import standins

    standins.install(getattr(standins, "DEFAULT_ROOTS", None) or standins.ROOTS)
    with tempfile.TemporaryDirectory(prefix="sglpatch-import-smoke-") as workdir:
        hip_emulation.emulate(workdir=workdir)
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
        print(json.dumps({"modules": answers, "hip": getattr(torch.version, "hip", None)}))
    return 1 if any(answers.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
