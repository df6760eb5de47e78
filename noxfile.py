"""nox sessions: thin doors onto the sglpatch library (see README.md).

    nox -s apply                 apply the series to every pin (nox -s apply -- 0.5.14 for one)
    nox -s check                 lint the series and its patches
    nox -s witness               every patch's witness on every pin, pristine and patched
    nox -s upstream -- PATCH     prepare one patch as an upstream pull request
    nox -s rebase -- VERSION     forward-port the series to a new sglang release
    nox -s watch                 rebase onto every release on the index newer than the newest pin
    nox -s tests                 the test suite, in parallel

The test matrix (README "Test matrix"): one session per cell, tagged by the tier that runs it.

    nox -t cpu                   every CPU cell: build(cpu, PIN), load(cpu, PIN), spec(cpu, PIN, D)
    nox -t rocm                  the same checks in patched ROCm containers (docker + AMD GPUs);
                                 they skip, saying why, where there is no engine or no /dev/kfd
    nox -s "spec(cpu, 0.5.14, 5)"  one cell; nox -l lists them all
    nox -s report                the matrix table from the records in build/matrix/records
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from pathlib import Path

import nox

nox.options.sessions = ["check", "apply"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "venv"

ROOT = Path(__file__).parent
PINS = [pin["version"] for pin in tomllib.loads((ROOT / "upstream" / "pins.toml").read_text())["pin"]]


def _hip_toolchain(session: nox.Session) -> None:
    """The pinned HIP toolchain for the rocm-guard witness; without it the witness says it used
    the weaker include-graph check, so a machine that cannot install it still runs everything."""
    try:
        session.run("bash", "ci/install-hip-toolchain.sh", external=True, silent=True)
    except nox.command.CommandFailed:
        session.warn("HIP toolchain not installed: rocm-guard falls back to its include-graph level")


def _cpu_env(session: nox.Session) -> None:
    """The CPU Python of the MTP and flags witnesses, built once up front so a failure is named here;
    without it those witnesses answer "unavailable" with pip's reason."""
    try:
        session.run("sglpatch", "cpu-env", silent=True)
    except nox.command.CommandFailed:
        session.warn("CPU witness environment not built: the MTP and flags witnesses will be unavailable")


def _sglpatch(session: nox.Session, *args: str) -> None:
    """Install sglpatch and the witness toolchains, then run one sglpatch command."""
    session.install("-e", ".")
    _hip_toolchain(session)
    _cpu_env(session)
    session.run("sglpatch", *args, *session.posargs)


@nox.session
def apply(session: nox.Session) -> None:
    """Apply the series to pinned sglang releases; arguments after -- go to `sglpatch apply`."""
    _sglpatch(session, "apply")


@nox.session
def check(session: nox.Session) -> None:
    """Lint patches/: series entries, trailers, status vocabulary, witnesses, renditions, diffs."""
    session.install("-e", ".")
    session.run("sglpatch", "check")


@nox.session
@nox.parametrize("pin", PINS, ids=PINS)
def witness(session: nox.Session, pin: str) -> None:
    """Run each patch's witness on one pin, on the pristine tree and on the patched tree."""
    _sglpatch(session, "witness", pin)


@nox.session
def upstream(session: nox.Session) -> None:
    """Prepare one patch as an upstream PR: `nox -s upstream -- <patch> [--base <pin or ref>]`."""
    _sglpatch(session, "upstream")


@nox.session
def rebase(session: nox.Session) -> None:
    """Forward-port the series to a new sglang release: `nox -s rebase -- 0.5.24`."""
    _sglpatch(session, "rebase")


@nox.session
def watch(session: nox.Session) -> None:
    """Rebase onto every release on the index newer than the newest pin: `nox -s watch -- --open-pr`."""
    _sglpatch(session, "watch")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (pytest with xdist); arguments after -- go to pytest."""
    session.install("-e", ".[test]")
    _hip_toolchain(session)
    _cpu_env(session)
    session.run("pytest", "-n", "auto", *session.posargs)


# -- the test matrix ---------------------------------------------------------------------------
# Every cell is its own session, so CI can fan them out; they share one environment (made once,
# remade when pyproject.toml changes) instead of 96 copies of the same venv.

TIERS = ("cpu", "rocm")
DEPTHS = range(1, 7)
MATRIX_ENV = ROOT / ".nox" / "matrix-env"
_TOOLCHAIN_CHECKED: list[bool] = []


def _matrix_python(session: nox.Session) -> str:
    python = MATRIX_ENV / "bin" / "python"
    stamp = MATRIX_ENV / "sglpatch-installed"
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not python.exists() or not stamp.exists() or stamp.read_text() != wanted:
        session.run(sys.executable, "-m", "venv", "--clear", str(MATRIX_ENV), external=True, silent=True)
        session.run(str(python), "-m", "pip", "install", "--quiet", "-e", ".[rocm]", external=True, silent=True)
        stamp.write_text(wanted)
    return str(python)


def _cell(session: nox.Session, tier: str, check: str, pin: str, depth: int | None = None) -> None:
    """Run one matrix cell; a cell that cannot run here is reported as a nox skip with its reason."""
    python = _matrix_python(session)
    if tier == "cpu" and not _TOOLCHAIN_CHECKED:
        # Once per nox run (sessions share this process): the script's own check costs seconds.
        _hip_toolchain(session)
        _TOOLCHAIN_CHECKED.append(True)
    name = f"{tier}-{check}-{pin}" + (f"-d{depth}" if depth is not None else "")
    record = ROOT / ".nox" / "matrix-sessions" / f"{name}.json"
    record.unlink(missing_ok=True)
    args = ["-m", "sglpatch", "matrix", "run", check, pin, "--tier", tier, "--record", str(record)]
    if depth is not None:
        args += ["--depth", str(depth)]
    session.run(python, *args, *session.posargs, external=True)
    outcome = json.loads(record.read_text())
    if outcome["outcome"] == "skipped":
        session.skip(outcome["reason"])


def _cells(depths: bool = False) -> list:
    return [
        nox.param(tier, pin, *((depth,) if depths else ()), id=", ".join([tier, pin, *([str(depth)] if depths else [])]), tags=[tier])
        for tier in TIERS
        for pin in PINS
        for depth in (DEPTHS if depths else [None])
    ]


@nox.session(venv_backend="none", default=False)
@nox.parametrize(["tier", "pin"], _cells())
def build(session: nox.Session, tier: str, pin: str) -> None:
    """Matrix: the JIT kernels the series touches build for ROCm (cpu: HIP compile + import smoke; rocm: in the image)."""
    _cell(session, tier, "build", pin)


@nox.session(venv_backend="none", default=False)
@nox.parametrize(["tier", "pin"], _cells())
def load(session: nox.Session, tier: str, pin: str) -> None:
    """Matrix: the model loads with its MTP head (cpu: quantization resolved per MTP module; rocm: server + generate)."""
    _cell(session, tier, "load", pin)


@nox.session(venv_backend="none", default=False)
@nox.parametrize(["tier", "pin", "depth"], _cells(depths=True))
def spec(session: nox.Session, tier: str, pin: str, depth: int) -> None:
    """Matrix: the profile at EAGLE depth d (d steps, top-k 1, d+1 drafts) is accepted (cpu) and serves well (rocm)."""
    _cell(session, tier, "spec", pin, depth)


@nox.session(venv_backend="none")
def report(session: nox.Session) -> None:
    """Render the matrix table (markdown) from the cell records; -- --records DIR for CI artifacts."""
    session.run(_matrix_python(session), "-m", "sglpatch", "matrix", "report", *session.posargs, external=True)
