"""Figures for `sglpatch apply --into` on a fresh machine (a benchmark, not a test: it prints, it
does not assert).

A tagged sglang checkout is made as the ROCm image holds one at /sgl-workspace/sglang (the pin's
pristine release committed into a git repository, tag v<version>); then `sglpatch apply --into
CHECKOUT` runs as a process with an empty cache (a fresh $SGLPATCH_CACHE_DIR), so the artifact is
downloaded from pip's configured index and the pristine commit built from it. Printed: the seconds
and the cache's size against the targets (issue 22: at most 15 s and 100 MB), whether the
checkout's tree is the lock's, and whether a CPU Python was built.

    python benchmarks/bench_into.py [--pin 0.5.23] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sglpatch.plumbing.processes import pip_env  # noqa: E402
from sglpatch.plumbing.project import Project  # noqa: E402
from sglpatch.sources import pristine_tree  # noqa: E402

TARGET_S = 15.0
TARGET_MB = 100.0
STEP_TIMEOUT_S = 600  # one apply or git step; past it something hung
USER = {"GIT_AUTHOR_NAME": "Rocm User", "GIT_AUTHOR_EMAIL": "user@example.com",
        "GIT_COMMITTER_NAME": "Rocm User", "GIT_COMMITTER_EMAIL": "user@example.com"}


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, check=True, timeout=STEP_TIMEOUT_S, capture_output=True, **kwargs)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{' '.join(command[:4])} did not finish within {STEP_TIMEOUT_S} s") from None
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"{' '.join(command[:4])} failed: {exc.stderr.decode(errors='replace').strip()}") from None


def _git_env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/"), "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, **USER}


def _tagged_checkout(pristine: pristine_tree.Pristine, version: str, dest: Path) -> None:
    """The release as a user's checkout: its files committed by the user, tagged v<version>."""
    dest.mkdir(parents=True)
    archive = _run(["git", "archive", pristine.commit], cwd=pristine.repo, env=_git_env()).stdout
    _run(["tar", "-x", "-C", str(dest)], input=archive)
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", f"sglang {version}"],
                 ["tag", f"v{version}"], ["config", "user.name", USER["GIT_AUTHOR_NAME"]],
                 ["config", "user.email", USER["GIT_AUTHOR_EMAIL"]]):
        _run(["git", *args], cwd=dest, env=_git_env())


def _size_mb(folder: Path) -> float:
    total = 0
    for parent, _, names in os.walk(folder):
        total += sum(os.lstat(os.path.join(parent, name)).st_size for name in names)
    return total / 1e6


def _one_round(version: str, pristine: pristine_tree.Pristine, locked_tree: str, work: Path) -> dict:
    checkout, cache = work / "sglang", work / "cache"
    _tagged_checkout(pristine, version, checkout)
    extra = {"SGLPATCH_CACHE_DIR": str(cache)}
    if os.environ.get("SGLPATCH_INDEX_URL"):
        extra["SGLPATCH_INDEX_URL"] = os.environ["SGLPATCH_INDEX_URL"]
    command = [sys.executable, "-m", "sglpatch", "-q", "--root", str(ROOT), "apply", "--into", str(checkout)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, env=pip_env(extra))
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"sglpatch apply --into failed ({done.returncode}): {done.stderr.strip()}")
    tree = _run(["git", "rev-parse", "HEAD^{tree}"], cwd=checkout, env=_git_env()).stdout.decode().strip()
    return {"seconds": seconds, "mb": _size_mb(cache), "tree_ok": tree == locked_tree,
            "cpu_python": (cache / "pyenv").exists(), "said": done.stdout.splitlines()[0]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pin", default=None, help="the pin (default: the newest)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    project = Project(ROOT)
    pins = project.pins()
    pin = pins.select([args.pin])[0] if args.pin else pins.newest
    locked_tree = json.loads(project.lock_file.read_text())["pins"][pin.version]["tree"]
    # The checkout is made from this machine's cache (setup, not timed); each timed run has its own.
    pristine = pristine_tree.pristine_from_index(pin)
    rounds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-into-") as work:
            rounds.append(_one_round(pin.version, pristine, locked_tree, Path(work)))
    seconds = [r["seconds"] for r in rounds]
    sizes = [r["mb"] for r in rounds]
    print(f"sglpatch apply --into a tagged sglang {pin.version} checkout, empty cache each time, {args.rounds} rounds:")
    print(f"  time   median {statistics.median(seconds):.2f} s  runs {', '.join(f'{s:.2f}' for s in seconds)}  "
          f"(target at most {TARGET_S:g} s)")
    print(f"  cache  {max(sizes):.1f} MB (10^6 bytes) at most  (target at most {TARGET_MB:g} MB)")
    print(f"  checkout's tree is the lock's {locked_tree[:12]}: {'yes' if all(r['tree_ok'] for r in rounds) else 'NO'}; "
          f"CPU Python built: {'YES' if any(r['cpu_python'] for r in rounds) else 'no'}")
    print(f"  it said: {rounds[-1]['said']}")


if __name__ == "__main__":
    main()
