"""Make torch on CPU look like a ROCm node with eight AMD Instinct GPUs, for sglang's own checks.

sglang decides ROCm behaviour from ``torch.version.hip`` (``is_hip``), the device capability
(MI355X reports gfx950 as 9.5, MI300X gfx942 as 9.4), ``gcnArchName`` (``is_gfx95_supported``),
the memory queries, and ``rocminfo`` (``get_amdgpu_memory_capacity`` shells out to it). sglang's
own platform overrides do not reach the module-level ``_is_hip`` flags nor the capability query,
so torch itself is patched, before sglang is imported. This is a test double for the GPU; it says
nothing about kernels, only about the decisions sglang's Python makes from these answers.

Runs inside the probe's interpreter (no sglpatch imports here).
"""

from __future__ import annotations

import os
import tempfile
import types

MI355X = "gfx950:sramecc+:xnack-"
MI300X = "gfx942:sramecc+:xnack-"
_DEVICES = {
    "gfx950": ("AMD Instinct MI355X", (9, 5), 288),
    "gfx942": ("AMD Instinct MI300X", (9, 4), 192),
}
_state: dict = {}


def emulate(arch: str = MI355X, workdir: str | None = None, device_count: int = 8) -> None:
    """Patch torch so sglang sees ``device_count`` GPUs of ``arch``; call before importing sglang."""
    import torch

    _state["device_count"] = device_count
    set_arch(arch)
    torch.version.hip = "7.0.51831-emulated"
    torch.version.cuda = None
    c = torch.cuda
    c.is_available = lambda: True
    c.device_count = lambda: _state["device_count"]
    c.current_device = lambda: 0
    c.is_initialized = lambda: False
    c.get_device_capability = lambda device=None: _state["capability"]
    c.get_device_properties = lambda device=None: _properties()
    c.get_device_name = lambda device=None: _state["name"]
    c.mem_get_info = lambda device=None: (_state["total"], _state["total"])
    _fake_rocminfo(workdir or tempfile.mkdtemp(prefix="sglpatch-rocminfo-"))


def set_arch(arch: str) -> None:
    """Switch the emulated GPU (e.g. between scenarios in one process)."""
    name, capability, gib = _DEVICES[arch.split(":")[0]]
    _state.update(arch=arch, name=name, capability=capability, total=gib * 1024**3)
    _write_rocminfo_state()


def _properties():
    return types.SimpleNamespace(
        name=_state["name"],
        gcnArchName=_state["arch"],
        major=_state["capability"][0],
        minor=_state["capability"][1],
        total_memory=_state["total"],
        multi_processor_count=256,
        warp_size=64,
        L2_cache_size=4 * 1024**2,
        is_integrated=False,
        is_multi_gpu_board=False,
        uuid="00000000-0000-0000-0000-000000000000",
    )


def _fake_rocminfo(workdir: str) -> None:
    # Reads the state when it runs, so set_arch also changes what rocminfo prints.
    bindir = os.path.join(workdir, "bin")
    os.makedirs(bindir, exist_ok=True)
    script = os.path.join(bindir, "rocminfo")
    state_file = os.path.join(workdir, "arch")
    with open(script, "w") as handle:
        handle.write(
            "#!/bin/sh\n"
            f'read arch kb count < "{state_file}"\n'
            'i=0; while [ "$i" -lt "$count" ]; do\n'
            '  echo "  Name:                    $arch"\n'
            '  echo "  Pool 1"\n'
            '  echo "      Size:                    ${kb}(0x0) KB"\n'
            "  i=$((i+1)); done\n"
        )
    os.chmod(script, 0o755)
    _state["rocminfo_state"] = state_file
    _write_rocminfo_state()
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def _write_rocminfo_state() -> None:
    path = _state.get("rocminfo_state")
    if path:
        with open(path, "w") as handle:
            handle.write(f"{_state['arch'].split(':')[0]} {_state['total'] // 1024} {_state['device_count']}\n")
