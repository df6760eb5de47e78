"""nox sessions: thin doors onto the sglpatch library (see README.md and the manual, docs/).

    nox -s apply                 apply the series to every pin (nox -s apply -- 0.5.14 for one)
    nox -s check                 lint the series and its patches, judge their tests where written
    nox -s witness               every patch's witness on every pin, pristine and patched
    nox -s upstream -- PATCH     prepare one patch as an upstream pull request
    nox -s rebase -- VERSION     rebase the series onto a new sglang release
    nox -s watch                 rebase onto every release on the index newer than the newest pin
    nox -s tests                 the test suite, in parallel
    nox -s rehearse -- PIN       the ROCm job's checks against the pin's real sglang server on CPU
    nox -s docs                  the manual (MkDocs + Material), strictly: into build/site

The test matrix (docs/ci.md): one session per cell, tagged by the tier that runs it.

    nox -t cpu                   every CPU cell: build(cpu, PIN), load(cpu, PIN), spec(cpu, PIN, D)
    nox -s cpu-tier              the same cells in one run, a pin per core at a time (what CI runs)
    nox -t rocm                  the same checks in patched ROCm containers (docker + AMD GPUs);
                                 they skip, saying why, where there is no engine or no /dev/kfd
    nox -s "spec(cpu, 0.5.14, 5)"  one cell; nox -l lists them all
    nox -s "rocm-job(0.5.23)" -- --event nightly   a pin's ROCm CI job: the image built once, one
                                 server per launch configuration shared by the checks that launch it
    nox -s report                the matrix table from the records in build/matrix/records

The bench (docs/bench.md), on ROCm nodes: tagged rocm and bench, skipping here with the reason.

    nox -t bench                 bench(rocm, PIN, serving|single-stream) and accuracy(rocm, PIN)
    nox -s "bench(rocm, 0.5.23, serving)"   the write-up's sweep: table with tok/s/W, and the plot
    nox -s "tune-moe(rocm, 0.5.23)"         aiter's MoE tuner for the shapes found untuned
    nox -s bench-report          the bench table and plots from build/bench/records
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import nox

nox.options.sessions = ["check", "apply"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "venv"

ROOT = Path(__file__).parent


def _pinned_versions() -> list[str]:
    """The pins, read with sglpatch's own checks; a bad pins.toml is named on one line and the
    sessions that do not take a pin are still listed (nox -l must never fail on it)."""
    sys.path.insert(0, str(ROOT))
    try:
        from sglpatch.plumbing.errors import SglpatchError
        from sglpatch.sources.pins import load_pins

        try:
            return [pin.version for pin in load_pins(ROOT / "upstream" / "pins.toml").pins]
        except SglpatchError as exc:
            print(f"noxfile: {exc}; the per-pin sessions are left out", file=sys.stderr)
            return []
    finally:
        sys.path.remove(str(ROOT))


PINS = _pinned_versions()


TOOLCHAIN_SCRIPT = ["bash", "ci/install-hip-toolchain.sh"]
TOOLCHAIN_MISSING = "HIP toolchain not installed{how}: rocm-guard falls back to its include-graph level"


def _hip_toolchain(session: nox.Session) -> None:
    """The pinned HIP toolchain for the rocm-guard witness; where it cannot be installed the
    witness says which weaker level it used, and a required check fails rather than passes."""
    try:
        session.run(*TOOLCHAIN_SCRIPT, external=True)
    except nox.command.CommandFailed:
        session.warn(TOOLCHAIN_MISSING.format(how=""))


def _start_hip_toolchain(session: nox.Session) -> subprocess.Popen:
    session.log(f"{' '.join(TOOLCHAIN_SCRIPT)} (beside the CPU Python)")
    return subprocess.Popen(TOOLCHAIN_SCRIPT, cwd=ROOT)


def _witness_tools(session: nox.Session, pins: list[str] | None = None) -> None:
    """The HIP toolchain and the CPU Python, side by side, both ready before the tests: one is
    mostly fetching and unpacking .debs, the other pip, and on a fresh machine each takes minutes.
    Each says what failed, as when run alone."""
    toolchain = _start_hip_toolchain(session)
    try:
        _cpu_env(session, pins)
    finally:
        _toolchain_ready(session, toolchain)


@contextlib.contextmanager
def _witness_tools_beside_the_run(session: nox.Session, pins: list[str] | None = None):
    """For a command that runs the witnesses (apply, witness, rebase, upstream): the toolchain
    before it (the compile witness looks for it when it runs), and the CPU Python built beside the
    toolchain and then beside the command itself. The command's workers compile meanwhile and wait
    for an environment (its lock in the cache) only when a probe needs it, so on a fresh machine
    the minutes pip takes are not minutes the cores stand idle. A failure is named, as when run
    alone, and the witnesses that needed the environment answer "unavailable" with pip's reason."""
    toolchain = _start_hip_toolchain(session)
    cpu_env, log = _start_cpu_env(session, pins)
    try:
        _toolchain_ready(session, toolchain)
        yield
    except BaseException:
        cpu_env.terminate()
        raise
    finally:
        if cpu_env.wait() != 0:
            session.warn(f"{CPU_ENV_MISSING} (see {log})")


def _toolchain_ready(session: nox.Session, toolchain: subprocess.Popen) -> None:
    status = toolchain.wait()
    if status != 0:
        session.warn(TOOLCHAIN_MISSING.format(how=f" (exit {status})"))


CPU_ENV_MISSING = "CPU witness environment not built: the MTP and flags witnesses will be unavailable"


def _cpu_env_command(pins: list[str] | None) -> list[str]:
    return ["sglpatch", "cpu-env", *(pins or [])]


def _cpu_env(session: nox.Session, pins: list[str] | None = None) -> None:
    """The CPU Python of the MTP and flags witnesses for ``pins`` (all by default), built up front
    so a failure is named here; without it those witnesses answer "unavailable" with pip's reason."""
    try:
        session.run(*_cpu_env_command(pins))
    except nox.command.CommandFailed:
        session.warn(CPU_ENV_MISSING)


def _start_cpu_env(session: nox.Session, pins: list[str] | None = None) -> tuple[subprocess.Popen, Path]:
    """``_cpu_env`` as a process of its own, its lines in a log (two live displays on one
    terminal would garble each other)."""
    log = Path(session.create_tmp()) / "cpu-env.log"
    command = _cpu_env_command(pins)
    session.log(f"{' '.join(command)} (beside the run; its log: {log})")
    with log.open("w") as out:
        process = subprocess.Popen([str(Path(session.bin) / command[0]), *command[1:]], cwd=ROOT,
                                   stdout=out, stderr=subprocess.STDOUT)
    return process, log


def _witness_needs(session: nox.Session, command: list[str]) -> dict:
    """Whether ``sglpatch COMMAND`` runs witnesses and for which pins, as sglpatch reads its own
    arguments (``cpu-env --needs --for``), so a run for one pin, or one without witnesses,
    installs only what it uses."""
    answer = session.run("sglpatch", "cpu-env", "--needs", "--for", *command, silent=True)
    if answer is None:  # nox --install-only runs no command: there is no run to prepare tools for
        return {"witnesses": False, "pins": None}
    return json.loads(answer.strip().splitlines()[-1])


def _sglpatch(session: nox.Session, *args: str) -> None:
    """Install sglpatch and the witness toolchains the run needs, then run one sglpatch command."""
    session.install("-e", ".")
    command = [*args, *session.posargs]
    needs = _witness_needs(session, command)
    with _witness_tools_beside_the_run(session, needs["pins"]) if needs["witnesses"] else contextlib.nullcontext():
        session.run("sglpatch", *command)


@nox.session
def apply(session: nox.Session) -> None:
    """Apply the series to pinned sglang releases; arguments after -- go to `sglpatch apply`."""
    _sglpatch(session, "apply")


@nox.session
def check(session: nox.Session) -> None:
    """Lint patches/: series entries, trailers, status vocabulary, witnesses, renditions, diffs; then
    judge each patch's regression tests on the release its fix was written for."""
    _sglpatch(session, "check")


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
    _refuse_before_building(session)
    _sglpatch(session, "rebase")


def _refuse_before_building(session: nox.Session) -> None:
    """What `sglpatch rebase` refuses before it starts (not a version, pinned already, older than
    every pin, not on the index), asked here in nox's own Python before sglpatch is installed and
    the witnesses' toolchain built: a refusal costs a second, not the 40 s of building first. A
    Python without what the question needs (an index that serves only HTML pages needs
    pypi-simple) leaves it to the command itself."""
    sys.path.insert(0, str(ROOT))
    try:
        from sglpatch.commands.rebase import refusal

        reason = refusal(ROOT, session.posargs)
    except ImportError as exc:
        session.log(f"the release is looked up after sglpatch is installed ({exc})")
        return
    finally:
        sys.path.remove(str(ROOT))
    if reason:
        session.error(f"sglpatch rebase: {reason}")


@nox.session
def watch(session: nox.Session) -> None:
    """Rebase onto every release on the index newer than the newest pin: `nox -s watch -- --open-pr`."""
    _sglpatch(session, "watch")


@nox.session(default=False)
def rehearse(session: nox.Session) -> None:
    """The ROCm job's in-image checks against each named pin's real sglang server on CPU, one
    server per pin, and the table of what ran: `nox -s rehearse -- 0.5.23` (docs/rehearsal.md)."""
    if not session.posargs:
        session.error("name the pins to rehearse: nox -s rehearse -- 0.5.23 (or -- --oldest-and-newest)")
    _sglpatch(session, "rehearse")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (pytest with xdist); arguments after -- go to pytest."""
    session.install("-e", ".[test]")
    _witness_tools(session)
    # worksteal: the slow real-pin tests sit together in the order; idle workers take them over.
    session.run("pytest", "-n", "auto", "--dist", "worksteal", *session.posargs)


@nox.session(default=False)
def docs(session: nox.Session) -> None:
    """Build the manual into build/site (mkdocs build --strict: a broken link or anchor, or a page
    the nav leaves out, fails it); the command reference is generated from sglpatch's own parser."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", *session.posargs)


# -- the test matrix ---------------------------------------------------------------------------
# Every cell is its own session, so CI can fan them out; they share one environment, nox's own
# matrix-env session, which each requires (so -R and --no-install work as nox users expect),
# instead of one copy of the same venv per cell.

TIERS = ("cpu", "rocm")
DEPTHS = range(1, 7)
MATRIX_ENV = "matrix-env"


@nox.session(name=MATRIX_ENV, default=False)
def matrix_env(session: nox.Session) -> None:
    """The one environment the matrix, bench and report sessions run in (nox -R reuses it as is)."""
    session.install("-e", ".[rocm,bench]")


@nox.session(name="hip-toolchain", venv_backend="none", default=False)
def hip_toolchain(session: nox.Session) -> None:
    """The pinned HIP toolchain of the rocm-guard witness; the cells that compile require it, so
    nox installs or checks it once per run (the script's own check costs seconds)."""
    _hip_toolchain(session)


def _matrix_python(session: nox.Session) -> str:
    """The matrix-env session's Python: that session's folder beside this one's, as nox names
    them (this session requires it, so it exists, or nox said why not)."""
    python = session.env_dir.parent / MATRIX_ENV / "bin" / "python"
    if not python.exists():
        session.error(f"{python} is missing: the {MATRIX_ENV} session did not run (this session requires it)")
    return str(python)


def _cell(session: nox.Session, tier: str, check: str, pin: str, depth: int | None = None) -> None:
    """Run one matrix cell; a cell that cannot run here is reported as a nox skip with its reason."""
    python = _matrix_python(session)
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


@nox.session(venv_backend="none", default=False, requires=[MATRIX_ENV, "hip-toolchain"])
@nox.parametrize(["tier", "pin"], _cells())
def build(session: nox.Session, tier: str, pin: str) -> None:
    """Matrix: the JIT kernels the series touches build for ROCm (cpu: HIP compile + import smoke; rocm: in the image)."""
    _cell(session, tier, "build", pin)


@nox.session(venv_backend="none", default=False, requires=[MATRIX_ENV, "hip-toolchain"])
@nox.parametrize(["tier", "pin"], _cells())
def load(session: nox.Session, tier: str, pin: str) -> None:
    """Matrix: the model loads with its MTP head (cpu: quantization resolved per MTP module; rocm: server + generate)."""
    _cell(session, tier, "load", pin)


@nox.session(venv_backend="none", default=False, requires=[MATRIX_ENV, "hip-toolchain"])
@nox.parametrize(["tier", "pin", "depth"], _cells(depths=True))
def spec(session: nox.Session, tier: str, pin: str, depth: int) -> None:
    """Matrix: the profile at EAGLE depth d (d steps, top-k 1, d+1 drafts) is accepted (cpu) and serves well (rocm)."""
    _cell(session, tier, "spec", pin, depth)


@nox.session(name="rocm-job", venv_backend="none", default=False, requires=[MATRIX_ENV])
@nox.parametrize("pin", [nox.param(pin, id=pin, tags=["rocm-job"]) for pin in PINS])
def rocm_job(session: nox.Session, pin: str) -> None:
    """ROCm CI job of one pin: image built once, one server per launch configuration shared by its checks; -- --event pr|nightly|weekly."""
    python = _matrix_python(session)
    record = ROOT / ".nox" / "matrix-sessions" / f"rocm-job-{pin}.json"
    record.unlink(missing_ok=True)
    session.run(python, "-m", "sglpatch", "matrix", "job", pin, "--record", str(record), *session.posargs, external=True)
    outcome = json.loads(record.read_text())
    if outcome["outcome"] == "skipped":
        session.skip(outcome["reason"])


@nox.session(name="cpu-tier", venv_backend="none", default=False, requires=[MATRIX_ENV, "hip-toolchain"])
def cpu_tier(session: nox.Session) -> None:
    """Matrix: every CPU cell of every pin in one run, a pin per core at a time (what .ci/run uses; -- PIN... for some)."""
    session.run(_matrix_python(session), "-m", "sglpatch", "matrix", "run-all", *session.posargs, external=True)


@nox.session(venv_backend="none", requires=[MATRIX_ENV])
def report(session: nox.Session) -> None:
    """Render the matrix table (markdown) from the cell records; -- --records DIR for CI artifacts."""
    session.run(_matrix_python(session), "-m", "sglpatch", "matrix", "report", *session.posargs, external=True)


# -- the bench (docs/bench.md): the write-up's workloads and the accuracy gate on ROCm nodes ----
# Tagged rocm and bench; they skip, saying why, where there is no docker engine or no /dev/kfd.

BENCH_WORKLOADS = ("serving", "single-stream")


def _rocm_door(session: nox.Session, args: list[str], name: str) -> None:
    """Run one ``sglpatch bench`` command; a skip (no engine, no GPU) is reported as a nox skip."""
    python = _matrix_python(session)
    record = ROOT / ".nox" / "bench-sessions" / f"{name}.json"
    record.unlink(missing_ok=True)
    session.run(python, "-m", "sglpatch", "bench", *args, "--record", str(record), *session.posargs, external=True)
    outcome = json.loads(record.read_text())
    if outcome["outcome"] == "skipped":
        session.skip(outcome["reason"])


@nox.session(venv_backend="none", default=False, requires=[MATRIX_ENV])
@nox.parametrize(
    ["tier", "pin", "workload"],
    [nox.param("rocm", pin, workload, id=f"rocm, {pin}, {workload}", tags=["rocm", "bench"])
     for pin in PINS for workload in BENCH_WORKLOADS],
)
def bench(session: nox.Session, tier: str, pin: str, workload: str) -> None:
    """Bench: the write-up's workload with the pin's own client in the patched image; tok/s, TTFT, power, table, plot."""
    _rocm_door(session, ["run", workload, pin], f"bench-{workload}-{pin}")


@nox.session(venv_backend="none", default=False, requires=[MATRIX_ENV])
@nox.parametrize(["tier", "pin"], [nox.param("rocm", pin, id=f"rocm, {pin}", tags=["rocm", "bench"]) for pin in PINS])
def accuracy(session: nox.Session, tier: str, pin: str) -> None:
    """Gate: GSM8K >= 0.935 and accept length >= 5.0 (sglang's AMD CI floors) on the patched image, MTP 5/1/6."""
    _rocm_door(session, ["accuracy", pin], f"rocm-accuracy-{pin}")


@nox.session(name="tune-moe", venv_backend="none", default=False, requires=[MATRIX_ENV])
@nox.parametrize(["tier", "pin"], [nox.param("rocm", pin, id=f"rocm, {pin}", tags=["tune"]) for pin in PINS])
def tune_moe(session: nox.Session, tier: str, pin: str) -> None:
    """aiter's MoE tuner, in the image, for the shapes the serving bench found untuned; writes the profile's config."""
    session.run(_matrix_python(session), "-m", "sglpatch", "bench", "tune-moe", pin, *session.posargs, external=True)


@nox.session(name="bench-report", venv_backend="none", requires=[MATRIX_ENV])
def bench_report(session: nox.Session) -> None:
    """Render the bench table and plots from build/bench/records; -- --records DIR for CI artifacts."""
    session.run(_matrix_python(session), "-m", "sglpatch", "bench", "report", *session.posargs, external=True)
