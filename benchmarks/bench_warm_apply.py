"""Figure for a warm `sglpatch apply` (issue 18; a benchmark, not a test: it prints, it does not assert).

warm-apply:  `sglpatch apply` of every pin, witnesses on, as a whole process (interpreter start,
             imports, every pin's tree checked against the lock), after one warming run, on this
             machine's caches and trees. Target: at most 1 s (the median).

    python benchmarks/bench_warm_apply.py [--runs 7] [--out DIR] [--as-is]

Bytecode is part of warm: each run reads the modules' compiled bytecode from a folder of the
benchmark's own, filled by the warming run, whatever PYTHONDONTWRITEBYTECODE says here (--as-is
keeps the caller's environment as it is, compiling every module in every run where that is set).
A run that does not exit 0 is no warm figure: the benchmark says so and prints its output's tail.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 1.0
RUN_LIMIT_S = 1800  # the warming run may have to compute witnesses' answers (a cold apply is ~10 min)


def _command(out: Path | None) -> list[str]:
    return [sys.executable, "-m", "sglpatch", "-q", "apply", *(["--out", str(out)] if out else [])]


def _run(command: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{' '.join(command)} did not finish within {RUN_LIMIT_S} s") from None
    return time.perf_counter() - started, done


def _failed(what: str, done: subprocess.CompletedProcess) -> int:
    tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
    print(f"warm-apply: the {what} exited {done.returncode}, so there is no warm figure:", flush=True)
    print("\n".join(f"    {line}" for line in tail), flush=True)
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="timed runs after the warming one (default 7)")
    parser.add_argument("--out", type=Path, help="trees and report here (default: the project's build/)")
    parser.add_argument("--as-is", action="store_true", help="the caller's environment untouched (bytecode settings too)")
    args = parser.parse_args()
    env = dict(os.environ)
    pycache = None
    if not args.as_is:
        pycache = Path(tempfile.mkdtemp(prefix="sglpatch-bench-pyc-"))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    try:
        command = _command(args.out)
        warming, done = _run(command, env)
        if done.returncode != 0:
            return _failed("warming run", done)
        times = []
        for _ in range(args.runs):
            took, done = _run(command, env)
            if done.returncode != 0:
                return _failed("timed run", done)
            times.append(took)
    finally:
        if pycache is not None:
            shutil.rmtree(pycache, ignore_errors=True)
    median = statistics.median(times)
    bytecode = "caller's environment as is" if args.as_is else "bytecode compiled once by the warming run"
    print(f"warm-apply: `{' '.join(['sglpatch', *command[3:]])}`, all pins, as a process ({bytecode}); "
          f"warming run {warming:.2f} s")
    print(f"  {len(times)} runs: min {min(times):.3f} s  median {median:.3f} s  max {max(times):.3f} s")
    print(f"  runs: {', '.join(f'{t:.3f}' for t in times)}")
    print(f"  target: median at most {TARGET_S:.1f} s: {'MET' if median <= TARGET_S else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
