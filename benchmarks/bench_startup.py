"""Figures for how fast sglpatch starts (issue 29; a benchmark, not a test: it prints, it does not assert).

`sglpatch --help`, `sglpatch pins` and, as the yardstick a user already waits for, `nox --help`,
each as a whole process (interpreter start, imports, the work), timed in the same run and in turn
(help, pins, nox, help, pins, nox, ...) so a machine whose speed drifts moves all three alike.
Target: sglpatch's two at most 0.25 s (the median wall time) on the development machine.

    python benchmarks/bench_startup.py [--runs 15]

Each figure is the wall time from start to exit (time.perf_counter around the child) and the
child's CPU seconds (user + system, the operating system's accounting of the reaped child). On a
shared machine the wall time carries the load; the CPU time is what the command itself cost.
One warming run of each comes first (bytecode compiled, files in the page cache) and is not
counted. The commands are the console scripts beside this Python (as `pip install -e .` or nox
installs them), else `python -m`; every run must exit 0, or the benchmark says so and stops.
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
TARGET_S = 0.25
RUN_LIMIT_S = 120


def _program(name: str) -> list[str]:
    """The console script ``name`` beside this Python, else on PATH, else ``python -m name``."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which(name)
    return [found] if found else [sys.executable, "-m", name]


def _commands() -> dict[str, list[str]]:
    return {"sglpatch --help": [*_program("sglpatch"), "--help"],
            "sglpatch pins": [*_program("sglpatch"), "pins"],
            "nox --help": [*_program("nox"), "--help"]}


def _timed(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``argv``, started in the project's folder."""
    before = os.times()
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=RUN_LIMIT_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"startup: {' '.join(argv)} did not finish within {RUN_LIMIT_S} s") from None
    wall = time.perf_counter() - started
    after = os.times()
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-10:]
        raise SystemExit(f"startup: {' '.join(argv)} exited {done.returncode}:\n" + "\n".join(tail))
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu


def _spread(values: list[float]) -> str:
    return f"min {min(values):.3f}  median {statistics.median(values):.3f}  max {max(values):.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs of each command (default 15)")
    args = parser.parse_args()
    commands = _commands()
    for argv in commands.values():
        _timed(argv)  # warming
    walls: dict[str, list[float]] = {name: [] for name in commands}
    cpus: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, argv in commands.items():
            wall, cpu = _timed(argv)
            walls[name].append(wall)
            cpus[name].append(cpu)
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"startup: {args.runs} runs of each, in turn, as whole processes; {os.cpu_count()} cores, load {load}")
    yardstick = statistics.median(walls["nox --help"])
    for name in commands:
        wall = statistics.median(walls[name])
        line = f"  {name:<16} wall s: {_spread(walls[name])}   cpu s: {_spread(cpus[name])}"
        if name.startswith("sglpatch"):
            line += f"   x{wall / yardstick:.2f} of nox --help; target {TARGET_S} s: {'MET' if wall <= TARGET_S else 'MISSED'}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
