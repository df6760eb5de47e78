"""Figures for CI's budget (issue 10; a benchmark, not a test: it prints, it does not assert).

Each figure runs in a clean clone of this checkout's HEAD, as CI and a new user would:

cold-apply:  `nox -s apply` of every pin with witnesses, on an empty sglpatch cache and an empty pip
             cache (the HIP toolchain, the witnesses' CPU Python and every artifact fetched). Target:
             under 10 minutes.
fresh-ci:    `bash .ci/run` on empty caches. Target: under 30 minutes.
warm-ci:     `bash .ci/run` on this machine's own caches (run it twice for a truly warm figure).
             Target: under 10 minutes.

    python benchmarks/bench_ci.py cold-apply [fresh-ci] [warm-ci] [--keep]

Figures are printed as they finish, with the phase times nox reports; each run's full log is
kept in the run's folder (printed) when --keep is given, or on failure.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_LIMIT_S = 90 * 60  # CI's own limit; a run past it has failed the budget anyway

COMMANDS = {
    "cold-apply": (["bash", "-c", "python3 -m pip install --quiet nox && nox -s apply"], True),
    "fresh-ci": (["bash", ".ci/run"], True),
    "warm-ci": (["bash", ".ci/run"], False),
}


def run_figure(name: str, keep: bool) -> tuple[float, int]:
    command, empty_caches = COMMANDS[name]
    work = Path(tempfile.mkdtemp(prefix=f"sglpatch-bench-{name}-"))
    clone = work / "checkout"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=600)
    env = dict(os.environ)
    if empty_caches:
        env.update(SGLPATCH_CACHE_DIR=str(work / "sglpatch-cache"), PIP_CACHE_DIR=str(work / "pip-cache"))
        env.pop("SGLPATCH_HIP_TOOLCHAIN", None)
    # nox and the commands it installs go to a venv of the run's own, never to the user's Python.
    subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True, timeout=600)
    env["PATH"] = f"{work / 'venv' / 'bin'}{os.pathsep}{env['PATH']}"
    log = work / "run.log"
    started = time.monotonic()
    with log.open("w") as out:
        try:
            status = subprocess.run(command, cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    timeout=RUN_LIMIT_S).returncode
        except subprocess.TimeoutExpired:
            status = 124
    seconds = time.monotonic() - started
    phases = re.findall(r"nox > Session (\S+) was successful in (.+)\.", log.read_text(errors="replace"))
    print(f"{name}: {seconds:.0f} s ({seconds / 60:.1f} min), exit {status}"
          + "".join(f"\n    {session}: {took}" for session, took in phases), flush=True)
    if keep or status != 0:
        print(f"    log: {log}", flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return seconds, status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("figures", nargs="+", choices=sorted(COMMANDS))
    parser.add_argument("--keep", action="store_true", help="keep each run's folder and log")
    args = parser.parse_args()
    failed = [name for name in args.figures if run_figure(name, args.keep)[1] != 0]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
