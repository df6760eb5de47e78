"""A private docker engine for the tests: ``dockerd`` started as root in a temporary folder.

No network set-up (no bridge, no iptables, no forwarding or masquerading), its own data root, exec
root, pidfile and socket, so it touches nothing of the host's docker and needs no registry. It is
stopped by the PID it was started with. Where it cannot start, the reason is raised, for a skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
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
    listing = subprocess.run(["ldd", program], capture_output=True, text=True, timeout=60).stdout
    for library in re.findall(r"(/\S+\.so[.\d]*)", listing):
        files[library] = Path(library).read_bytes()
    return files


# Parts of the standard library no check script or stand-in imports, left out of a stand-in image.
_STDLIB_LEFT_OUT = {"test", "tests", "idlelib", "tkinter", "turtledemo", "lib2to3", "ensurepip", "pydoc_data",
                    "distutils", "site-packages", "dist-packages", "__pycache__", "lib-dynload"}


@dataclass
class HostPython:
    """This machine's system Python, as files for a ``FROM scratch`` image."""

    program: str  # its path, inside the image as here
    stdlib: str  # its standard library's folder
    files: dict[str, bytes]
    links: dict[str, str]  # python3 -> the program, where it has another name


def host_python(program: str = "/usr/bin/python3") -> HostPython:
    """The program and the libraries it loads, its standard library's ``.py`` files (without
    tests, GUI and packaging tools), the extension modules that need no library beyond the
    program's own, and ``python3`` linked to it: the image's ``python3`` then runs the in-image
    check scripts as a released ROCm image's Python would."""
    real = os.path.realpath(shutil.which(program) or program)
    if not Path(real).is_file():
        raise EngineCannotStart(f"{program} is not installed here")
    query = "import json, sysconfig; print(json.dumps([sysconfig.get_paths()['stdlib'], sysconfig.get_config_var('DESTSHARED') or '']))"
    done = subprocess.run([real, "-c", query], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise EngineCannotStart(f"{real} does not say where its standard library is: {done.stderr.strip()[-200:]}")
    stdlib, dynload = json.loads(done.stdout)
    files = host_program(real)
    libraries = set(files) - {real}
    for path in sorted(Path(stdlib).rglob("*.py")):
        if _STDLIB_LEFT_OUT.isdisjoint(path.relative_to(stdlib).parts[:-1]) and path.is_file():
            files[str(path)] = path.read_bytes()
    for module in sorted(Path(dynload).glob("*.so")) if dynload else []:
        needs = host_program(str(module))
        if set(needs) - {str(module)} <= libraries:
            files[str(module)] = needs[str(module)]
    links = {} if Path(real).name == "python3" else {str(Path(real).parent / "python3"): Path(real).name}
    return HostPython(real, stdlib, files, links)


def standin_base_image(
    client, tag: str, files: dict[str, bytes], busybox: str = "/bin/busybox", programs: tuple[str, ...] = (),
    links: dict[str, str] | None = None, executables: tuple[str, ...] = (),
) -> str:
    """A ``FROM scratch`` image that stands in for a released ROCm image: busybox as its shell and
    tools, GNU patch (the apply script refuses fuzz, which busybox's patch cannot), the host's
    ``programs`` (e.g. git) and ``files`` (paths inside the image; ``executables`` among them get
    mode 755) -- e.g. a pin's sources in /sgl-workspace/sglang -- and symbolic ``links`` (path ->
    target). Built locally: no registry is needed."""
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
            add("root/" + path.lstrip("/"), data, 0o755 if path in binaries or path in executables else 0o644)
        for path, target in (links or {}).items():
            info = tarfile.TarInfo("root/" + path.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    image, _ = client.images.build(fileobj=io.BytesIO(buffer.getvalue()), custom_context=True, tag=tag, rm=True)
    return image.id
