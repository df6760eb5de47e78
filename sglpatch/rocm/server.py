"""One sglang server held in a container of the patched image for the checks of its launch
configuration: ``serve_check.py`` in its serve mode starts sglang, waits for it to be healthy and
reports; the checks run in their own containers in its network and talk to it by URL; stopping it
stops sglang and removes the container, whatever state it is in."""

from __future__ import annotations

import json
import threading

from sglpatch.rocm import containers
from sglpatch.rocm.checks import serve_check
from sglpatch.rocm.constants import CHECKS_INSIDE, LABEL_OWNER, OWNER
from sglpatch.rocm.options import RocmOptions

# serve_check's serve mode waits server_timeout for health after its GPU probe; the host gives it
# that, the probe's own limit, and a margin for the container and Python to start.
START_MARGIN_S = serve_check.GPU_PROBE_TIMEOUT_S + 120
# serve_check stops sglang with SIGTERM and gives it 120 s before SIGKILL; docker stop waits longer.
STOP_TIMEOUT_S = 150


class ServerContainer:
    """One sglang server (``serve_check.py`` in its serve mode) in a container of the patched image,
    held for the checks of its launch configuration (``launch``: its argv and environment, as
    ``sglpatch.matrix.job_plan.Launch`` has them)."""

    def __init__(self, client, image: str, launch, labels: dict[str, str], options: RocmOptions,
                 mounts: dict, log_inside: str, emit, *, lane_env: dict | None = None, port: int = serve_check.PORT):
        self.client, self.image, self.launch, self.labels = client, image, launch, labels
        self.options, self.mounts, self.log_inside, self.emit = options, mounts, log_inside, emit
        self.lane_env, self.port = lane_env or {}, port
        self.container = None
        self.report: dict | None = None
        self._reported = threading.Event()
        self._reader: threading.Thread | None = None
        self.exit_code: int | None = None

    @property
    def short_id(self) -> str:
        return self.container.id[:12] if self.container is not None else ""

    def start(self) -> dict:
        """Start it and wait for its report: {"serving", "healthy_s", "gpu", "log", "mismatch_lines", "error"}."""
        config = {"mode": "serve", "argv": list(self.launch.argv), "env": dict(self.launch.env), "port": self.port,
                  "timeout": self.options.server_timeout, "health_poll_s": self.options.health_poll_s, "log": self.log_inside}
        gpu = dict(containers.GPU_RUN_OPTIONS) if self.options.gpu else {}
        env = {**(containers.GPU_ENV if self.options.gpu else {}), **dict(self.launch.env), **self.lane_env}
        volumes = {host: {"bind": inside, "mode": mode} for host, (inside, mode) in self.mounts.items()}
        try:
            self.container = self.client.containers.create(
                self.image, ["python3", f"{CHECKS_INSIDE}/serve_check.py", json.dumps(config)],
                labels={**self.labels, LABEL_OWNER: OWNER}, environment=env, volumes=volumes,
                network_mode=self.options.network, **gpu)
            reason = containers.start(self.container, self.emit)
        except Exception as exc:  # docker.errors.APIError: the reason is in its explanation
            reason = str(getattr(exc, "explanation", None) or exc)
        if reason is not None:
            self.emit(f"the server container did not start: {reason}")
            return {"serving": False, "healthy_s": None, "error": f"the server container did not start: {reason}"[:600]}
        self._reader = threading.Thread(target=self._follow, daemon=True)
        self._reader.start()
        limit = self.options.server_timeout + START_MARGIN_S
        if not self._reported.wait(limit):
            return {"serving": False, "healthy_s": None,
                    "error": f"the server container {self.short_id} reported nothing in {limit} s"}
        if self.report is None:
            return {"serving": False, "healthy_s": None,
                    "error": f"the server container {self.short_id} exited before it reported"}
        return self.report

    def _follow(self) -> None:
        buffer = b""
        try:
            for chunk in self.container.logs(stream=True, follow=True):
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for raw in complete:
                    self._line(raw.decode(errors="replace"))
            if buffer:
                self._line(buffer.decode(errors="replace"))
        finally:
            self._reported.set()  # it ended: whatever it reported (or nothing) is all there is

    def _line(self, line: str) -> None:
        self.emit(line)
        if self.report is None and line.startswith("{") and '"serving"' in line:
            try:
                self.report = json.loads(line)
            except ValueError:
                return
            self._reported.set()

    def still_serving(self, report: dict) -> dict:
        """``report``, or, where the server's container has stopped since (the server died while
        held), a report that says so: the checks still to run fail with that reason."""
        if not report.get("serving"):
            return report
        try:
            self.container.reload()
            state = self.container.attrs.get("State", {})
        except Exception as exc:
            return {**report, "serving": False, "error": f"the server container {self.short_id} is gone: {exc}"[:600]}
        if state.get("Running"):
            return report
        return {**report, "serving": False,
                "error": f"the server stopped (container exit {state.get('ExitCode')}) before this check; see its log"}

    def stop(self) -> None:
        """Stop the server (serve_check stops sglang) and remove its container, whatever state it is in."""
        if self.container is None:
            return
        try:
            self.container.stop(timeout=STOP_TIMEOUT_S)
            self.container.reload()
            self.exit_code = self.container.attrs.get("State", {}).get("ExitCode")
        except Exception as exc:
            self.emit(f"stopping the server container {self.short_id} failed: {exc}")
        finally:
            try:
                self.container.remove(force=True)
            except Exception as exc:
                self.emit(f"removing the server container {self.short_id} failed: {exc}")
            if self._reader is not None:
                self._reader.join(timeout=30)
