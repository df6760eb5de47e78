"""The CPU Python the witnesses' probes run in: a pinned base plus each pin's own requirements.

sglang's Python code (ServerArgs, the Quark config, the layers and their weight loaders) is
imported and run on CPU here, so the answers come from the pin's real code. Two layers, both in
the cache:

- the **base**: a venv with torch 2.13.0 (CPU build) and the exact set of packages in
  ``witnesses/requirements-cpu.txt``, installed with ``--no-deps`` so the file *is* the
  environment; it is keyed by the file's hash.
- the **overlay** for a pin: a venv whose ``site-packages`` sees the base's through a ``.pth`` file
  and holds the versions the pin's own metadata pins for ``OVERLAY_PACKAGES`` (transformers,
  xgrammar, apache-tvm-ffi) where the base's do not satisfy them. Pins that agree share one overlay.

Building either is done once, under a lock, in a staging folder renamed into place; a failure
raises ``EnvUnavailable`` naming the pip command and its last output lines, and leaves nothing.

``CpuPython.run_probes`` runs several probes on one tree in one child process
(``witnesses/probes/runner.py``), so the tree's sglang is imported once for all of them; its
modules are compiled once per distinct content into a bytecode cache shared by every tree
(``probes/bytecode.py``). ``env_fingerprint`` is what a cached witness answer must be keyed by:
the environment a probe ran in.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import multiprocessing
import multiprocessing.util
import os
import platform
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import venv
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from sglpatch import cache, processes, progress, sources
from sglpatch.errors import SglpatchError, Unavailable
from sglpatch.pins import Pin

PACKAGE = Path(__file__).parent
REQUIREMENTS = PACKAGE / "witnesses" / "requirements-cpu.txt"
PROBES = PACKAGE / "witnesses" / "probes"
# Packages whose version changes what sglang's code does on the paths the witnesses take: the
# model config classes (transformers), the grammar backend sglang imports at server-args time
# (xgrammar), and the JIT loader (apache-tvm-ffi). Everything else comes from the base.
OVERLAY_PACKAGES = ("transformers", "xgrammar", "apache-tvm-ffi")
BASE_LAYOUT = "sglpatch-pyenv-1"  # bump when the way the base is built changes
PIP_TIMEOUT_S = 1800


RUNNER = PROBES / "runner.py"
ZYGOTE = PROBES / "zygote.py"
# SGLPATCH_PROBE_FORK_SERVER=0: every probe run starts a fresh interpreter (no fork server).
FORK_SERVER_ENV = "SGLPATCH_PROBE_FORK_SERVER"
BYTECODE_LAYOUT = "content-sha256-1"  # bump when probes/bytecode.py changes what it stores
BYTECODE_DIR: Path | None = None  # where the probes' bytecode cache is; None: in the cache root


class EnvUnavailable(Unavailable):
    """The CPU environment cannot be built here; the reason says which step failed."""


@dataclass(frozen=True)
class ProbeRequest:
    """One probe for ``CpuPython.run_probes``: ``module`` (in the probes folder) gets ``spec``.

    Probes that share a process must agree on ``import_env`` (the environment sglang is
    imported under) and ``arch`` (the emulated GPU); ``registry_archs`` are the architectures
    the probe asks sglang's model registry for."""

    name: str
    module: str
    spec: dict
    limit_s: float
    import_env: tuple[tuple[str, str], ...] = ()
    arch: str = "gfx950:sramecc+:xnack-"
    registry_archs: tuple[str, ...] = ()

    def environment(self) -> tuple:
        return (self.import_env, self.arch)


@dataclass
class ProbeRun:
    """What one child process answered: per probe its answer (absent if it never finished),
    the runner's own report (timings, what was emulated and stood in), and, when the process
    failed as a whole, why (``error``), naming the phase it was in."""

    answers: dict[str, dict]
    runner: dict
    error: str | None
    wall_s: float

    def transient(self, name: str) -> bool:
        """Whether probe ``name`` has no answer for a reason that is no verdict on the tree: the
        child hung, was killed, could not start or ended without a report, or the probe ran past
        its time limit. Such a failure is ``unavailable``, never kept as failed."""
        answer = self.answers.get(name)
        if answer is None:
            return not self.runner.get("error")
        return bool(answer.get("timed_out")) and not answer.get("ok")

    def failure(self, name: str) -> str | None:
        """Why probe ``name`` has no usable answer, or None when it has one."""
        answer = self.answers.get(name)
        if answer is None:
            return self.error or f"the probe {name} gave no answer"
        if not answer.get("ok"):
            return f"the probe {name} failed in {answer.get('phase') or 'its setup'}: {answer.get('error')}"
        return None


@dataclass(frozen=True)
class CpuPython:
    """One pin's interpreter: ``run`` starts it with the tree's package and the probes importable."""

    python: Path
    overlay: dict[str, str] = field(default_factory=dict)

    def run(
        self,
        args: list[str],
        *,
        tree: Path,
        env: dict[str, str] | None = None,
        timeout: float = 600,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python args`` with ``<tree>/python`` and the probes folder first on the path.

        Past ``timeout`` the child and everything it started are killed, and the result says so:
        exit status 124 and a last line of stderr naming what hung (never TimeoutExpired)."""
        child_env = _child_env(tree)
        child_env.update(env or {})
        command = [str(self.python), *args]
        process = subprocess.Popen(command, env=child_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stdout, stderr = _kill_session(process)
            what = " ".join(Path(a).name if "/" in a else a for a in args[:4])
            stderr = f"{stderr or ''}\n{what} hung in the CPU Python of {tree.name}: killed after {timeout:.0f} s"
            return subprocess.CompletedProcess(command, 124, stdout or "", stderr)
        return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)

    def run_probes(self, tree: Path, probes: list[ProbeRequest], *, timeout: float | None = None,
                   remember: bool = False) -> ProbeRun:
        """Run ``probes`` on ``tree`` in one child that imports the tree's sglang once.

        Each probe has its own time limit inside the child; ``timeout`` (default: their sum plus
        the import's allowance) bounds the whole process, which is then killed with everything
        it started, and the answer says which phase it hung in. Never raises for what the child
        does: a failure is in ``ProbeRun.error`` or in a probe's answer.

        With ``remember``, a run in which every probe answered is kept under a digest of all it
        depends on (``probe_run_key``) and given back, not run again, to the next asker of the
        same; a run with a failure is never kept. The answers' own mentions of the tree and of the
        files the specs name are those of the asker's."""
        key = probe_run_key(self, tree, probes) if remember else None
        if key is None:
            return self._run_probes(tree, probes, timeout=timeout)
        paths = _named_paths(Path(tree).resolve(), probes)
        fresh: list[ProbeRun] = []

        def run_and_hide_paths() -> dict:
            run = self._run_probes(tree, probes, timeout=timeout)
            fresh.append(run)
            hidden = json.loads(_without_paths(json.dumps({"answers": run.answers, "runner": run.runner}), paths))
            return {**hidden, "settled": run.error is None and all(run.failure(p.name) is None for p in probes)}

        stored = PROBE_RUNS.remember(key, run_and_hide_paths, keep=lambda value: value["settled"])
        if fresh:
            return fresh[0]
        try:
            shown = json.loads(_with_paths(json.dumps({"answers": stored["answers"], "runner": stored["runner"]}), paths))
            return ProbeRun(shown["answers"], {**shown["runner"], "remembered": key}, None, 0.0)
        except (KeyError, TypeError, ValueError):
            PROBE_RUNS.path(key).unlink(missing_ok=True)
            return self._run_probes(tree, probes, timeout=timeout)

    def _run_probes(self, tree: Path, probes: list[ProbeRequest], *, timeout: float | None = None) -> ProbeRun:
        if not probes:
            return ProbeRun({}, {}, None, 0.0)
        environments = {probe.environment() for probe in probes}
        if len(environments) != 1:
            raise ValueError(f"probes for one process must share their import environment: {sorted(environments)}")
        first = probes[0]
        tree = Path(tree).resolve()
        limit = timeout or IMPORT_ALLOWANCE_S + sum(probe.limit_s for probe in probes)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="sglpatch-probes-") as work:
            out = Path(work) / "out"
            out.mkdir()
            spec = {
                "workdir": work,
                "tree": str(tree / "python"),
                "import_env": dict(first.import_env),
                "arch": first.arch,
                "registry_archs": sorted({arch for probe in probes for arch in probe.registry_archs}),
                "bytecode_cache": str(bytecode_cache_dir(self.python)),
                "probes": [{"name": p.name, "module": p.module, "limit_s": p.limit_s, "spec": p.spec} for p in probes],
            }
            (Path(work) / "spec.json").write_text(json.dumps(spec))
            error = None
            server = _fork_server(self, first) if os.environ.get(FORK_SERVER_ENV, "1") != "0" else None
            try:
                if server is not None:
                    code, tail = server.run(Path(work) / "spec.json", out, limit)
                else:
                    code, tail = self._run_child([str(RUNNER), str(Path(work) / "spec.json"), str(out)], tree,
                                                 Path(work), limit)
            except OSError as exc:
                code, tail, error = None, "", f"cannot start the CPU probe runner ({self.python}): {exc}"
            except subprocess.TimeoutExpired:
                code, tail = None, ""
                error = (f"the CPU probe runner for {tree.name} hung in {_last_phase(out)!r} "
                         f"and was killed after {limit:.0f} s")
            answers = {}
            for probe in probes:
                path = out / f"{probe.name}.json"
                if path.is_file():
                    try:
                        answers[probe.name] = json.loads(path.read_text())
                    except ValueError as exc:
                        answers[probe.name] = {"ok": False, "error": f"unreadable answer: {exc}"}
            runner = {}
            if (out / "runner.json").is_file():
                try:
                    runner = json.loads((out / "runner.json").read_text())
                except ValueError:
                    runner = {}
            if error is None and not runner.get("ok"):
                if runner.get("error"):
                    error = f"the CPU probe runner failed in {runner.get('phase')!r}: {runner['error']}"
                else:
                    error = f"the CPU probe runner exited {code} without a report: {tail}"
            if runner.get("third_party"):
                _remember_preload(self.python, runner.pop("third_party"))
            if server is not None:
                runner["fork_server"] = server.started
        return ProbeRun(answers, runner, error, round(time.monotonic() - started, 2))

    def _run_child(self, args: list[str], tree: Path, cwd: Path, timeout: float) -> tuple[int, str]:
        """Run the child in its own session, so a timeout kills it and what it started."""
        child_env = _child_env(tree)
        process = subprocess.Popen([str(self.python), *args], env=child_env, cwd=cwd, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_session(process)
            raise
        tail = " | ".join(line for line in (output or "").strip().splitlines()[-6:])
        return process.returncode, tail[-800:]


IMPORT_ALLOWANCE_S = 300  # preparing the box and importing sglang, on a loaded machine
PROBE_RUNS = cache.Memo("probe-runs")  # by ``probe_run_key``
PROBE_RUN_LAYOUT = "2"  # bump when what ``probe_run_key`` digests changes


def probe_run_key(python: CpuPython, tree: Path, probes: list[ProbeRequest]) -> str | None:
    """A digest of what a probe run answers from: the tree's ``python/`` files by name and
    content, the environment's interpreter and installed packages (its own and its base's), the
    probes' code and this module's (``code_digest``), and each request, with every path its spec
    names by the content of what is there. None where the environment cannot be told (an
    interpreter sglpatch did not build): such a run is not remembered."""
    env = Path(python.python).parent.parent
    described = []
    for folder in (env, *_base_of(env)):
        try:
            described.append((folder / "pyvenv.cfg").read_text() + (folder / "sglpatch-complete.json").read_text())
        except OSError:
            return None
    digest = hashlib.sha256(f"sglpatch-probe-run-{PROBE_RUN_LAYOUT}\0{code_digest([])}\0".encode())
    for text in described:
        digest.update(text.encode() + b"\0")
    digest.update(_content_digest(Path(tree).resolve() / "python").encode())
    for probe in probes:
        request = {"name": probe.name, "module": probe.module, "import_env": probe.import_env, "arch": probe.arch,
                   "registry_archs": probe.registry_archs, "spec": _by_content(probe.spec)}
        digest.update(json.dumps(request, sort_keys=True).encode() + b"\0")
    return digest.hexdigest()[:32]


def _base_of(env: Path) -> list[Path]:
    """The base an overlay sees through its ``.pth`` (none for the base itself)."""
    try:
        return [Path((_site_packages(env) / "zz_sglpatch_base.pth").read_text().strip()).parent.parent.parent]
    except OSError:
        return []


def _content_digest(path: Path) -> str:
    """A file's bytes, or a folder's files by relative name and content (links by their target)."""
    digest = hashlib.sha256()
    if path.is_file():
        digest.update(path.read_bytes())
        return digest.hexdigest()
    for item in sorted(p for p in path.rglob("*") if p.is_file() or p.is_symlink()):
        name = item.relative_to(path).as_posix().encode()
        body = os.readlink(item).encode() if item.is_symlink() else item.read_bytes()
        digest.update(name + b"\0" + hashlib.sha256(body).digest())
    return digest.hexdigest()


def _map_named_paths(value, replace):
    """``value`` with ``replace(path)`` in place of every string that names an existing absolute
    path (a spec's checkpoint and model folders live in temporary folders), visited in order."""
    if isinstance(value, dict):
        return {key: _map_named_paths(item, replace) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_map_named_paths(item, replace) for item in value]
    if isinstance(value, str) and value.startswith("/") and os.path.exists(value):
        return replace(value)
    return value


def _by_content(value):
    """``value`` with every path it names replaced by the digest of what is there."""
    return _map_named_paths(value, lambda path: {"content": _content_digest(Path(path))})


def _named_paths(tree: Path, probes: list[ProbeRequest]) -> list[str]:
    """The tree and every existing path the specs name, in the order the specs name them (the
    same for every run of one key, whatever the folders are called this time)."""
    found = [str(tree)]
    for probe in probes:
        _map_named_paths(probe.spec, lambda path: found.append(path) if path not in found else None)
    return found


def _without_paths(text: str, paths: list[str]) -> str:
    # Longest first, so that no path is replaced inside a longer one that holds it.
    for number, path in sorted(enumerate(paths), key=lambda item: len(item[1]), reverse=True):
        text = text.replace(json.dumps(path)[1:-1], f"<sglpatch-path-{number}>")
    return text


def _with_paths(text: str, paths: list[str]) -> str:
    for number, path in enumerate(paths):
        text = text.replace(f"<sglpatch-path-{number}>", json.dumps(path)[1:-1])
    return text


# sglpatch's own knob for the probes (``rocm_box.RECORD_ENV``: record what sglang takes from the
# stand-ins, for maintaining them); it never reaches an answer that is kept.
PASSED_TO_PROBES = ("SGLPATCH_STANDIN_RECORD",)


def _child_env(tree: Path | None) -> dict[str, str]:
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


def _kill_session(process: subprocess.Popen) -> tuple[str, str]:
    """Kill the process and its session; what it had written, (stdout, stderr)."""
    processes.kill_session(process)
    try:
        stdout, stderr = process.communicate(timeout=30)
        return stdout or "", stderr or ""
    except subprocess.TimeoutExpired:
        return "", ""


def _last_phase(out: Path) -> str:
    """The phase the runner said it started last (``runner.py`` appends one line per phase)."""
    try:
        lines = (out / "progress").read_text().strip().splitlines()
    except OSError:
        return "starting the interpreter"
    return lines[-1].split(" ", 1)[-1] if lines else "starting the interpreter"


def bytecode_cache_dir(python: Path) -> Path:
    """Where the probes' content-keyed bytecode lives, per interpreter version."""
    if BYTECODE_DIR is not None:
        return BYTECODE_DIR
    return cache.cache_root() / "pyc" / f"{_env_python_version(python.parent.parent)}-{BYTECODE_LAYOUT}"


def code_digest(paths: list[Path]) -> str:
    """A digest of the named files, of this module (how the child is started) and of every file of
    the probes folder (the child side), by name and content (not by where the checkout is)."""
    digest = hashlib.sha256()
    files = [(f"probes/{p.relative_to(PROBES)}", p) for p in sorted(PROBES.rglob("*.py"))]
    files += sorted((path.name, path) for path in {*paths, Path(__file__)})
    for name, path in files:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def _pin_overlay_specs(version: str, sha256: str, pin: Pin) -> tuple[str, ...]:
    return tuple(sorted(f"{_canonical(r.name)}{r.specifier}" for r in pin_requirements(pin, only=OVERLAY_PACKAGES)
                        if _canonical(r.name) in OVERLAY_PACKAGES))


NOT_BUILT = "not built yet"  # an environment's installed versions before it is built


def env_fingerprint(pin: Pin) -> str:
    """What the pin's CPU environment is made of: the base's requirements file and layout, the
    Python it runs, the pin's own requirements for the overlay packages, and the versions pip
    installed in the base and the pin's overlay (their ``sglpatch-complete.json``): the same
    specifiers can resolve to other versions on another day or index. Computed without building
    anything; before the environment is built its installed versions are ``NOT_BUILT``, a key
    no answer is kept under (the answer is kept under the key computed once it ran)."""
    base = _base_path()
    parts = {
        "requirements": hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest(),
        "layout": BASE_LAYOUT,
        "python": _env_python_version(base),
        "overlay": list(_pin_overlay_specs(pin.version, pin.sha256, pin)),
        "installed": _installed_record(pin, base),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def env_built(pin: Pin) -> bool:
    """Whether the pin's CPU environment (base and overlay) is built, so its fingerprint names
    the versions installed in it."""
    return _installed_record(pin, _base_path()) != NOT_BUILT


def _installed_record(pin: Pin, base: Path) -> str:
    """The base's and the pin's overlay's installed versions, as their builds recorded them."""
    try:
        base_record = (base / "sglpatch-complete.json").read_text()
        installed = json.loads(base_record)["packages"]
    except (OSError, ValueError, KeyError, TypeError):
        return NOT_BUILT
    wanted = _unsatisfied((Requirement(spec) for spec in _pin_overlay_specs(pin.version, pin.sha256, pin)), installed)
    if not wanted:
        return base_record
    try:
        return base_record + (_overlay_path(base, wanted) / "sglpatch-complete.json").read_text()
    except OSError:
        return NOT_BUILT


def env_group(pin: Pin) -> str:
    """What pins sharing a CPU Python have in common (``env_fingerprint``), for handing them to
    one worker; the pin's own version where its environment cannot be told yet."""
    try:
        return env_fingerprint(pin)
    except SglpatchError:
        return pin.version


def _env_python_version(env: Path) -> str:
    """The Python version a venv was made with (its pyvenv.cfg), else the one that would make it."""
    try:
        for line in (env / "pyvenv.cfg").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() in ("version", "version_info"):
                return f"{platform.python_implementation().lower()}-{value.strip()}"
    except OSError:
        pass
    return f"{platform.python_implementation().lower()}-{platform.python_version()}"


# -- the fork server ------------------------------------------------------------------------------

FORK_SERVER_START_S = 300  # preparing the box and importing the environment's packages


class _ForkServer:
    """``probes/zygote.py`` for one interpreter and import environment: the box prepared and the
    environment's packages imported once, one forked child per ``run``. Lives until this process
    exits (or its stdin closes); one request at a time."""

    def __init__(self, python: Path, request: ProbeRequest):
        self.work = tempfile.mkdtemp(prefix="sglpatch-fork-server-")
        config = Path(self.work) / "config.json"
        config.write_text(json.dumps({
            "workdir": self.work, "import_env": dict(request.import_env), "arch": request.arch,
            "preload": _preload_list(python), "bytecode_cache": str(bytecode_cache_dir(python)),
        }))
        env = _child_env(None)
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
            _kill_session(self.process)
        self.log.close()
        shutil.rmtree(self.work, ignore_errors=True)


_FORK_SERVERS: dict[tuple, _ForkServer] = {}  # in order of last use
# Each holds an imported torch and transformers (about 0.5 GB, measured). Enough for every CPU
# environment of the shipped pins (7 for the 18 pins) and one more: a sweep over the pins that
# evicted one would start it again on every sweep (~12 s each).
MAX_FORK_SERVERS = 8


def _fork_server(python: "CpuPython", request: ProbeRequest) -> _ForkServer | None:
    """The running fork server for this interpreter and import environment, started on first
    use; None where it cannot start (the probes then run in a fresh interpreter)."""
    key = (str(python.python), request.environment())
    server = _FORK_SERVERS.pop(key, None)
    if server is None or not server.alive():
        if server is not None:
            server.close()
        while len(_FORK_SERVERS) >= MAX_FORK_SERVERS:
            _FORK_SERVERS.pop(next(iter(_FORK_SERVERS))).close()
        try:
            server = _ForkServer(python.python, request)
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


def _remember_preload(python: Path, modules: list[str]) -> None:
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


def cpu_python(pin: Pin, index: str | None = None) -> CpuPython:
    """The pin's CPU interpreter, building the base and the pin's overlay on first use."""
    base = _base_env()
    wanted = overlay_requirements(pin, index, _installed_versions(base))
    if not wanted:
        return CpuPython(_python(base))
    return CpuPython(_python(_overlay_env(base, wanted)), overlay=wanted)


def cpu_pythons(pins: list[Pin], jobs: int = 1, index: str | None = None) -> list[CpuPython]:
    """Every pin's CPU interpreter (``cpu_python``), with the distinct overlays built ``jobs``
    at a time: an overlay build is mostly pip waiting on downloads and the disk."""
    from concurrent.futures import ThreadPoolExecutor

    base = _base_env()
    have = _installed_versions(base)
    distinct = {json.dumps(wanted, sort_keys=True): wanted
                for wanted in (overlay_requirements(pin, index, have) for pin in pins) if wanted}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(lambda wanted: _overlay_env(base, wanted), distinct.values()))
    return [cpu_python(pin, index) for pin in pins]


def pin_requirements(pin: Pin, index: str | None = None, only: tuple[str, ...] | None = None) -> list[Requirement]:
    """The pin's own runtime requirements, from its artifact's core metadata (wheel or sdist);
    with ``only``, just those of the packages it names (parsing all of a release's hundred-odd
    requirements for three is most of what a warm run spends on them)."""
    requirements = []
    for line in sources.pin_metadata(pin, index).splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        text = line.partition(":")[2].strip()
        if only is not None and _canonical(re.split(r"[\s;<>=!~(\[]", text, maxsplit=1)[0]) not in only:
            continue
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            requirements.append(requirement)
    return requirements


def overlay_requirements(pin: Pin, index: str | None, base_versions: dict[str, str]) -> dict[str, str]:
    """name -> specifier the pin needs and the base does not satisfy, for ``OVERLAY_PACKAGES``."""
    return _unsatisfied(pin_requirements(pin, index, only=OVERLAY_PACKAGES), base_versions)


def _unsatisfied(requirements, base_versions: dict[str, str]) -> dict[str, str]:
    """name -> specifier of each overlay package whose requirement the base's version does not
    satisfy (the overlay an environment is built with, and named by)."""
    wanted = {}
    for requirement in requirements:
        name = _canonical(requirement.name)
        if name not in OVERLAY_PACKAGES or not str(requirement.specifier):
            continue
        have = base_versions.get(name)
        if have is None or not requirement.specifier.contains(Version(have), prereleases=True):
            wanted[name] = str(requirement.specifier)
    return dict(sorted(wanted.items()))


# -- building -----------------------------------------------------------------------------------


def _base_digest() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes() + BASE_LAYOUT.encode()).hexdigest()[:16]


def _base_path() -> Path:
    return cache.cache_root() / "pyenv" / f"base-{_base_digest()}"


def _base_env() -> Path:
    path = _base_path()

    def build(staging: Path) -> None:
        _make_venv(staging)
        _pip(staging, ["install", "--no-deps", "-r", str(REQUIREMENTS)], "base")

    return _cached_env(path, build)


def _overlay_path(base: Path, wanted: dict[str, str]) -> Path:
    key = json.dumps({"base": base.name, "wanted": wanted}, sort_keys=True)
    return cache.cache_root() / "pyenv" / f"overlay-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _overlay_env(base: Path, wanted: dict[str, str]) -> Path:
    path = _overlay_path(base, wanted)

    def build(staging: Path) -> None:
        _make_venv(staging)
        # The base's packages are importable (and seen by pip as installed) through this .pth;
        # the overlay's own site-packages comes first, so its versions win.
        (_site_packages(staging) / "zz_sglpatch_base.pth").write_text(f"{_site_packages(base)}\n")
        # torch stays the base's: a requirement that asked pip for another torch would pull a
        # multi-GB CUDA build.
        constraints = staging / "constraints.txt"
        constraints.write_text(f"torch=={_installed_versions(base)['torch'].split('+')[0]}\n")
        specs = [f"{name}{spec}" for name, spec in wanted.items()]
        _pip(staging, ["install", "-c", str(constraints), *specs], f"overlay {' '.join(specs)}")

    return _cached_env(path, build)


_FAILED_BUILDS: dict[Path, EnvUnavailable] = {}  # in this process: each tree's probes ask again


def _cached_env(path: Path, build) -> Path:
    """``path`` built by ``build`` once, under its lock; a build that failed in this process is
    not tried again by it (its error is raised again), one that failed in another is."""
    if path in _FAILED_BUILDS:
        raise _FAILED_BUILDS[path]
    marker = path / "sglpatch-complete.json"
    with cache.entry_lock(path):
        if marker.exists() and _python(path).exists():
            return path
        staging = path.with_name(path.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)
        try:
            build(staging)
            # A venv's scripts name their own folder; build in place of the final path instead
            # of renaming would leave a half-built env visible, so venvs are made relocatable
            # by always calling their python by path (``_python``), never their scripts.
            marker_tmp = staging / "sglpatch-complete.json"
            marker_tmp.write_text(json.dumps({"packages": _installed_versions(staging)}, sort_keys=True, indent=1))
            staging.rename(path)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, EnvUnavailable):
                _FAILED_BUILDS[path] = exc
            raise
    return path


def _make_venv(path: Path) -> None:
    # Without pip inside: the builder's pip installs into it with --python, which is faster and
    # needs no network for pip itself.
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)


def _pip(env: Path, args: list[str], what: str) -> None:
    # --no-compile: the probes compile what they import into their content-keyed bytecode cache
    # (probes/bytecode.py); pip's compile of every file was half of the base's install.
    command = [sys.executable, "-m", "pip", "--python", str(_python(env)), *args]
    command += ["--no-compile", "--disable-pip-version-check", "--progress-bar", "off"]
    with progress.step(f"CPU Python for the witnesses: {what}") as shown:
        try:
            done = processes.run_tool_lines(command, f"pip ({what})", PIP_TIMEOUT_S, _pip_progress(shown),
                                            env=processes.pip_env())
        except SglpatchError as exc:
            raise EnvUnavailable(f"CPU witness environment ({what}): {exc}") from None
        if done.returncode != 0:
            tail = "\n".join(done.stdout.strip().splitlines()[-8:])
            raise EnvUnavailable(f"CPU witness environment ({what}): pip failed:\n{tail}")


def _pip_progress(shown):
    """pip's own lines, cut down to which package it is on: a build of several minutes says
    what it is doing instead of nothing."""

    def on_line(line: str) -> None:
        words = line.split()
        if line.startswith("Collecting ") and len(words) > 1:
            shown.update(f"collecting {words[1]}")
        elif line.lstrip().startswith("Downloading ") and len(words) > 1:
            size = " ".join(words[2:]).strip("()")
            shown.update(f"downloading {words[1].rsplit('/', 1)[-1]}" + (f" ({size})" if size else ""))
        elif line.startswith("Processing ") and len(words) > 1:
            shown.update(f"unpacking {words[1].rsplit('/', 1)[-1]}")
        elif line.startswith("Installing collected packages:"):
            count = len(line.split(":", 1)[1].split(","))
            shown.update(f"installing {count} package{'s' if count != 1 else ''}")

    return on_line


def _python(env: Path) -> Path:
    return env / "bin" / "python"


def _site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _installed_versions(env: Path) -> dict[str, str]:
    found = {}
    for dist in importlib_metadata.distributions(path=[str(_site_packages(env))]):
        found[_canonical(dist.metadata["Name"])] = dist.version
    return found


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")
