"""The rehearsal's one server per pin: ``serve_check.py`` in its serve mode, as the ROCm job's
server container runs it, here a child process of the pin's server Python. It starts sglang, waits
for health and prints its report; it holds sglang until it gets SIGTERM, then stops it.

Stopping never depends on that going well: every process group the hold started (sglang runs in
a group of its own) is found through /proc once the hold reports and again before it is asked to
stop, and whatever is left of those groups afterwards is killed. ``stop`` runs from a ``finally``, from ``atexit``
and on SIGTERM, so a failed or interrupted rehearsal leaves no server behind.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from sglpatch.rocm.checks import serve_check

CHECKS = Path(serve_check.__file__).parent
STOP_WAIT_S = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _process_groups(pids: set[int]) -> set[int]:
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    return groups - {os.getpgid(0)}


class HeldServer:
    def __init__(self, python: Path, launch_argv: list[str], launch_env: dict[str, str], env: dict[str, str],
                 log: Path, *, timeout: float, on_line=print):
        self.port = free_port()
        self.log = log
        self.url = f"http://127.0.0.1:{self.port}"
        self.report: dict | None = None
        self._reported = threading.Event()
        self._on_line = on_line
        self._stopped = False
        self._groups: set[int] = set()  # sglang's process groups, seen once it reported
        config = {"mode": "serve", "argv": launch_argv, "env": launch_env, "port": self.port, "timeout": timeout,
                  "health_poll_s": 1.0, "log": str(log)}
        self.command = [str(python), str(CHECKS / "serve_check.py"), json.dumps(config)]
        self.started = time.monotonic()
        self.process = subprocess.Popen(self.command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, errors="replace", start_new_session=True)
        atexit.register(self.stop)
        self._reader = threading.Thread(target=self._follow, daemon=True)
        self._reader.start()

    def _follow(self) -> None:
        for line in self.process.stdout:
            line = line.rstrip("\n")
            if self.report is None and line.startswith("{") and '"serving"' in line:
                try:
                    self.report = json.loads(line)
                    self._reported.set()
                except ValueError:
                    pass
            self._on_line(line)
        self._reported.set()

    def wait(self, limit: float) -> dict:
        """What the serve mode reported: {"serving", "healthy_s", "gpu", "log", ...}."""
        if not self._reported.wait(limit):
            return {"serving": False, "healthy_s": None, "error": f"the serve mode reported nothing in {limit} s"}
        if self.report is None:
            return {"serving": False, "healthy_s": None, "error": f"the serve mode exited ({self.process.poll()}) before it reported"}
        # Now, while the hold is alive: a hold that dies later leaves sglang orphaned, out of its tree.
        self._groups |= _process_groups(_descendants(self.process.pid))
        return self.report

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        groups = self._groups | _process_groups(_descendants(self.process.pid)) | {self.process.pid}
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # the hold stops sglang (its own group) and exits
            try:
                self.process.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.process.poll() is None:
            self.process.wait(timeout=30)
        self._reader.join(timeout=10)
        atexit.unregister(self.stop)
