"""nox sessions: thin doors onto the sglpatch library (see README.md).

    nox -s apply                 apply the series to every pin (nox -s apply -- 0.5.14 for one)
    nox -s check                 lint the series and its patches
    nox -s tests                 the test suite, in parallel
"""

from __future__ import annotations

import nox

nox.options.sessions = ["check", "apply"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "venv"


@nox.session
def apply(session: nox.Session) -> None:
    """Apply the series to pinned sglang releases; arguments after -- go to `sglpatch apply`."""
    session.install("-e", ".")
    session.run("sglpatch", "apply", *session.posargs)


@nox.session
def check(session: nox.Session) -> None:
    """Lint patches/: series entries, trailers, status vocabulary, renditions, diffs."""
    session.install("-e", ".")
    session.run("sglpatch", "check")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (pytest with xdist); arguments after -- go to pytest."""
    session.install("-e", ".[test]")
    session.run("pytest", "-n", "auto", *session.posargs)
