"""Print the ROCm CI plan of an event as a GitHub Actions job matrix, for $GITHUB_OUTPUT.

    python ci/matrix_cells.py pr --base origin/main >> "$GITHUB_OUTPUT"

writes ``jobs=<JSON>``: {"include": [{"id": "rocm-0.5.23", "pin": "0.5.23", "event": "pr",
"sessions": "[...]", "estimated_node_hours": 3.77, "estimate_from": "stated defaults ...: accuracy, ..."},
...]} -- one job per pin, from ``sglpatch.matrix.plan``, its node-hours an estimate named with where
its durations came from (recorded or stated defaults); each
runs ``nox -s "rocm-job(PIN)" -- --event EVENT``, which runs the listed sessions -- and
``runner=<JSON list of runner labels>`` from $SGLPATCH_ROCM_RUNNER (default: self-hosted,
linux-mi35x-gpu-8).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sglpatch.matrix import plan  # noqa: E402
from sglpatch.plumbing.project import Project  # noqa: E402


def runner_labels() -> list[str]:
    configured = os.environ.get("SGLPATCH_ROCM_RUNNER", "").strip()
    if not configured:
        return plan.DEFAULT_RUNNER
    if configured.startswith("["):
        return json.loads(configured)
    return [label.strip() for label in configured.split(",") if label.strip()]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("event", choices=plan.EVENTS, nargs="?", default="pr")
    parser.add_argument("--base", help="a pull request's base ref: the pins whose renditions changed since it")
    args = parser.parse_args(argv)
    project = Project(ROOT)
    changed = plan.git_changed_files(ROOT, args.base) if args.base else []
    jobs = plan.plan(project, args.event, changed_files=changed, records_dir=ROOT / "build" / "matrix" / "records")
    sys.stdout.write(plan.github_outputs(jobs, runner_labels()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
