"""Power during a measured run: every GPU's socket power, and the whole node's where the host
exposes it, sampled in a thread. Standard library only (runs inside the ROCm image).

GPU sockets, first source that works: the ``amdsmi`` Python library (``amdsmi_get_power_info(handle)
["socket_power"]``, watts per GPU), else the ``amd-smi metric --power`` CLI (``SOCKET_POWER: N W``
per GPU). ``rocm-smi --showpower`` is not used: it has been seen to misreport on MI3xx. Their sum is
the GPU sockets' power, not the node's: CPUs, memory, NICs, fans and power supply losses are not in it.

The whole node: the host's BMC through ``ipmitool dcmi power reading`` ("Instantaneous power
reading: N Watts"), where the program is installed and reaches a BMC (in a container, only with
/dev/ipmi0 passed in); otherwise the summary says the node's power was not measured. sglang records
no power itself.

The sampler runs around the whole client process; ``summary(window)`` keeps only the samples taken
inside the benchmark's own measured window, so watts and tok/s are over the same seconds.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time

_SOCKET_POWER = re.compile(r"SOCKET_POWER:\s*([0-9.]+)\s*W")
_DCMI_POWER = re.compile(r"Instantaneous power reading:\s*([0-9.]+)\s*Watts")
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


def _ipmi_node_reader():
    program = shutil.which("ipmitool")
    if program is None:
        raise PowerUnavailable("ipmitool is not installed")
    command = [program, "dcmi", "power", "reading"]

    def read() -> float:
        done = subprocess.run(command, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
        found = _DCMI_POWER.search(done.stdout)
        if done.returncode != 0 or found is None:
            raise PowerUnavailable(f"{' '.join(command)} (exit {done.returncode}) printed no instantaneous power reading: "
                                   f"{done.stdout[-200:]}{done.stderr[-200:]}")
        return float(found.group(1))

    return " ".join(command), read


def _first_that_reads(makers):
    reasons = []
    for make in makers:
        try:
            source, read = make()
            read()  # one sample now: a source that cannot read fails here, not mid-run
            return source, read
        except Exception as exc:  # ImportError, the library's own errors, PowerUnavailable
            reasons.append(f"{make.__name__.strip('_')}: {type(exc).__name__}: {exc}")
    raise PowerUnavailable("; ".join(reasons))


def reader():
    """(source, read) of every GPU's socket power on this machine; raises PowerUnavailable with
    every reason otherwise."""
    return _first_that_reads((_amdsmi_reader, _cli_reader))


def node_reader():
    """(source, read) of the whole node's power; raises PowerUnavailable where the host does not expose it."""
    return _first_that_reads((_ipmi_node_reader,))


class PowerSampler:
    """``with PowerSampler(interval) as power: ...`` samples until the block ends: every GPU's socket
    power, and the whole node's where the host exposes it. ``summary(window)`` gives the means over
    the samples taken inside ``window`` (wall-clock seconds), or the reason there are none."""

    def __init__(self, interval_s: float = 1.0, *, node: bool = True):
        self.interval_s = interval_s
        self.samples: list[tuple[float, list[float]]] = []  # (time.time(), watts per GPU socket)
        self.node_samples: list[tuple[float, float]] = []  # (time.time(), watts of the whole node)
        self.source = ""
        self.error = ""
        self.node_source = ""
        self.node_error = "" if node else "not asked for"
        self._want_node = node
        self._read = self._read_node = None
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        try:
            self.source, self._read = reader()
        except PowerUnavailable as exc:
            self.error = str(exc)
        if self._want_node:
            try:
                self.node_source, self._read_node = node_reader()
            except PowerUnavailable as exc:
                self.node_error = str(exc)
        if self._read or self._read_node:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set() and (self._read or self._read_node):
            started = time.monotonic()
            if self._read:
                try:
                    self.samples.append((time.time(), self._read()))
                except Exception as exc:
                    self.error, self._read = f"sampling stopped: {type(exc).__name__}: {exc}", None
            if self._read_node:
                try:
                    self.node_samples.append((time.time(), self._read_node()))
                except Exception as exc:
                    self.node_error, self._read_node = f"sampling stopped: {type(exc).__name__}: {exc}", None
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * CLI_TIMEOUT_S + 5)

    def summary(self, window: tuple[float, float] | None = None) -> dict:
        return summarize(self.samples, self.node_samples, window, source=self.source, error=self.error,
                         node_source=self.node_source, node_error=self.node_error)


def summarize(samples: list[tuple[float, list[float]]], node_samples: list[tuple[float, float]],
              window: tuple[float, float] | None, *, source: str = "", error: str = "", node_source: str = "",
              node_error: str = "") -> dict:
    """Mean and peak watts of the samples inside ``window`` (start and end included; all of them
    where ``window`` is None): the GPU sockets' sum, per GPU, and the whole node where it was sampled."""
    def inside(at: float) -> bool:
        return window is None or window[0] <= at <= window[1]

    kept = [watts for at, watts in samples if inside(at)]
    node = [watts for at, watts in node_samples if inside(at)]
    found: dict = {"source": source, "samples_taken": len(samples), "samples": len(kept), "error": error}
    if window is not None:
        found["window"] = {"start": window[0], "end": window[1], "seconds": round(window[1] - window[0], 3)}
    if kept:
        sockets = [sum(watts) for watts in kept]
        gpus = len(kept[-1])
        found.update(gpus=gpus, gpu_sockets_w_mean=sum(sockets) / len(sockets), gpu_sockets_w_max=max(sockets),
                     gpu_w_mean=sum(sockets) / len(sockets) / gpus if gpus else None)
    elif not error:
        found["error"] = (f"no sample inside the measured window ({len(samples)} taken outside it)" if samples
                          else "no sample was taken")
    if node:
        found.update(node_source=node_source, node_samples=len(node), node_w_mean=sum(node) / len(node), node_w_max=max(node))
    else:
        found["node_error"] = "the whole node's power was not measured: " + (
            node_error or (f"no node sample inside the measured window ({len(node_samples)} outside it)"
                           if node_samples else "no sample was taken"))
    return found
