"""Test-matrix records: one JSON record per cell, and the markdown table rendered from them.

A record is self-describing (pin, series version and hash, image digest, GPU, check, outcome,
figures, log path), so the table can be rebuilt from a folder of records alone -- for example from
the artifacts a CI matrix uploads, each job holding one cell.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sglpatch.cache import write_atomically

PASSED = "passed"
FAILED = "failed"
SKIPPED = "skipped"  # could not run here; the reason says why (never a pass)
PARTIAL = "partial"  # what ran passed, some parts could not run here; the reason says which
OUTCOMES = (PASSED, FAILED, PARTIAL, SKIPPED)
# An outcome that fails a nox session or a CI job. Skipped and partial cells are reported, not hidden.
FAILING = (FAILED,)

SYMBOLS = {PASSED: "pass", FAILED: "FAIL", PARTIAL: "partial", SKIPPED: "skip"}


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


def _column(record: CellRecord) -> str:
    return record.check if record.depth is None else f"spec d{record.depth}"


def _sort_key(version: str):
    from packaging.version import Version

    return Version(version)


def render_markdown(records: list[CellRecord]) -> str:
    """One table per tier: a row per pin, a column per check (build, load, spec d1..d6), then the
    reasons for every cell that did not pass."""
    if not records:
        return "_no matrix records_\n"
    out = []
    for tier in sorted({r.tier for r in records}):
        tier_records = [r for r in records if r.tier == tier]
        columns = sorted({_column(r) for r in tier_records}, key=_column_order)
        series = sorted({f"v{r.series_version} ({r.series_hash[:12]})" for r in tier_records})
        gpus = sorted({r.gpu for r in tier_records if r.gpu})
        out.append(f"### {tier} tier — series {', '.join(series)}" + (f" — {', '.join(gpus)}" if gpus else ""))
        out.append("")
        out.append("| pin | " + " | ".join(columns) + " |")
        out.append("|---|" + "---|" * len(columns))
        by_cell = {(r.pin, _column(r)): r for r in tier_records}
        for pin in sorted({r.pin for r in tier_records}, key=_sort_key):
            cells = []
            for column in columns:
                record = by_cell.get((pin, column))
                cells.append(SYMBOLS.get(record.outcome, record.outcome) + _figure(record) if record else "—")
            out.append(f"| {pin} | " + " | ".join(cells) + " |")
        notes = [r for r in tier_records if r.outcome != PASSED]
        if notes:
            out.append("")
            for record in sorted(notes, key=lambda r: (_sort_key(r.pin), _column_order(_column(r)))):
                out.append(f"- {record.pin} {_column(record)}: **{record.outcome}** — {record.reason}")
        out.append("")
    return "\n".join(out)


def _figure(record: CellRecord) -> str:
    """The one figure worth showing in a cell: decode speed and accept length of a spec cell."""
    figures = record.figures
    shown = []
    if "decode_tok_s" in figures:
        shown.append(f"{figures['decode_tok_s']:.0f} tok/s")
    if "accept_length" in figures:
        shown.append(f"acc {figures['accept_length']:.2f}")
    return f" ({', '.join(shown)})" if shown else ""


def _column_order(column: str) -> tuple[int, int]:
    if column.startswith("spec d"):
        return (2, int(column.removeprefix("spec d")))
    return ({"build": 0, "load": 1}.get(column, 3), 0)


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
