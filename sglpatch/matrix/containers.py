"""Docker mechanics of the ROCm tier: the patched image per pin, check containers, clean-up.

Everything goes through the ``docker`` Python SDK against whatever engine ``DOCKER_HOST`` (or the
default socket) names. Every image and container we make carries our labels, and clean-up removes
only containers that carry them -- never anything else on a shared runner.

The patched image is built ``FROM`` the pin's released ROCm image (or any image given), with the
series' patch files for that pin applied to the sglang checkout inside it (``/sgl-workspace/sglang``
in sglang's images, an editable install, so the patched code is what runs).
"""

from __future__ import annotations

import io
import os
import re
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from sglpatch.errors import SglpatchError, Unavailable

CHECKOUT = "/sgl-workspace/sglang"
TOOLS_DIR = "/opt/sglpatch"
LABEL_OWNER = "io.sglpatch.owner"
OWNER = "sglpatch"
LABEL_PIN = "io.sglpatch.pin"
LABEL_SERIES_VERSION = "io.sglpatch.series-version"
LABEL_SERIES_HASH = "io.sglpatch.series-hash"
LABEL_BASE = "io.sglpatch.base-image"
LABEL_CELL = "io.sglpatch.cell"

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

# Applies the patch files in order inside the image; git where the checkout is a repository (as in
# sglang's images), GNU patch otherwise. Any failure fails the build: no fuzz (a patch without
# --fuzz, such as busybox's, refuses the option and fails the build), no partial series.
APPLY_SCRIPT = """\
#!/bin/sh
set -eu
checkout="$1"
cd "$checkout"
# The first patch program on PATH, by its path: a busybox shell would run its own applet for a
# bare "patch" whatever PATH says.
patch_program=""
IFS=:
for dir in $PATH; do
    if [ -x "$dir/patch" ]; then patch_program="$dir/patch"; break; fi
done
unset IFS
for patch in "$(dirname "$0")"/patches/*.patch; do
    [ -e "$patch" ] || { echo "sglpatch: no patch for this pin; the image is the pristine release"; exit 0; }
    echo "sglpatch: applying $(basename "$patch") to $checkout"
    if command -v git >/dev/null 2>&1 && [ -d .git ]; then
        git -c core.fileMode=false apply --whitespace=nowarn "$patch" || failed=1
    elif [ -n "$patch_program" ]; then
        "$patch_program" -p1 --forward --fuzz=0 --batch < "$patch" || failed=1
    else
        echo "sglpatch: neither git nor patch in the image"; exit 1
    fi
    if [ -n "${failed:-}" ]; then echo "sglpatch: $(basename "$patch") does not apply to $checkout"; exit 1; fi
done
echo "sglpatch: series applied"
"""


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


@dataclass(frozen=True)
class PatchedImage:
    """What to build: one patched image per pin and series."""

    base_image: str
    pin: str
    series_version: str
    series_hash: str
    patches: tuple[tuple[str, Path], ...]  # (series name, rendition file) apply used for this pin, in order
    tools: tuple[Path, ...] = ()  # check scripts copied to /opt/sglpatch/checks
    checkout: str = CHECKOUT

    @property
    def tag(self) -> str:
        return f"sglpatch/sglang:{self.pin}-s{self.series_version}-{self.series_hash[:12]}"

    @property
    def labels(self) -> dict[str, str]:
        return {
            LABEL_OWNER: OWNER,
            LABEL_PIN: self.pin,
            LABEL_SERIES_VERSION: self.series_version,
            LABEL_SERIES_HASH: self.series_hash,
            LABEL_BASE: self.base_image,
        }

    def dockerfile(self) -> str:
        return "\n".join(
            [
                f"FROM {self.base_image}",
                f"COPY sglpatch/ {TOOLS_DIR}/",
                f'RUN ["/bin/sh", "{TOOLS_DIR}/apply-series.sh", "{self.checkout}"]',
                "",
            ]
        )

    def context(self) -> bytes:
        """The build context as a tar: Dockerfile, the patches (numbered, in order), the tools."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            _add(tar, "Dockerfile", self.dockerfile().encode())
            _add(tar, "sglpatch/apply-series.sh", APPLY_SCRIPT.encode(), 0o755)
            for number, (name, path) in enumerate(self.patches, 1):
                # The number keeps the series order in the script's glob; the name is the series'.
                _add(tar, f"sglpatch/patches/{number:03d}_{name}", path.read_bytes())
            for tool in self.tools:
                _add(tar, f"sglpatch/checks/{tool.name}", tool.read_bytes(), 0o755)
        return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class BuildFailed(SglpatchError):
    pass


def build_image(client, spec: PatchedImage, on_log: Callable[[str], None] = print, *, pull: bool = False) -> str:
    """Build (the engine's layer cache makes a rebuild cheap) and return the image id, streaming the
    build log line by line to ``on_log``."""
    stream = client.api.build(
        fileobj=io.BytesIO(spec.context()),
        custom_context=True,
        tag=spec.tag,
        labels=spec.labels,
        rm=True,
        forcerm=True,
        pull=pull,
        decode=True,
    )
    image_id, tail = "", []
    for chunk in stream:
        if "stream" in chunk:
            # The engine colours a step's stderr; the log is for files and CI pages, so plain text.
            for line in _ANSI.sub("", chunk["stream"]).splitlines():
                tail = (tail + [line])[-40:]
                on_log(line)
        if "error" in chunk:
            raise BuildFailed(f"building {spec.tag} from {spec.base_image} failed: {chunk['error'].strip()}\n" + "\n".join(tail[-15:]))
        if "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
    if not image_id:
        image_id = client.images.get(spec.tag).id
    return image_id


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
