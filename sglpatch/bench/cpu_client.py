"""Run a pin's own benchmark client on CPU: ``python cpu_client.py MODULE ARGS...``.

For the harness tests: the client is run by the pin's CPU Python (``sglpatch.witnesses.probe_runs``) with the
tree's ``python/`` and the witness probes on the path. sglang's package imports torchvision, whose
wheel does not load beside torch CPU here, so the probes' named stand-in replaces it where it does
not import (``witnesses/probes/standins.py``); nothing else of the client is changed. The stand-ins
used are printed to stderr. On a ROCm node the client runs as ``python3 -m MODULE`` instead.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    import standins  # the probes folder is on PYTHONPATH (cpu_python_env)

    stood_in = standins.install("torchvision")
    print(f"sglpatch cpu_client: stand-ins: {stood_in or 'none'}", file=sys.stderr, flush=True)
    module, *args = argv
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def cpu_python_env(tree: Path, probes: Path, home: Path) -> dict[str, str]:
    """The environment the client runs in on CPU: the tree's package and the probes importable,
    no hub, and the client's dataset cache (~/.cache/sglang/benchmark) under ``home``."""
    return {
        "PYTHONPATH": os.pathsep.join([str(tree / "python"), str(probes)]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONWARNINGS": "ignore",
        "HOME": str(home),
    }


if __name__ == "__main__":
    main(sys.argv[1:])
