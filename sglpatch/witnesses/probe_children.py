"""Starting the witnesses' probe children: the probes folder on their path, their declared
environment, the bytecode cache they share, and the fork servers that start them warm.

A probe child (``witnesses/probes/runner.py``, run by ``probe_runs.CpuPython.run_probes``) is
forked from a fork server (``witnesses/probes/zygote.py``), one per interpreter and import
environment, that has prepared the emulated box and imported the environment's packages once
(those its children imported last time: the preload list); ``SGLPATCH_PROBE_FORK_SERVER=0``
starts a fresh interpreter for every run instead. The tree's modules are compiled once per
distinct content into a bytecode cache shared by every tree (``probes/bytecode.py``).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import multiprocessing
import multiprocessing.util
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

from sglpatch.plumbing import cache, processes
from sglpatch.witnesses import cpu_envs

PROBES = Path(__file__).parent / "probes"


RUNNER = PROBES / "runner.py"
ZYGOTE = PROBES / "zygote.py"
# SGLPATCH_PROBE_FORK_SERVER=0: every probe run starts a fresh interpreter (no fork server).
FORK_SERVER_ENV = "SGLPATCH_PROBE_FORK_SERVER"
BYTECODE_LAYOUT = "content-sha256-1"  # bump when probes/bytecode.py changes what it stores
BYTECODE_DIR: Path | None = None  # where the probes' bytecode cache is; None: in the cache root


# sglpatch's own knob for the probes (``rocm_box.RECORD_ENV``: record what sglang takes from the
# stand-ins, for maintaining them). No key holds it, so while it is set no answer is kept or
# replayed (``cache.SWITCHES_OUTSIDE_KEYS``, the same list: a switch a child sees is in a key or
# keeps nothing).
PASSED_TO_PROBES = cache.SWITCHES_OUTSIDE_KEYS


def child_env(tree: Path | None) -> dict[str, str]:
    """The probe child's whole environment: declared, never the caller's shell. sglang reads
    ``SGLANG_*``, torch ``TORCH_*`` / ``PYTORCH_*``, the HIP runtime ``HIP_*`` / ``HSA_*`` while it
    resolves, so a caller's would change the answer; the import environment a probe runs under
    is the launch profile's alone, set by ``rocm_box`` from its request."""
    child_env = processes.declared_env(PASSED_TO_PROBES)
    child_env.update(
        PYTHONPATH=os.pathsep.join([*([str(tree / "python")] if tree is not None else []), str(PROBES)]),
        PYTHONDONTWRITEBYTECODE="1",  # the tree is a checkout; leave no __pycache__ in it
        HF_HUB_OFFLINE="1",  # nothing is fetched from a hub: the probes build their own configs
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
    )
    return child_env


def kill_session(process: subprocess.Popen) -> tuple[str, str]:
    """Kill the process and its session; what it had written, (stdout, stderr)."""
    processes.kill_session(process)
    try:
        stdout, stderr = process.communicate(timeout=30)
        return stdout or "", stderr or ""
    except subprocess.TimeoutExpired:
        return "", ""


def bytecode_cache_dir(python: Path) -> Path:
    """Where the probes' content-keyed bytecode lives, per interpreter version."""
    if BYTECODE_DIR is not None:
        return BYTECODE_DIR
    return cache.cache_root() / "pyc" / f"{cpu_envs.env_python_version(python.parent.parent)}-{BYTECODE_LAYOUT}"


# -- the fork server ------------------------------------------------------------------------------

FORK_SERVER_START_S = 300  # preparing the box and importing the environment's packages


class _ForkServer:
    """``probes/zygote.py`` for one interpreter and import environment: the box prepared and the
    environment's packages imported once, one forked child per ``run``. Lives until this process
    exits (or its stdin closes); one request at a time."""

    def __init__(self, python: Path, import_env: tuple[tuple[str, str], ...], arch: str):
        self.work = tempfile.mkdtemp(prefix="sglpatch-fork-server-")
        config = Path(self.work) / "config.json"
        config.write_text(json.dumps({
            "workdir": self.work, "import_env": dict(import_env), "arch": arch,
            "preload": _preload_list(python), "bytecode_cache": str(bytecode_cache_dir(python)),
        }))
        env = child_env(None)
        self.log = open(Path(self.work) / "server.log", "w")
        self.process = subprocess.Popen([str(python), str(ZYGOTE), str(config)], env=env, cwd=self.work,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                        start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.lock = threading.Lock()
        ready = self._next(FORK_SERVER_START_S, "start")
        if "ready" not in ready:
            raise OSError(f"the fork server did not start: {ready}")
        self.started = {"seconds": ready["ready"], "preloaded": ready["preloaded"]}

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                self.lines.put(json.loads(line))
            except ValueError:
                continue
        self.lines.put(None)

    def _next(self, timeout: float, what: str) -> dict:
        try:
            message = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise subprocess.TimeoutExpired(str(ZYGOTE), timeout) from None
        if message is None:
            self.log.flush()
            tail = " | ".join(Path(self.log.name).read_text().strip().splitlines()[-6:])[-800:]
            raise OSError(f"the fork server ended ({what}): {tail}")
        return message

    def alive(self) -> bool:
        return self.process.poll() is None

    def run(self, spec: Path, out: Path, timeout: float) -> tuple[int | None, str]:
        log = out / "child.log"
        with self.lock:
            self.process.stdin.write(json.dumps({"spec": str(spec), "out": str(out), "log": str(log)}) + "\n")
            self.process.stdin.flush()
            pid = self._next(60, "fork")["pid"]
            try:
                code = self._next(timeout, "run")["exit"]
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                self._next(60, "kill")
                raise
        tail = ""
        if log.is_file():
            tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-6:])[-800:]
        return code, tail

    def close(self) -> None:
        try:
            self.process.stdin.close()
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            kill_session(self.process)
        self.log.close()
        shutil.rmtree(self.work, ignore_errors=True)


_FORK_SERVERS: dict[tuple, _ForkServer] = {}  # in order of last use
# Each holds an imported torch and transformers (about 0.5 GB, measured). Enough for every CPU
# environment of the shipped pins (7 for the 18 pins) and one more: a sweep over the pins that
# evicted one would start it again on every sweep (~12 s each).
MAX_FORK_SERVERS = 8


def fork_server(python: Path, import_env: tuple[tuple[str, str], ...], arch: str) -> _ForkServer | None:
    """The running fork server for this interpreter and import environment (``import_env``, the
    emulated GPU ``arch``: a ``ProbeRequest.environment()``), started on first use; None where it
    cannot start (the probes then run in a fresh interpreter)."""
    key = (str(python), (import_env, arch))
    server = _FORK_SERVERS.pop(key, None)
    if server is None or not server.alive():
        if server is not None:
            server.close()
        while len(_FORK_SERVERS) >= MAX_FORK_SERVERS:
            _FORK_SERVERS.pop(next(iter(_FORK_SERVERS))).close()
        try:
            server = _ForkServer(python, import_env, arch)
        except (OSError, subprocess.TimeoutExpired):
            return None
        _close_at_exit_of_a_worker()
    _FORK_SERVERS[key] = server
    return server


@atexit.register
def close_fork_servers() -> None:
    """Stop this process's fork servers and remove their scratch folders (at exit, or where a
    process ends past atexit: a pytest-xdist worker, a multiprocessing worker)."""
    for server in _FORK_SERVERS.values():
        server.close()
    _FORK_SERVERS.clear()


_closed_at_worker_exit = False


def _close_at_exit_of_a_worker() -> None:
    """A multiprocessing worker ends with os._exit, past atexit: its own servers (and their
    scratch folders) are closed by multiprocessing's finalizers instead."""
    global _closed_at_worker_exit
    if not _closed_at_worker_exit and multiprocessing.parent_process() is not None:
        multiprocessing.util.Finalize(None, close_fork_servers, exitpriority=10)
        _closed_at_worker_exit = True


def _forget_the_parents_servers() -> None:
    """In a forked child: the parent's servers share their pipes with it, so the child must
    neither use nor close them (closing one would remove the parent's scratch folder)."""
    global _closed_at_worker_exit
    _FORK_SERVERS.clear()
    _closed_at_worker_exit = False


os.register_at_fork(after_in_child=_forget_the_parents_servers)


def _preload_file(python: Path) -> Path:
    return bytecode_cache_dir(python) / f"preload-{hashlib.sha256(str(python).encode()).hexdigest()[:16]}.json"


def _preload_list(python: Path) -> list[str]:
    try:
        return list(json.loads(_preload_file(python).read_text()))
    except (OSError, ValueError):
        return ["torch", "transformers", "triton"]


def remember_preload(python: Path, modules: list[str]) -> None:
    """Keep the union of what children imported from site-packages, in import order, for the
    next fork server of this interpreter."""
    known = _preload_list(python)
    new = [m for m in modules if m not in set(known)]
    if not new:
        return
    path = _preload_file(python)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".preload-", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(known + new, handle)
    os.replace(tmp, path)

