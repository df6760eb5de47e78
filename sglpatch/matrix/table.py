"""The matrix's markdown table, rendered from a folder of cell records alone (``sglpatch.matrix.records``):
one table per tier, a row per pin, a column per check, then the reasons for every cell that did
not pass."""

from __future__ import annotations

from sglpatch.matrix.records import FAILED, PARTIAL, PASSED, SKIPPED, CellRecord

SYMBOLS = {PASSED: "pass", FAILED: "FAIL", PARTIAL: "partial", SKIPPED: "skip"}


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
                cells.append(SYMBOLS.get(record.outcome, record.outcome) + _figure(record) + _replayed(record)
                             if record else "—")
            out.append(f"| {pin} | " + " | ".join(cells) + " |")
        replayed = sum(r.cached for r in tier_records)
        if replayed:
            out.append("")
            out.append(f"{replayed} of {len(tier_records)} cells replayed: answers an earlier run kept for the same trees "
                       "and checking code, not computed by the run that wrote these records.")
        notes = [r for r in tier_records if r.outcome != PASSED]
        if notes:
            out.append("")
            for record in sorted(notes, key=lambda r: (_sort_key(r.pin), _column_order(_column(r)))):
                out.append(f"- {record.pin} {_column(record)}: **{record.outcome}** — {record.reason}")
        out.append("")
    return "\n".join(out)


def _replayed(record: CellRecord) -> str:
    return " (replayed)" if record.cached else ""


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
