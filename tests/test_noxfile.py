"""The nox sessions as nox users expect them: a run installs only what it needs, the matrix shares
nox's own environment (so -R and --no-install work), and nox -l survives bad input (test_bad_input)."""

from __future__ import annotations

import importlib.util

import pytest

from conftest import REPO_ROOT


@pytest.fixture(scope="module")
def noxfile():
    spec = importlib.util.spec_from_file_location("sglpatch_noxfile", REPO_ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Session:
    """A stand-in for nox.Session that records what a session would install and run."""

    def __init__(self, posargs):
        self.posargs, self.calls = posargs, []

    def install(self, *args):
        self.calls.append(("install", *args))

    def run(self, *args, **kwargs):
        self.calls.append(("run", *args))

    def warn(self, message):
        self.calls.append(("warn", message))

    def ran(self):
        return [" ".join(call[1:3]) for call in self.calls if call[0] == "run"]


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


def test_every_matrix_and_bench_session_runs_in_noxs_own_shared_environment(noxfile):
    import nox.registry

    sessions = nox.registry.get()
    for name in ("build", "load", "spec", "cpu-tier", "report", "bench", "accuracy", "tune-moe", "bench-report"):
        assert sessions[name].requires == ["matrix-env"], name
        assert sessions[name].venv_backend == "none", name
    assert sessions["matrix-env"].venv_backend is None  # nox's default backend: a real venv nox manages
