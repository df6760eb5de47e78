"""Docker mechanics of a ROCm node: the engine, check containers, clean-up of ours only.

Everything goes through the ``docker`` Python SDK against whatever engine ``DOCKER_HOST`` (or the
default socket) names. Every container we make carries our labels (``sglpatch.rocm.constants``),
and clean-up removes only containers that carry them -- never anything else on a shared runner.
The patched image they run is ``sglpatch.rocm.image``'s.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from sglpatch.plumbing.errors import Unavailable
from sglpatch.rocm.constants import LABEL_OWNER, OWNER

# What sglang's own AMD CI gives its containers: the GPUs (kfd + dri render nodes), the video group,
# a large /dev/shm for NCCL/RCCL, ptrace for debuggers and no seccomp filtering.
GPU_RUN_OPTIONS = {
    "devices": ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"],
    "group_add": ["video"],
    "shm_size": "32g",
    "cap_add": ["SYS_PTRACE"],
    "security_opt": ["seccomp=unconfined"],
}
GPU_ENV = {"SGLANG_USE_AITER": "1"}

def connect(base_url: str | None = None, timeout: int = 600):
    """A client for the engine, pinged; raises ``Unavailable`` with the reason otherwise."""
    try:
        import docker
    except ImportError:
        raise Unavailable("the docker Python SDK is not installed (pip install docker)") from None
    try:
        client = docker.DockerClient(base_url=base_url, timeout=timeout) if base_url else docker.from_env(timeout=timeout)
        client.ping()
    except Exception as exc:  # the SDK raises DockerException, requests and socket errors alike
        where = base_url or os.environ.get("DOCKER_HOST") or "the default socket"
        raise Unavailable(f"no docker engine at {where}: {str(exc)[:200]}") from None
    return client


@dataclass
class ContainerRun:
    exit_code: int | None  # None: killed at the timeout, or never started
    log: str
    timed_out: bool = False
    start_error: str = ""  # the engine refused to start it (e.g. the command does not exist)


@dataclass
class RunOptions:
    gpu: bool = True  # sglang's AMD CI device flags; off for the stand-in test image
    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, tuple[str, str]] = field(default_factory=dict)  # host path -> (container path, "ro"/"rw")
    network: str = "host"  # the check talks to its own server on localhost; "none" isolates it
    timeout: int = 3600
    user: str = ""  # "uid:gid" for files written into a mount the host must remove later; "" the image's


# The engine's own failures to set a container up (runc or the shim losing a race under load), not
# the container's: worth a second try before a check is failed on them.
ENGINE_HICCUPS = ("OCI runtime create failed", "failed to create shim task")
START_TRIES = 3


def start(container, on_log: Callable[[str], None] = print) -> str | None:
    """Start a created container; None when it runs, else the engine's reason. A start the
    engine itself fumbled (``ENGINE_HICCUPS``) is tried again, up to ``START_TRIES`` times."""
    for attempt in range(1, START_TRIES + 1):
        try:
            container.start()
            return None
        except Exception as exc:  # docker.errors.APIError: the reason is in its explanation
            reason = str(getattr(exc, "explanation", None) or exc)
            if attempt == START_TRIES or not any(hiccup in reason for hiccup in ENGINE_HICCUPS):
                return reason
            on_log(f"the engine failed to start the container ({reason[:200]}); trying again ({attempt + 1}/{START_TRIES})")
            time.sleep(attempt)
    return None


def run_check(
    client,
    image: str,
    command: list[str],
    labels: dict[str, str],
    options: RunOptions,
    on_log: Callable[[str], None] = print,
) -> ContainerRun:
    """Run ``command`` in a fresh container of ``image``, stream its output, and remove it."""
    kwargs = dict(GPU_RUN_OPTIONS) if options.gpu else {}
    env = {**(GPU_ENV if options.gpu else {}), **options.env}
    volumes = {host: {"bind": inside, "mode": mode} for host, (inside, mode) in options.mounts.items()}
    if options.user:
        kwargs["user"] = options.user
    container = client.containers.create(
        image,
        command,
        labels={**labels, LABEL_OWNER: OWNER},
        environment=env,
        volumes=volumes,
        network_mode=options.network,
        **kwargs,
    )
    lines: list[str] = []

    def follow() -> None:
        buffer = b""
        for chunk in container.logs(stream=True, follow=True):
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                line = raw.decode(errors="replace")
                lines.append(line)
                on_log(line)
        if buffer:
            lines.append(buffer.decode(errors="replace"))
            on_log(lines[-1])

    try:
        reason = start(container, on_log)
        if reason is not None:
            on_log(f"container did not start: {reason}")
            return ContainerRun(None, f"container did not start: {reason}", start_error=reason)
        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        try:
            status = container.wait(timeout=options.timeout)
            exit_code, timed_out = int(status.get("StatusCode", -1)), False
        except Exception:  # the SDK raises a requests timeout when the wait runs out
            container.kill()
            exit_code, timed_out = None, True
        reader.join(timeout=30)
        return ContainerRun(exit_code, "\n".join(lines), timed_out)
    finally:
        container.remove(force=True)


def remove_ours(client, labels: dict[str, str] | None = None) -> list[str]:
    """Remove containers that carry our owner label (and ``labels``, when given); nothing else."""
    wanted = {LABEL_OWNER: OWNER, **(labels or {})}
    filters = {"label": [f"{key}={value}" for key, value in wanted.items()]}
    removed = []
    for container in client.containers.list(all=True, filters=filters):
        # The engine filtered by label already; check again before removing anything.
        if all(container.labels.get(key) == value for key, value in wanted.items()):
            container.remove(force=True)
            removed.append(container.id)
    return removed
