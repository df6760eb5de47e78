"""The rehearsal's server Python: the witnesses' CPU Python of the pin plus what sglang's server
imports beyond it, built once and cached outside the repository.

Three layers, all in ``~/.cache/sglpatch/pyenv``:

- the witnesses' **base** (torch 2.13.0 CPU and ``witnesses/requirements-cpu.txt``, shared by
  every pin) and the pin's **overlay** (its own transformers, xgrammar, apache-tvm-ffi), as
  ``sglpatch.witnesses.cpu_envs`` builds them for the probes;
- the **server layer**: ``requirements-server.txt`` installed with ``--no-deps`` in a venv that
  sees the base, shared by every pin, keyed by that file's hash and the base's;
- per pin, a **launcher**: an empty venv whose ``.pth`` puts the overlay, the server layer and
  the base on its path in that order (the overlay's versions win), keyed by the three.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from sglpatch.plumbing import cache
from sglpatch.sources.pins import Pin
from sglpatch.witnesses import cpu_envs, probe_runs

REQUIREMENTS = Path(__file__).parent / "requirements-server.txt"
LAYOUT = "sglpatch-server-env-1"  # bump when the way the layers are put together changes


def _key(*parts: str) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def server_layer(base: Path) -> Path:
    path = cache.cache_root() / "pyenv" / f"server-{_key(LAYOUT, base.name, REQUIREMENTS.read_text())}"

    def build(staging: Path) -> None:
        cpu_envs._make_venv(staging)
        cpu_envs.sees_base(staging, base)
        cpu_envs._pip(staging, ["install", "--no-deps", "-r", str(REQUIREMENTS)], "the rehearsal's server packages")

    return cpu_envs._cached_env(path, build)


def launcher(layers: list[Path]) -> Path:
    return cpu_envs.layered_env("launcher", layers, LAYOUT)


def server_python(pin: Pin) -> Path:
    """The pin's server interpreter, building whatever layer is missing."""
    base = cpu_envs.base_env()
    witness_env = probe_runs.cpu_python(pin).python.parent.parent
    layers = [*([witness_env] if witness_env != base else []), server_layer(base), base]
    return cpu_envs.venv_python(launcher(layers))
