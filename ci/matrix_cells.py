"""Print a GitHub Actions job matrix of the nox sessions with a tag, for $GITHUB_OUTPUT.

    python ci/matrix_cells.py rocm >> "$GITHUB_OUTPUT"

writes ``cells=<JSON>``: {"include": [{"session": "spec(rocm, 0.5.14, 5)", "id": "rocm-spec-0.5.14-d5"}, ...]}
-- exactly what ``nox -l --json -t TAG`` lists, each with a name fit for an artifact -- and
``runner=<JSON list of runner labels>`` from $SGLPATCH_ROCM_RUNNER (default: self-hosted,
linux-mi35x-gpu-8).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

DEFAULT_RUNNER = ["self-hosted", "linux-mi35x-gpu-8"]


def cells(tag: str) -> list[dict[str, str]]:
    listing = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "--json", "-t", tag], capture_output=True, text=True, check=True
    ).stdout
    out = []
    for session in json.loads(listing):
        spec = session.get("call_spec") or {}
        parts = [spec.get("tier", tag), session["name"], spec.get("pin", "")]
        if spec.get("depth") is not None:
            parts.append(f"d{spec['depth']}")
        out.append({"session": session["session"], "id": "-".join(p for p in parts if p)})
    return out


def runner_labels() -> list[str]:
    configured = os.environ.get("SGLPATCH_ROCM_RUNNER", "").strip()
    if not configured:
        return DEFAULT_RUNNER
    if configured.startswith("["):
        return json.loads(configured)
    return [label.strip() for label in configured.split(",") if label.strip()]


def main(tag: str) -> int:
    print(f"cells={json.dumps({'include': cells(tag)}, separators=(',', ':'))}")
    print(f"runner={json.dumps(runner_labels(), separators=(',', ':'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "rocm"))
