"""A pull request's regression test run exactly as its body shows it: ``python3 test/...py`` from
the root of a checkout, in the release's CPU Python, what it printed kept as printed.

The body shows this command, so what it says under the command is what the command printed
here: its own output (unittest's ``Ran 3 tests`` / ``FAILED (failures=1)``, or the traceback it
stopped with), never a summary made by another run. ``python/`` is on ``PYTHONPATH`` in place of
sglang's ``pip install -e python``; the child has a declared environment of its own (an empty
home and temporary folder, the hubs offline). The Python is the pin's CPU Python with the torch
and torchvision the release's metadata requires in front (sglang imports torchvision, which has
no CPU build on the index). A test that needs a package only a GPU box has can still stop while
importing: that is then what it printed, and the body says so beside the in-process run on the
emulated box that the export's judgement also rests on.

A run is remembered under everything it read (the tree, the command, the interpreter's
environment and the variables it was given) and a remembered one is marked ``replayed``, so a
second export says which blocks it did not run again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from sglpatch.apply.checkouts import checkout_commit
from sglpatch.plumbing import cache, processes
from sglpatch.plumbing.gitcmd import git_out
from sglpatch.witnesses import cpu_envs, probe_runs

RUN_LIMIT_S = 600
TIMED_OUT = 124
PLAIN_RUNS = cache.Memo("upstream-plain-run")
LAYOUT = "2"  # bump when what a run is keyed by, or how it is run, changes
_RAN_RE = re.compile(r"^Ran (\d+) tests? in ", re.M)
_FAILURE_RE = re.compile(r"^(?:(?:FAIL|ERROR): \S+ \(|AssertionError\b)")
_SITE_RE = re.compile(r"(?:/[^\s\"'/]+)+/(site-packages|dist-packages)/")


@dataclass(frozen=True)
class Interpreter:
    """The Python the command's ``python3`` is: its ``bin`` folder goes first on ``PATH``;
    ``described`` is how a reviewer reads it (``Python 3.11, torch 2.14.1 and torchvision 0.29.1 ...``); ``identity``
    is what a remembered run is keyed by (its environment's recorded packages)."""

    bin_dir: Path
    described: str
    identity: str


@dataclass(frozen=True)
class PlainRun:
    """What ``command`` printed (stdout and stderr as one stream, as a terminal shows them) and
    its exit status; ``replayed`` is empty when it ran for this answer, else when it had run."""

    command: str
    returncode: int
    output: str
    interpreter: str = ""
    replayed: str = ""

    @property
    def ran_tests(self) -> bool:
        """Whether unittest got as far as running tests (its ``Ran N tests`` line)."""
        return bool(_RAN_RE.search(self.output))

    @property
    def passed(self) -> bool:
        return self.ran_tests and self.returncode == 0

    def last_lines(self, count: int) -> tuple[list[str], int]:
        """The output's last ``count`` lines, and how many lines it has."""
        lines = self.output.rstrip("\n").splitlines()
        return lines[-count:], len(lines)

    def failures(self) -> list[str]:
        """unittest's line naming each test that failed or errored, each followed by the
        assertion it stopped at, from unittest's report (below its first ``=====`` line): what a
        reviewer looks for above a long run's summary."""
        report = self.output.split("\n" + "=" * 70 + "\n", 1)[1:]
        return [line for line in "".join(report).splitlines() if _FAILURE_RE.match(line)]


def release_interpreter(pin) -> Interpreter:
    """The pin's CPU Python (``witnesses.cpu_envs``) with the torch and torchvision the release
    itself requires in front of it (``cpu_envs.release_torch_env``), as the command's
    ``python3``; each part is built on first use."""
    pin_env = Path(probe_runs.cpu_python(pin).python).parent.parent
    base = cpu_envs.base_env()
    torch_env = cpu_envs.release_torch_env(base, cpu_envs.release_torch_specs(pin))
    # The release's torch first, then the pin's CPU Python (its overlay, then the base).
    env = cpu_envs.layered_env("plain", [torch_env, pin_env, *cpu_envs.base_of(pin_env)])
    versions = {}
    for folder in (*cpu_envs.base_of(pin_env), pin_env, torch_env):
        versions.update(cpu_envs.installed_versions(folder))
    version = cpu_envs.env_python_version(env).split("-", 1)[-1]
    described = (f"Python {'.'.join(version.split('.')[:2])}, torch {versions.get('torch', '?')} and torchvision "
                 f"{versions.get('torchvision', '?')} as the release requires them")
    identity = hashlib.sha256((cpu_envs.env_fingerprint(pin) + (torch_env / "sglpatch-complete.json").read_text())
                              .encode()).hexdigest()
    return Interpreter(cpu_envs.venv_python(env).parent, described, identity)


def run_tests(repo: Path, commit: str, test_paths: list[str], interpreter: Interpreter, scratch: Path) -> list[PlainRun]:
    """``python3 PATH`` for each of ``test_paths`` at the root of ``commit``'s files (which must
    hold them), each run remembered by everything it read."""
    tree = git_out(["rev-parse", f"{commit}^{{tree}}"], repo)
    checkout: Path | None = None
    runs = []
    for path in test_paths:
        command = f"python3 {path}"
        key = _key(tree, command, interpreter)
        stored = PLAIN_RUNS.get(key)
        if _valid(stored):
            runs.append(PlainRun(command, stored["returncode"], stored["output"], interpreter.described,
                                 replayed=f"a stored run of {stored['ran_at']}"))
            continue
        if checkout is None:
            checkout = checkout_commit(repo, commit, Path(tempfile.mkdtemp(dir=scratch, prefix="plain-")))
        run = _run(checkout, path, interpreter)
        if run.returncode != TIMED_OUT:  # a hang is no answer to keep
            PLAIN_RUNS.put(key, {"returncode": run.returncode, "output": run.output, "ran_at": _now()})
        runs.append(run)
    return runs


def _valid(stored) -> bool:
    return isinstance(stored, dict) and isinstance(stored.get("returncode"), int) and isinstance(stored.get("output"), str)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def _env(root: Path, interpreter: Interpreter, home: Path) -> dict[str, str]:
    """The child's whole environment: none of the caller's but the locale, its own home and
    temporary folder, the interpreter first on PATH and the checkout's ``python/`` importable."""
    return {
        "PATH": os.pathsep.join([str(interpreter.bin_dir), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": str(home),
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(root / "python"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


def _key(tree: str, command: str, interpreter: Interpreter) -> str:
    described = {"layout": LAYOUT, "tree": tree, "command": command, "interpreter": interpreter.identity,
                 "bin": str(interpreter.bin_dir),
                 "env": sorted(k for k in _env(Path("/"), interpreter, Path("/")))}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:32]


def _run(root: Path, path: str, interpreter: Interpreter) -> PlainRun:
    with tempfile.TemporaryDirectory(prefix="plain-home-") as home:
        process = subprocess.Popen(["python3", path], cwd=root, env=_env(root, interpreter, Path(home)),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                                   start_new_session=True)
        try:
            output, _ = process.communicate(timeout=RUN_LIMIT_S)
            code = process.returncode
        except subprocess.TimeoutExpired:
            processes.kill_session(process)
            output, _ = process.communicate()
            output = (output or "") + f"\n(stopped after {RUN_LIMIT_S} s)\n"
            code = TIMED_OUT
    return PlainRun(f"python3 {path}", code, scrub(output or "", root, home), interpreter.described)


def scrub(text: str, root: Path, home: str = "") -> str:
    """The output with the folders of this machine left out: the checkout's root (paths read as
    in the repository), the interpreter's install folders (``site-packages/...``)."""
    text = text.replace(f"{root}/", "").replace(str(root), ".")
    if home:
        text = text.replace(home, "~")
    return _SITE_RE.sub(lambda m: f"{m[1]}/", text)
