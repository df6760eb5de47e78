"""GPU power during a measured run: every GPU's socket power, sampled in a thread. Standard library
only (runs inside the ROCm image).

Sources, first that works: the ``amdsmi`` Python library (``amdsmi_get_power_info(handle)
["socket_power"]``, watts per GPU), else the ``amd-smi metric --power`` CLI (``SOCKET_POWER: N W``
per GPU). ``rocm-smi --showpower`` is not used: it has been seen to misreport on MI3xx. sglang
records no power itself.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time

_SOCKET_POWER = re.compile(r"SOCKET_POWER:\s*([0-9.]+)\s*W")
CLI_TIMEOUT_S = 20


class PowerUnavailable(Exception):
    pass


def _amdsmi_reader():
    import amdsmi  # in ROCm images; absent elsewhere

    amdsmi.amdsmi_init()
    handles = amdsmi.amdsmi_get_processor_handles()
    if not handles:
        raise PowerUnavailable("amdsmi sees no GPU")

    def read() -> list[float]:
        watts = []
        for handle in handles:
            info = amdsmi.amdsmi_get_power_info(handle)
            value = info.get("socket_power")
            if not isinstance(value, (int, float)):  # "N/A" on parts that report the current power only
                value = info.get("current_socket_power")
            watts.append(float(value))
        return watts

    return "amdsmi.amdsmi_get_power_info socket_power", read


def _cli_reader():
    program = shutil.which("amd-smi")
    if program is None:
        raise PowerUnavailable("neither the amdsmi library nor the amd-smi CLI is installed")
    command = [program, "metric", "--power"]

    def read() -> list[float]:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
        watts = [float(w) for w in _SOCKET_POWER.findall(done.stdout)]
        if done.returncode != 0 or not watts:
            raise PowerUnavailable(f"{' '.join(command)} (exit {done.returncode}) printed no SOCKET_POWER: {done.stdout[-200:]}{done.stderr[-200:]}")
        return watts

    return " ".join(command), read


def reader():
    """(source, read) for this machine; raises PowerUnavailable with every reason otherwise."""
    reasons = []
    for make in (_amdsmi_reader, _cli_reader):
        try:
            source, read = make()
            read()  # one sample now: a source that cannot read fails here, not mid-run
            return source, read
        except Exception as exc:  # ImportError, the library's own errors, PowerUnavailable
            reasons.append(f"{make.__name__.strip('_')}: {type(exc).__name__}: {exc}")
    raise PowerUnavailable("; ".join(reasons))


class PowerSampler:
    """``with PowerSampler(interval) as power: ...`` samples until the block ends; ``summary()``
    gives the mean W per GPU and per node, or the reason there is none."""

    def __init__(self, interval_s: float = 1.0):
        self.interval_s = interval_s
        self.samples: list[tuple[float, list[float]]] = []
        self.source = ""
        self.error = ""
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        try:
            self.source, self._read = reader()
        except PowerUnavailable as exc:
            self.error = str(exc)
            return self
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.samples.append((time.time(), self._read()))
            except Exception as exc:
                self.error = f"sampling stopped: {type(exc).__name__}: {exc}"
                return
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=CLI_TIMEOUT_S + 5)

    def summary(self) -> dict:
        if not self.samples:
            return {"source": self.source, "samples": 0, "error": self.error or "no sample was taken"}
        node = [sum(watts) for _, watts in self.samples]
        gpus = len(self.samples[-1][1])
        return {
            "source": self.source,
            "samples": len(self.samples),
            "gpus": gpus,
            "node_w_mean": sum(node) / len(node),
            "node_w_max": max(node),
            "gpu_w_mean": sum(node) / len(node) / gpus if gpus else None,
            "error": self.error,
        }
