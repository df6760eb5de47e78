"""The nox sessions as nox users expect them: a run installs only what it needs, the matrix shares
nox's own environment (so -R and --no-install work), and nox -l survives bad input (test_bad_input)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT
from sglpatch import cli
from sglpatch.commands.cpu_env import witness_needs


@pytest.fixture(scope="session")
def noxfile():
    """The noxfile, loaded once per test process: loading it registers its sessions with nox, and
    a second registration of a name is a warning (an error in nox to come). Module scope reloaded
    it whenever xdist's work stealing ran another module's test between two of these."""
    spec = importlib.util.spec_from_file_location("sglpatch_noxfile", REPO_ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Session:
    """A stand-in for nox.Session that records what a session would install and run; asked what a
    run needs (``sglpatch cpu-env --needs --for``), it answers with sglpatch's own reading."""

    def __init__(self, posargs):
        self.posargs, self.calls = posargs, []

    def install(self, *args):
        self.calls.append(("install", *args))

    def run(self, *args, **kwargs):
        if args[:4] == ("sglpatch", "cpu-env", "--needs", "--for"):
            return json.dumps(witness_needs(list(args[4:]))) + "\n"
        self.calls.append(("run", *args))

    def warn(self, message):
        self.calls.append(("warn", message))

    def log(self, message):
        self.calls.append(("log", message))

    def ran(self):
        return [" ".join(call[1:3]) for call in self.calls if call[0] == "run"]


def _answering_needs(session, run):
    """``run`` for every command but the question what a run needs, which the stand-in answers."""
    answer = session.run
    return lambda *args, **kwargs: answer(*args) if args[:2] == ("sglpatch", "cpu-env") else run(*args, **kwargs)


@pytest.fixture(autouse=True)
def no_real_toolchain_install(noxfile, monkeypatch):
    """The sessions' toolchain and background CPU Python steps are recorded as calls, never run,
    unless a test says otherwise."""
    monkeypatch.setattr(noxfile, "_start_hip_toolchain", _started_toolchain)
    monkeypatch.setattr(noxfile, "_start_cpu_env", lambda session, pins=None: _started_cpu_env(noxfile, session, pins))


class _Finished:
    def __init__(self, status=0, seen=None, what=""):
        self.status, self.seen, self.what = status, seen if seen is not None else [], what

    def wait(self):
        self.seen.append(f"{self.what} waited for")
        return self.status

    def terminate(self):
        self.seen.append(f"{self.what} stopped")


def _started_toolchain(session):
    session.calls.append(("run", "bash", "ci/install-hip-toolchain.sh"))
    return _Finished()


def _started_cpu_env(noxfile, session, pins):
    session.calls.append(("run", *noxfile._cpu_env_command(pins)))
    return _Finished(), "cpu-env.log"


@pytest.mark.parametrize(
    "posargs, expected",
    [
        ([], ["bash ci/install-hip-toolchain.sh", "sglpatch cpu-env", "sglpatch apply"]),
        (["0.5.14"], ["bash ci/install-hip-toolchain.sh", "sglpatch cpu-env", "sglpatch apply"]),
        (["0.5.14", "--no-witnesses"], ["sglpatch apply"]),
        (["--no-witnesses"], ["sglpatch apply"]),
    ],
)
def test_apply_installs_only_what_the_run_needs(noxfile, posargs, expected):
    session = _Session(posargs)
    noxfile._sglpatch(session, "apply")
    assert session.ran() == expected
    cpu_env = [call for call in session.calls if call[:3] == ("run", "sglpatch", "cpu-env")]
    if cpu_env:
        assert list(cpu_env[0][3:]) == [arg for arg in posargs if not arg.startswith("-")]


def test_commands_without_witnesses_install_no_toolchain(noxfile):
    session = _Session([])
    noxfile._sglpatch(session, "check")
    assert session.ran() == ["sglpatch check"]


class _InstallOnly(_Session):
    """``nox --install-only``: a session's ``run`` runs nothing and gives back None (nox's own
    behaviour), so not even the question what a run needs is answered."""

    def run(self, *args, **kwargs):
        self.calls.append(("skipped", *args))


@pytest.mark.parametrize("command, posargs", [("rehearse", ["--oldest-and-newest"]), ("apply", [])])
def test_install_only_makes_the_sessions_environment_and_runs_nothing(noxfile, command, posargs):
    # .ci/run makes the rehearsal's environment first, so that it can run beside the CPU tier.
    session = _InstallOnly(posargs)
    noxfile._sglpatch(session, command)
    assert session.calls[0] == ("install", "-e", ".") and session.ran() == []


def test_every_matrix_and_bench_session_runs_in_noxs_own_shared_environment(noxfile):
    import nox.registry

    sessions = nox.registry.get()
    for name in ("build", "load", "spec", "cpu-tier"):
        assert sessions[name].requires == ["matrix-env", "hip-toolchain"], name  # once per nox run
    for name in ("report", "bench", "accuracy", "tune-moe", "bench-report"):
        assert sessions[name].requires == ["matrix-env"], name
    for name in ("build", "load", "spec", "cpu-tier", "report", "bench", "accuracy", "tune-moe", "bench-report"):
        assert sessions[name].venv_backend == "none", name
    assert sessions["matrix-env"].venv_backend is None  # nox's default backend: a real venv nox manages


def test_the_toolchain_installs_while_the_cpu_python_is_built_and_a_failure_is_named(noxfile, monkeypatch):
    order = []

    class Running:
        def wait(self):
            order.append("toolchain waited for")
            return 3

    monkeypatch.setattr(noxfile, "_start_hip_toolchain", lambda session: order.append("toolchain started") or Running())
    monkeypatch.setattr(noxfile, "_cpu_env", lambda session, pins=None: order.append("cpu-env"))
    session = _Session([])
    noxfile._witness_tools(session)
    assert order == ["toolchain started", "cpu-env", "toolchain waited for"]
    assert session.calls == [("warn", "HIP toolchain not installed (exit 3): rocm-guard falls back to its include-graph level")]


def test_apply_runs_beside_the_cpu_python_build_once_the_toolchain_is_there(noxfile, monkeypatch):
    seen = []
    monkeypatch.setattr(noxfile, "_start_hip_toolchain", lambda session: seen.append("toolchain started") or _Finished(0, seen, "toolchain"))
    monkeypatch.setattr(noxfile, "_start_cpu_env", lambda session, pins=None: (seen.append("cpu-env started") or _Finished(2, seen, "cpu-env"), "cpu-env.log"))
    session = _Session([])
    session.run = _answering_needs(session, lambda *args: seen.append(" ".join(args[:2])))
    noxfile._sglpatch(session, "apply")
    assert seen == ["toolchain started", "cpu-env started", "toolchain waited for", "sglpatch apply", "cpu-env waited for"]
    assert session.calls[-1] == ("warn", f"{noxfile.CPU_ENV_MISSING} (see cpu-env.log)")


def test_a_failed_apply_stops_the_cpu_python_build_beside_it(noxfile, monkeypatch):
    seen = []
    monkeypatch.setattr(noxfile, "_start_cpu_env", lambda session, pins=None: (_Finished(0, seen, "cpu-env"), "cpu-env.log"))
    session = _Session([])

    def fails(*args, **kwargs):
        raise RuntimeError("apply failed")

    session.run = _answering_needs(session, fails)
    with pytest.raises(RuntimeError):
        noxfile._sglpatch(session, "apply")
    assert seen == ["cpu-env stopped", "cpu-env waited for"]


@pytest.mark.parametrize("command", ["apply", "witness", "matrix run-all", "cpu-env"])
def test_sglpatch_takes_a_pin_per_core_unless_told_and_nox_passes_no_jobs(noxfile, command, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    verb = command.split()
    assert cli.parser().parse_args([*verb, "0.5.14"]).jobs == 4  # at most 4
    assert cli.parser().parse_args([*verb, "--jobs=1", "0.5.14"]).jobs == 1
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert cli.parser().parse_args([*verb, "0.5.14"]).jobs == 1
    if command in ("apply", "witness"):
        session = _Session(["0.5.14"])
        noxfile._sglpatch(session, command)
        assert session.calls[-1] == ("run", "sglpatch", command, "0.5.14")


def test_apply_into_a_checkout_builds_no_witness_environment(noxfile):
    session = _Session(["--into", "/sgl-workspace/sglang"])
    noxfile._sglpatch(session, "apply")
    assert session.ran() == ["sglpatch apply"]
    assert session.calls[-1] == ("run", "sglpatch", "apply", "--into", "/sgl-workspace/sglang")
    session = _Session(["--into", "/sgl-workspace/sglang", "--witness"])
    noxfile._sglpatch(session, "apply")
    assert session.ran() == ["bash ci/install-hip-toolchain.sh", "sglpatch cpu-env", "sglpatch apply"]


_ONLY_NOX = r'''
import importlib.abc, importlib.metadata, importlib.util, re, sys

def requirements(dist, seen):
    for line in importlib.metadata.requires(dist) or []:
        if "extra ==" in line:
            continue
        name = re.split(r"[\s<>=!;\[(~]", line, maxsplit=1)[0].lower().replace("_", "-")
        if name and name not in seen:
            seen.add(name)
            try:
                requirements(name, seen)
            except importlib.metadata.PackageNotFoundError:
                pass
    return seen

noxs = requirements("nox", {"nox"})
allowed = {module for module, dists in importlib.metadata.packages_distributions().items()
           if any(d.lower().replace("_", "-") in noxs for d in dists)}
allowed |= set(sys.stdlib_module_names) | {"sglpatch", "_distutils_hack"}

class OnlyNoxsOwn(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in allowed:
            raise ModuleNotFoundError(f"{name} is not in nox's own Python")
        return None

sys.meta_path.insert(0, OnlyNoxsOwn())
spec = importlib.util.spec_from_file_location("noxfile", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(len(module.PINS))
'''


def test_the_noxfile_loads_in_noxs_own_python_with_sglpatchs_dependencies_missing():
    """nox imports the noxfile in its own Python (pipx's, CI's), where sglpatch's dependencies are
    not installed; the pins it reads at load time must need nothing of them."""
    loaded = subprocess.run([sys.executable, "-c", _ONLY_NOX, str(REPO_ROOT / "noxfile.py")], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert int(loaded.stdout.split()[-1]) >= 18


_REBASE_REFUSAL = _ONLY_NOX.rsplit("print(len(module.PINS))", 1)[0] + r'''
class Session:
    """nox's session as the rebase session uses it before it builds anything."""
    def __init__(self, posargs):
        self.posargs = posargs
    def error(self, message):
        print(f"REFUSED {message}")
        raise SystemExit(0)
    def log(self, message):
        print(f"LOG {message}")
    def __getattr__(self, name):
        raise AssertionError(f"session.{name} before the refusal was asked")

module._refuse_before_building(Session(sys.argv[2:]))
print("GOES ON")
'''


@pytest.mark.parametrize("posargs, says", [
    (["banana"], "REFUSED sglpatch rebase: 'banana' is not a version"),
    (["0.5.9"], "REFUSED sglpatch rebase: sglang 0.5.9 is older than every pin (the oldest is 0.5.10)"),
    (["0.5.11", "--dry-run"], "REFUSED sglpatch rebase: " + str(REPO_ROOT / "upstream" / "pins.toml") + ": 0.5.11 is already pinned"),
    (["0.5.99"], "REFUSED sglpatch rebase: sglang 0.5.99 is not on the package index"),
    (["0.5.24"], "GOES ON"),
    (["0.5.9", "--backwards"], "GOES ON"),
    (["--dry-run"], "GOES ON"),  # no version: the command itself says so, after nox installs it
])
def test_nox_rebase_refuses_in_noxs_own_python_before_it_installs_or_builds_anything(posargs, says, tmp_path):
    """What `sglpatch rebase` refuses before it starts is asked in nox's own Python (none of
    sglpatch's dependencies, only nox's), before the session installs sglpatch or the toolchain."""
    index = tmp_path / "index"  # the package index: a folder holding 0.5.9 and 0.5.24 (names are what is read)
    index.mkdir()
    for name in ("sglang-0.5.24-cp311-cp311-manylinux_2_34_x86_64.whl", "sglang-0.5.9.tar.gz"):
        (index / name).write_bytes(b"")
    env = {**os.environ, "SGLPATCH_INDEX_URL": str(index)}
    done = subprocess.run([sys.executable, "-c", _REBASE_REFUSAL, str(REPO_ROOT / "noxfile.py"), *posargs], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1].startswith(says), done.stdout
