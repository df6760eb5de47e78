"""Figures for how fast `rebase` refuses what it cannot port (issue 36; a benchmark, not a test: it
prints, it does not assert).

`sglpatch rebase banana` (not a version), `rebase 0.5.9` (older than every pin) and `rebase 0.5.24`
(not on the package index: give another release with --absent when 0.5.24 is out), each through the
command line and through `nox -s rebase -- V`, as whole processes, in turn (so a machine whose speed
drifts moves them alike). Target: every one under 2 s (the median wall time), nox's included: it
asks before it installs sglpatch or builds the witnesses' toolchain.

    python benchmarks/bench_rebase_refusals.py [--runs 5] [--absent 0.5.24] [--nox nox]

One warming run of each comes first and is not counted: nox's session environment is made there the
first time (reused after, as nox is configured to), and pip's configuration remembered. Every run
must refuse (exit 2 from sglpatch, 1 from nox, its line saying so), or the benchmark says so and stops.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 2.0
RUN_LIMIT_S = 300


def _program(name: str) -> list[str]:
    """The console script ``name`` beside this Python, else on PATH, else ``python -m name``."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which(name)
    return [found] if found else [sys.executable, "-m", name]


def _timed(argv: list[str], refused: int) -> float:
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=RUN_LIMIT_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"rebase refusals: {' '.join(argv)} did not finish within {RUN_LIMIT_S} s") from None
    wall = time.perf_counter() - started
    said = (done.stdout + done.stderr).strip().splitlines()
    if done.returncode != refused or not any("sglpatch" in line and "error" in line or "aborted" in line for line in said):
        raise SystemExit(f"rebase refusals: {' '.join(argv)} exited {done.returncode}, not a refusal:\n" + "\n".join(said[-10:]))
    return wall


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--absent", default="0.5.24", help="a release the package index does not have")
    parser.add_argument("--nox", default=None, help="the nox to run (default: beside this Python, else on PATH)")
    args = parser.parse_args(argv)
    sglpatch, nox = _program("sglpatch"), [args.nox] if args.nox else _program("nox")
    commands = {}
    for version in ("banana", "0.5.9", args.absent):
        commands[f"sglpatch rebase {version}"] = ([*sglpatch, "rebase", version], 2)
        commands[f"nox -s rebase -- {version}"] = ([*nox, "-s", "rebase", "--", version], 1)
    for command, refused in commands.values():
        _timed(command, refused)  # warming: nox's environment, pip's remembered configuration
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, (command, refused) in commands.items():
            times[name].append(_timed(command, refused))
    print(f"| refusal ({args.runs} runs, after one warming run) | median s | max s | under {TARGET_S:g} s |")
    print("|---|---|---|---|")
    for name, walls in times.items():
        median = statistics.median(walls)
        print(f"| `{name}` | {median:.2f} | {max(walls):.2f} | {'yes' if median < TARGET_S else 'NO'} |")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
