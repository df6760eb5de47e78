"""Make torch on CPU look like a ROCm node with eight AMD Instinct GPUs, for sglang's own checks.

sglang decides ROCm behaviour from ``torch.version.hip`` (``is_hip``), the device capability
(MI355X reports gfx950 as 9.5, MI300X gfx942 as 9.4), ``gcnArchName`` (``is_gfx95_supported``),
the memory queries, ``rocminfo`` (``get_amdgpu_memory_capacity`` shells out to it), and triton's
active driver (some modules ask ``triton.runtime.driver.active.get_current_target()`` at import
time). sglang's own platform overrides do not reach the module-level ``_is_hip`` flags nor the
capability query, so torch and triton themselves are patched, before sglang is imported, as on a
ROCm box. This is a test double for the GPU; it says nothing about kernels, only about the
decisions sglang's Python makes from these answers.

Triton's own ``HIPDriver`` is used, with only its HIP runtime handle (``HIPUtils``, which loads
``libamdhip64.so``, a library that cannot exist here) replaced by one that answers the emulated
GPU's properties; nothing can be launched through it.

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
    # Device management answers as on a box with nothing to wait for; no tensor lives there.
    c.set_device = lambda device=None: None
    c.synchronize = lambda device=None: None
    c.empty_cache = lambda: None
    _fake_rocminfo(workdir or tempfile.mkdtemp(prefix="sglpatch-rocminfo-"))
    _emulate_triton_driver()


def _emulate_triton_driver() -> None:
    """Make triton's active driver its HIP driver for the emulated GPU (when triton is installed)."""
    try:
        from triton.backends.amd import driver as amd
        from triton.runtime import driver
    except ImportError:
        return

    class EmulatedHipUtils:
        """What ``HIPUtils`` answers on the emulated GPU; no HIP runtime behind it."""

        def get_device_properties(self, device=0):
            name, (major, minor), _ = _DEVICES[_state["arch"].split(":")[0]]
            return {
                "arch": _state["arch"], "warpSize": 64, "multiprocessor_count": 256,
                "max_shared_mem": 160 * 1024, "sm_clock_rate": 2400000, "mem_clock_rate": 8000000,
                "mem_bus_width": 8192, "max_num_regs": 512 * 1024,
            }

        def load_binary(self, *args, **kwargs):
            raise RuntimeError("emulated HIP GPU: no kernel can be loaded")

    hip = amd.HIPDriver.__new__(amd.HIPDriver)
    super(amd.HIPDriver, hip).__init__()  # GPUDriver: torch.cuda's (emulated) device queries
    hip.utils = EmulatedHipUtils()
    hip.launcher_cls = amd.HIPLauncher
    driver.set_active(hip)
    if hasattr(driver, "_default"):  # reset_active() must not build the real HIP driver either
        driver._default = hip


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
