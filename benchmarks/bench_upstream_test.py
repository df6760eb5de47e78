"""Figures for the upstream-test witness (a benchmark, not a test: it prints, it does not assert).

Per tree (a pin's pristine release and the release with the series applied where it applies
exactly), uncached: every patch's regression tests that judge the pin (the patches whose main
file covers it) in the one child of their own that the witness runs them in, forked from the
witnesses' fork server. The first tree pays for starting the fork server (``server``, included in
its ``wall``: cold); the trees after it find the server warm. ``--fresh`` runs each tree in a
fresh interpreter instead (no fork server), as a release's sglang imported on CPU costs without one.

    python benchmarks/bench_upstream_test.py [--pins 0.5.23] [--rounds 2] [--fresh]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_witnesses import _trees  # noqa: E402
from sglpatch.plumbing.project import Project  # noqa: E402
from sglpatch.witnesses import probe_children, probe_runs  # noqa: E402
from sglpatch.witnesses import registry  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pins", nargs="*", default=["0.5.23"])
    parser.add_argument("--rounds", type=int, default=2, help="runs per tree (the first of all is cold)")
    parser.add_argument("--fresh", action="store_true", help="a fresh interpreter per tree (no fork server)")
    args = parser.parse_args()
    if args.fresh:
        os.environ[probe_children.FORK_SERVER_ENV] = "0"
    project = Project(ROOT)
    series = project.series()
    cold, warm = [], []
    print(f"{'tree':<22} {'wall':>6} {'server':>7} {'import':>7} {'tests':>6}  answers")
    with tempfile.TemporaryDirectory(prefix="sglpatch-bench-upstream-test-") as work:
        for version in args.pins:
            pin = project.pins().select([version])[0]
            python = probe_runs.cpu_python(pin)
            witnesses = [w for patch in series.patches if patch.for_version(version) is not None
                         for w in registry.witnesses_for(patch, patch.for_version(version)) if w.name.startswith("upstream-test")]
            if not witnesses:
                print(f"{version}: no patch's tests judge this pin")
                continue
            requests = [w.probe_request(pin) for w in witnesses]
            for kind, tree in _trees(project, version, Path(work)).items():
                for _ in range(args.rounds):
                    started = time.monotonic()
                    run = python.run_probes(tree, requests)
                    wall = time.monotonic() - started
                    server = (run.runner.get("fork_server") or {}).get("seconds")
                    first = server is not None and not cold and not warm
                    (cold if first or args.fresh else warm).append(wall)
                    seconds = run.runner.get("seconds", {})
                    tests = sum(seconds.get(r.name) or 0 for r in requests)
                    states = [w.judge_probe(None if run.failure(r.name) else run.answers.get(r.name), run.failure(r.name), pin).state
                              for w, r in zip(witnesses, requests)]
                    print(f"{version + ' ' + kind:<22} {wall:6.1f} {(f'{server:.1f}' if first else ''):>7} "
                          f"{seconds.get('import') or 0:7.1f} {tests:6.1f}  {'/'.join(states)}"
                          + (f"  ({run.error})" if run.error else ""), flush=True)
    if cold:
        print(f"\ncold (the tree that started the fork server, or --fresh): median {statistics.median(cold):.1f} s")
    if warm:
        print(f"warm (fork server running): median {statistics.median(warm):.1f} s per tree, all patches' tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
