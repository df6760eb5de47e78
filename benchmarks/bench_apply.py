"""Figures for `nox -s apply` (a benchmark, not a test: it prints, it does not assert).

cold:  one pin from nothing (empty cache, no tree, witnesses off) with sglpatch, against the bare baseline of the
       same work -- `pip download --no-deps`, unzip/untar, `git init/add/commit`, `git am` of the
       same patches -- timed alternately in one run; the ratio is median(sglpatch)/median(baseline).
warm:  re-applying every pin in-process once everything is cached and applied.

    python benchmarks/bench_apply.py [--pin 0.5.23] [--rounds 3]
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
sys.path.insert(0, str(ROOT))

from sglpatch.apply.apply_pins import apply_series  # noqa: E402
from sglpatch.plumbing.project import Project  # noqa: E402


STEP_TIMEOUT_S = 600  # one download, unpack or git step; past it something hung


def _run(command: list[str], **kwargs) -> None:
    try:
        subprocess.run(command, check=True, timeout=STEP_TIMEOUT_S, **kwargs)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{' '.join(command[:4])} did not finish within {STEP_TIMEOUT_S} s") from None


def _baseline(version: str, patches: list[Path], work: Path) -> float:
    start = time.perf_counter()
    download = work / "download"
    _run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"sglang=={version}", "-d", str(download)],
         capture_output=True)
    artifact = next(download.iterdir())
    tree = work / "tree"
    (tree / "python").mkdir(parents=True)  # upstream's layout, so the same patches apply
    if artifact.suffix == ".whl":
        _run(["unzip", "-q", str(artifact), "-d", str(tree / "python")])
    else:
        _run(["tar", "xzf", str(artifact), "--strip-components=1", "-C", str(tree / "python")])
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@b"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "pristine"]):
        _run(["git", *args], cwd=tree, env=env)
    if patches:
        _run(["git", "am", "-q", *map(str, patches)], cwd=tree, env=env)
    return time.perf_counter() - start


def _sglpatch_cold(project: Project, version: str, work: Path) -> float:
    os.environ["SGLPATCH_CACHE_DIR"] = str(work / "cache")
    lock = work / "series.lock"
    shutil.copy(project.lock_file, lock)
    start = time.perf_counter()
    # Witnesses off: the baseline does no checking either; witness runs are cached by tree anyway.
    report = apply_series(project, [version], out_dir=work / "out", run_witnesses=False)
    elapsed = time.perf_counter() - start
    if not report.ok:
        raise SystemExit(f"sglpatch apply failed: {report.results[0].error}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pin", default=None, help="pin for the cold figure (default: the newest)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    project = Project(ROOT)
    pins = project.pins()
    pin = pins.select([args.pin])[0] if args.pin else pins.newest
    series = project.series()
    patches = [p.for_version(pin.version) for p in series.patches]
    patch_paths = [p.path for p in patches if p is not None]

    ours, theirs = [], []
    saved_cache = os.environ.get("SGLPATCH_CACHE_DIR")
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            theirs.append(_baseline(pin.version, patch_paths, Path(a)))
            ours.append(_sglpatch_cold(project, pin.version, Path(b)))
    if saved_cache is None:
        os.environ.pop("SGLPATCH_CACHE_DIR", None)
    else:
        os.environ["SGLPATCH_CACHE_DIR"] = saved_cache

    print(f"cold, sglang {pin.version} ({pin.artifact}), {len(patch_paths)} patch(es), {args.rounds} rounds:")
    print(f"  baseline  median {statistics.median(theirs):.2f} s  runs {', '.join(f'{t:.2f}' for t in theirs)}")
    print(f"  sglpatch  median {statistics.median(ours):.2f} s  runs {', '.join(f'{t:.2f}' for t in ours)}")
    print(f"  ratio sglpatch/baseline: {statistics.median(ours) / statistics.median(theirs):.2f}")

    with tempfile.TemporaryDirectory() as out:
        apply_series(project, out_dir=Path(out))  # make everything warm
        warm = []
        for _ in range(5):
            start = time.perf_counter()
            report = apply_series(project, out_dir=Path(out))
            warm.append(time.perf_counter() - start)
        state = "ok" if report.ok else "FAILED"
    print(f"warm re-apply, all {len(pins.pins)} pins in-process ({state}): median {statistics.median(warm):.3f} s, "
          f"runs {', '.join(f'{t:.3f}' for t in warm)}")


if __name__ == "__main__":
    main()
