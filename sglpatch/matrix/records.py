"""Check records, shared by the test matrix, the bench and the ROCm job: the outcomes, the parts a
record is judged by, one JSON record per matrix cell (the accuracy gate's too), and reading JSON
records and a check script's figures back.

A record is self-describing (pin, series version and hash, image digest, GPU, check, outcome,
figures, log path), so a table can be rebuilt from a folder of records alone -- for example from
the artifacts a CI matrix uploads, each job holding one cell (``sglpatch.matrix.table``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sglpatch.plumbing.cache import write_atomically
from sglpatch.plumbing.project import Project

PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"  # could not run here; the reason says why (never a pass)
PARTIAL = "partial"  # what ran passed, some parts could not run here; the reason says which
OUTCOMES = (PASSED, FAILED, PARTIAL, SKIPPED)
# An outcome that fails a nox session or a CI job. Skipped and partial cells are reported, not hidden.
FAILING = (FAILED,)

@dataclass
class Part:
    """One verified statement inside a cell (e.g. "HIP compile of the patched kernel")."""

    name: str
    outcome: str
    detail: str = ""


@dataclass
class CellRecord:
    tier: str  # "cpu" or "rocm"
    check: str  # "build", "load" or "spec"
    pin: str
    depth: int | None
    series_version: str
    series_hash: str
    outcome: str
    reason: str = ""  # why it failed, was skipped or is partial
    parts: list[Part] = field(default_factory=list)
    figures: dict[str, object] = field(default_factory=dict)
    image_digest: str = ""  # rocm: the patched image's id; cpu: empty
    gpu: str = ""  # rocm: the GPU name the container saw; cpu: what the emulation stands for
    device: str = ""  # rocm: the device the runner ran it on (``rocm.options.device_stamp``)
    tree: str = ""  # the patched tree's git hash the cell ran on
    log: str = ""  # path of the cell's log
    seconds: float = 0.0
    cached: bool = False
    finished: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    @property
    def cell_id(self) -> str:
        return cell_id(self.tier, self.check, self.pin, self.depth)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "CellRecord":
        data = dict(data)
        data["parts"] = [Part(**part) for part in data.get("parts", [])]
        return cls(**data)


def matrix_dir(project: Project) -> Path:
    """build/matrix: the matrix's records, logs, apply reports and ROCm state."""
    return project.build_dir / "matrix"


def cell_id(tier: str, check: str, pin: str, depth: int | None) -> str:
    """The file-name-safe name of a cell: ``cpu-spec-0.5.14-d5``."""
    return f"{tier}-{check}-{pin}" + (f"-d{depth}" if depth is not None else "")


def combine(parts: list[Part]) -> tuple[str, str]:
    """A cell's outcome from its parts: failed if any failed, passed only if all passed."""
    failed = [p for p in parts if p.outcome == FAILED]
    if failed:
        return FAILED, "; ".join(f"{p.name}: {p.detail}" for p in failed)
    skipped = [p for p in parts if p.outcome == SKIPPED]
    if not parts or len(skipped) == len(parts):
        return SKIPPED, "; ".join(f"{p.name}: {p.detail}" for p in skipped) or "nothing to check"
    if skipped:
        return PARTIAL, "not run here: " + "; ".join(f"{p.name}: {p.detail}" for p in skipped)
    return PASSED, ""


def write_record(record: CellRecord, folder: Path) -> Path:
    path = folder / f"{record.cell_id}.json"
    write_atomically(path, record.to_json() + "\n")
    return path


def failing(record: CellRecord, *, strict: bool = False) -> bool:
    """Whether the cell fails its session: a failure always; with ``strict`` (CI, where every
    toolchain is installed) also a cell that could not run all of its parts."""
    return record.outcome in FAILING or (strict and record.outcome in (PARTIAL, SKIPPED))


def json_objects(folder: Path) -> list[dict]:
    """The JSON object of every ``*.json`` file under ``folder``, in path order (recursively: CI
    artifacts land in one folder per job); a file that is not a JSON object is passed over."""
    found = []
    for path in sorted(folder.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(data, dict):
            found.append(data)
    return found


def read_records(folder: Path) -> list[CellRecord]:
    """Every cell record under ``folder``."""
    return [CellRecord.from_dict(data) for data in json_objects(folder)
            if {"tier", "check", "pin", "outcome"} <= data.keys()]


def last_json(stdout: str) -> dict | None:
    """The last line of a probe's or check script's output that is a JSON object."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None
