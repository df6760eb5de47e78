"""Figures for the CPU Python witnesses (a benchmark, not a test: it prints, it does not assert).

Per tree (each pin's pristine release and the release with the series applied), uncached: the
MTP witness (``mtp-quark-exclude``) and the flags witness (``rocm-flags``) in the one child
process they share (``probe_runs.CpuPython.run_probes``), with the child's own timings: preparing the
emulated box (torch, HIP emulation, stand-ins), importing sglang, each probe, and the wall time
seen by the caller. The child is forked from a fork server per CPU environment
(``probes/zygote.py``) that prepared the box and imported the environment's packages once; the
first tree of each environment pays for starting it (``server``, included in that tree's
``wall``). ``--fresh`` runs every tree in a fresh interpreter instead (no fork server);
``--separate`` also runs each witness in a fresh child of its own, as before they shared one.
The bytecode cache's hits are printed: the first run of a release compiles its files once
(``probes/bytecode.py``); ``--cold`` gives the runs an empty bytecode cache of their own.

    python benchmarks/bench_witnesses.py [--pins 0.5.10 0.5.14 0.5.19 0.5.23] [--fresh] [--separate] [--cold]

Target (issue 10): median witness time per tree under 8 s for both witnesses together.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sglpatch.plumbing.project import Project  # noqa: E402
from sglpatch.sources import pristine_tree  # noqa: E402
from sglpatch.witnesses import mtp_exclude, rocm_flags  # noqa: E402
from sglpatch.witnesses import probe_children, probe_runs  # noqa: E402

DEFAULT_PINS = ("0.5.10", "0.5.14", "0.5.19", "0.5.23")


def _trees(project: Project, version: str, work: Path) -> dict[str, Path]:
    """The pin's pristine python/ tree, and a copy with each series patch's rendition for it
    applied where it applies (``git apply``; a patch upstream already has is left out)."""
    pin = project.pins().select([version])[0]
    pristine = pristine_tree.pristine_from_index(pin)
    archive = subprocess.run(["git", "archive", pristine.commit, "python"], cwd=pristine.repo, capture_output=True,
                             check=True, timeout=300).stdout
    trees = {}
    for kind in ("pristine", "patched"):
        tree = work / f"{version}-{kind}"
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
        trees[kind] = tree
    for patch in project.series().patches:
        rendition = patch.for_version(version)
        if rendition is None:
            continue
        check = subprocess.run(["git", "apply", "--check", "--directory=", str(rendition.path)], cwd=trees["patched"],
                               capture_output=True, timeout=120)
        if check.returncode == 0:
            subprocess.run(["git", "apply", "--directory=", str(rendition.path)], cwd=trees["patched"], check=True,
                           timeout=120)
    return trees


def _together(python, tree: Path, pin, witnesses) -> dict:
    started = time.monotonic()
    run = python.run_probes(tree, [w.probe_request(pin) for w in witnesses])
    wall = time.monotonic() - started
    seconds = run.runner.get("seconds", {})
    states = []
    for witness in witnesses:
        name = witness.probe_request(pin).name
        failure = run.failure(name)
        states.append(witness.judge_probe(None if failure else run.answers[name], failure, pin).state)
    bytecode = run.runner.get("bytecode", {})
    server = run.runner.get("fork_server") or {}
    return {"wall": wall, "box": seconds.get("box"), "import": seconds.get("import"),
            "server": server.get("seconds"), "server_id": id(server) if server else None,
            "mtp": seconds.get(mtp_exclude.PROBE), "flags": seconds.get(rocm_flags.PROBE), "states": states,
            "bytecode": f"{bytecode.get('hit', 0)}/{bytecode.get('hit', 0) + bytecode.get('miss', 0)}",
            "error": run.error}


def _separate(python, tree: Path, pin, witnesses) -> float:
    saved = os.environ.get(probe_children.FORK_SERVER_ENV)
    os.environ[probe_children.FORK_SERVER_ENV] = "0"
    try:
        started = time.monotonic()
        for witness in witnesses:
            python.run_probes(tree, [witness.probe_request(pin)])
        return time.monotonic() - started
    finally:
        if saved is None:
            os.environ.pop(probe_children.FORK_SERVER_ENV)
        else:
            os.environ[probe_children.FORK_SERVER_ENV] = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pins", nargs="*", default=list(DEFAULT_PINS))
    parser.add_argument("--fresh", action="store_true", help="a fresh interpreter per tree (no fork server)")
    parser.add_argument("--separate", action="store_true", help="also one fresh child per witness, for comparison")
    parser.add_argument("--cold", action="store_true", help="an empty bytecode cache for these runs")
    args = parser.parse_args()
    project = Project(ROOT)
    witnesses = [mtp_exclude.MtpQuarkExcludeWitness(), rocm_flags.RocmFlagsWitness()]
    if args.fresh:
        os.environ[probe_children.FORK_SERVER_ENV] = "0"
    totals: dict[str, list[float]] = {"pristine": [], "patched": []}
    without_start: list[float] = []
    starts: dict[str, float] = {}
    separate: list[float] = []
    with tempfile.TemporaryDirectory(prefix="sglpatch-bench-witnesses-") as work:
        if args.cold:
            probe_children.BYTECODE_DIR = Path(work) / "bytecode"
        print(f"{'tree':<22} {'wall':>6} {'server':>7} {'box':>6} {'import':>7} {'mtp':>6} {'flags':>6}  "
              f"{'bytecode':>9}  answers"
              + ("   separate" if args.separate else ""))
        for version in args.pins:
            pin = project.pins().select([version])[0]
            python = probe_runs.cpu_python(pin)
            for kind, tree in _trees(project, version, Path(work)).items():
                figures = _together(python, tree, pin, witnesses)
                totals[kind].append(figures["wall"])
                server = ""
                if figures["server"] is not None and str(python.python) not in starts:
                    starts[str(python.python)] = figures["server"]  # this tree started it
                    server = f"{figures['server']:.1f}"
                    without_start.append(figures["wall"] - figures["server"])
                else:
                    without_start.append(figures["wall"])
                line = (f"{version + ' ' + kind:<22} {figures['wall']:6.1f} {server:>7} {figures['box'] or 0:6.1f} "
                        f"{figures['import'] or 0:7.1f} {figures['mtp'] or 0:6.1f} {figures['flags'] or 0:6.1f}  "
                        f"{figures['bytecode']:>9}  {'/'.join(figures['states'])}")
                if args.separate:
                    separate.append(_separate(python, tree, pin, witnesses))
                    line += f"   {separate[-1]:8.1f}"
                print(line + (f"  ({figures['error']})" if figures["error"] else ""), flush=True)
    every = totals["pristine"] + totals["patched"]
    print(f"\nmedian per tree, both witnesses in one child: {statistics.median(every):.1f} s "
          f"(pristine {statistics.median(totals['pristine']):.1f} s, patched {statistics.median(totals['patched']):.1f} s; "
          f"target < 8 s); mean {statistics.mean(every):.1f} s")
    if starts:
        print(f"fork servers started: {len(starts)} ({', '.join(f'{s:.1f} s' for s in starts.values())}), "
              f"counted in the first tree of their environment; per tree without them: median "
              f"{statistics.median(without_start):.1f} s")
    if separate:
        print(f"median per tree, one child per witness: {statistics.median(separate):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
