"""nox sessions: thin doors onto the sglpatch library (see README.md).

    nox -s apply                 apply the series to every pin (nox -s apply -- 0.5.14 for one)
    nox -s check                 lint the series and its patches
    nox -s witness               every patch's witness on every pin, pristine and patched
    nox -s upstream -- PATCH     prepare one patch as an upstream pull request
    nox -s rebase -- VERSION     forward-port the series to a new sglang release
    nox -s tests                 the test suite, in parallel
"""

from __future__ import annotations

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
def tests(session: nox.Session) -> None:
    """The test suite (pytest with xdist); arguments after -- go to pytest."""
    session.install("-e", ".[test]")
    _hip_toolchain(session)
    _cpu_env(session)
    session.run("pytest", "-n", "auto", *session.posargs)
