"""Running the witnesses' probes in a pin's CPU Python (built by ``sglpatch.witnesses.cpu_envs``).

``cpu_python(pin)`` is the pin's interpreter, its environment built on first use.
``CpuPython.run_probes`` runs several probes (``ProbeRequest``) on one tree in one child process
(``witnesses/probes/runner.py``, started by ``sglpatch.witnesses.probe_children``), so the tree's sglang is
imported once for all of them, and answers with a ``ProbeRun``. A run in which every probe
answered can be remembered under a digest of all it depends on (``probe_run_key``) and given
back to the next asker of the same, not run again.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.plumbing import cache
from sglpatch.sources.pins import Pin
from sglpatch.witnesses import cpu_envs, probe_children


@dataclass(frozen=True)
class ProbeRequest:
    """One probe for ``CpuPython.run_probes``: ``module`` (in the probes folder) gets ``spec``.

    Probes that share a process must agree on ``import_env`` (the environment sglang is
    imported under) and ``arch`` (the emulated GPU); ``registry_archs`` are the architectures
    the probe asks sglang's model registry for. Probes with a ``group`` run in a child of their
    own, apart from those of another group (the same fork server starts it), so that no other
    probe's changes to sglang's state reach them."""

    name: str
    module: str
    spec: dict
    limit_s: float
    import_env: tuple[tuple[str, str], ...] = ()
    arch: str = "gfx950:sramecc+:xnack-"
    registry_archs: tuple[str, ...] = ()
    group: str = ""

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
        child_env = probe_children.child_env(tree)
        child_env.update(env or {})
        command = [str(self.python), *args]
        process = subprocess.Popen(command, env=child_env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stdout, stderr = probe_children.kill_session(process)
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
                "bytecode_cache": str(probe_children.bytecode_cache_dir(self.python)),
                "probes": [{"name": p.name, "module": p.module, "limit_s": p.limit_s, "spec": p.spec} for p in probes],
            }
            (Path(work) / "spec.json").write_text(json.dumps(spec))
            error = None
            forking = os.environ.get(probe_children.FORK_SERVER_ENV, "1") != "0"
            server = probe_children.fork_server(self.python, first.import_env, first.arch) if forking else None
            try:
                if server is not None:
                    code, tail = server.run(Path(work) / "spec.json", out, limit)
                else:
                    code, tail = self._run_child([str(probe_children.RUNNER), str(Path(work) / "spec.json"), str(out)], tree,
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
                probe_children.remember_preload(self.python, runner.pop("third_party"))
            if server is not None:
                runner["fork_server"] = server.started
        return ProbeRun(answers, runner, error, round(time.monotonic() - started, 2))

    def _run_child(self, args: list[str], tree: Path, cwd: Path, timeout: float) -> tuple[int, str]:
        """Run the child in its own session, so a timeout kills it and what it started."""
        child_env = probe_children.child_env(tree)
        process = subprocess.Popen([str(self.python), *args], env=child_env, cwd=cwd, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            probe_children.kill_session(process)
            raise
        tail = " | ".join(line for line in (output or "").strip().splitlines()[-6:])
        return process.returncode, tail[-800:]


IMPORT_ALLOWANCE_S = 300  # preparing the box and importing sglang, on a loaded machine
PROBE_RUNS = cache.Memo("probe-runs")  # by ``probe_run_key``
PROBE_RUN_LAYOUT = "3"  # bump when what ``probe_run_key`` digests changes


def probe_run_key(python: CpuPython, tree: Path, probes: list[ProbeRequest]) -> str | None:
    """A digest of what a probe run answers from: the tree's ``python/`` files by name and
    content, the environment's interpreter and installed packages (its own and its base's), the
    probes' code and this module's (``code_digest``), and each request, with every path its spec
    names by the content of what is there. None where the environment cannot be told (an
    interpreter sglpatch did not build): such a run is not remembered."""
    env = Path(python.python).parent.parent
    described = []
    for folder in (env, *cpu_envs.base_of(env)):
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
                   "registry_archs": probe.registry_archs, "group": probe.group, "spec": _by_content(probe.spec)}
        digest.update(json.dumps(request, sort_keys=True).encode() + b"\0")
    return digest.hexdigest()[:32]


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


def _last_phase(out: Path) -> str:
    """The phase the runner said it started last (``runner.py`` appends one line per phase)."""
    try:
        lines = (out / "progress").read_text().strip().splitlines()
    except OSError:
        return "starting the interpreter"
    return lines[-1].split(" ", 1)[-1] if lines else "starting the interpreter"


def code_digest(paths: list[Path]) -> str:
    """A digest of the named files, of this module and ``probe_children`` (how the child is
    started) and of every file of the probes folder (the child side), by name and content (not by
    where the checkout is)."""
    digest = hashlib.sha256()
    probes = probe_children.PROBES
    files = [(f"probes/{p.relative_to(probes)}", p) for p in sorted(probes.rglob("*.py"))]
    files += sorted((path.name, path) for path in {*paths, Path(__file__), Path(probe_children.__file__)})
    for name, path in files:
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def cpu_python(pin: Pin, index: str | None = None) -> CpuPython:
    """The pin's CPU interpreter, building the base and the pin's overlay on first use."""
    base = cpu_envs.base_env()
    wanted = cpu_envs.overlay_requirements(pin, index, cpu_envs.installed_versions(base))
    if not wanted:
        return CpuPython(cpu_envs.venv_python(base))
    return CpuPython(cpu_envs.venv_python(cpu_envs.overlay_env(base, wanted)), overlay=wanted)


def cpu_pythons(pins: list[Pin], jobs: int = 1, index: str | None = None) -> list[CpuPython]:
    """Every pin's CPU interpreter (``cpu_python``), with the distinct overlays built ``jobs``
    at a time: an overlay build is mostly pip waiting on downloads and the disk."""
    from concurrent.futures import ThreadPoolExecutor

    base = cpu_envs.base_env()
    have = cpu_envs.installed_versions(base)
    distinct = {json.dumps(wanted, sort_keys=True): wanted
                for wanted in (cpu_envs.overlay_requirements(pin, index, have) for pin in pins) if wanted}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(lambda wanted: cpu_envs.overlay_env(base, wanted), distinct.values()))
    return [cpu_python(pin, index) for pin in pins]

