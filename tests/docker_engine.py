"""A private docker engine for the tests: ``dockerd`` started as root in a temporary folder.

No network set-up (no bridge, no iptables, no forwarding or masquerading), its own data root, exec
root, pidfile and socket, so it touches nothing of the host's docker and needs no registry. It is
stopped by the PID it was started with. Where it cannot start, the reason is raised, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path


class EngineCannotStart(Exception):
    pass


@contextlib.contextmanager
def local_engine(start_timeout: float = 60):
    """Yield the ``unix://`` URL of a fresh dockerd; stop it (by its PID) afterwards."""
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise EngineCannotStart("dockerd is not installed (Debian: apt-get install docker.io)")
    if os.geteuid() != 0:
        raise EngineCannotStart("dockerd must run as root, and these tests are not root")
    # A short path: the socket path must stay under the 108-byte limit of unix sockets.
    folder = Path(tempfile.mkdtemp(prefix="sglpd-", dir="/tmp"))
    socket = folder / "docker.sock"
    log = open(folder / "dockerd.log", "w")
    process = subprocess.Popen(
        [
            dockerd, "--bridge=none", "--iptables=false", "--ip-forward=false", "--ip-masq=false",
            f"--data-root={folder / 'data'}", f"--exec-root={folder / 'exec'}",
            f"--pidfile={folder / 'dockerd.pid'}", f"--host=unix://{socket}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + start_timeout
        while not socket.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (folder / "dockerd.log").read_text(errors="replace")[-600:]
                raise EngineCannotStart(f"dockerd did not start (exit {process.poll()}): {tail}")
            time.sleep(0.2)
        yield f"unix://{socket}"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()
        # Overlay mounts are gone once dockerd has stopped; whatever is left is plain files.
        shutil.rmtree(folder, ignore_errors=True)


def host_program(path: str) -> dict[str, bytes]:
    """A dynamically linked program of this machine with the libraries ``ldd`` says it loads, as
    files for an image built from scratch."""
    program = shutil.which(path) or path
    if not Path(program).is_file():
        raise EngineCannotStart(f"{path} is not installed here")
    files = {program: Path(program).read_bytes()}
    listing = subprocess.run(["ldd", program], capture_output=True, text=True).stdout
    for library in re.findall(r"(/\S+\.so[.\d]*)", listing):
        files[library] = Path(library).read_bytes()
    return files


def standin_base_image(
    client, tag: str, files: dict[str, bytes], busybox: str = "/bin/busybox", programs: tuple[str, ...] = ()
) -> str:
    """A ``FROM scratch`` image that stands in for a released ROCm image: busybox as its shell and
    tools, GNU patch (the apply script refuses fuzz, which busybox's patch cannot), the host's
    ``programs`` (e.g. git) and ``files`` (paths inside the image) -- e.g. a pin's sources in
    /sgl-workspace/sglang. Built locally: no registry is needed."""
    import io
    import tarfile

    if not Path(busybox).is_file():
        raise EngineCannotStart(f"{busybox} is missing (Debian: apt-get install busybox-static)")
    binaries = host_program("patch")
    for program in programs:
        binaries.update(host_program(program))
    files = {**binaries, **files}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))

        add("Dockerfile", b'FROM scratch\nENV PATH=/usr/local/bin:/usr/bin:/bin\nCOPY busybox /bin/busybox\nRUN ["/bin/busybox", "--install", "-s", "/bin"]\nCOPY root/ /\n')
        add("busybox", Path(busybox).read_bytes(), 0o755)
        for path, data in files.items():
            add("root/" + path.lstrip("/"), data, 0o755 if path in binaries else 0o644)
    image, _ = client.images.build(fileobj=io.BytesIO(buffer.getvalue()), custom_context=True, tag=tag, rm=True)
    return image.id
