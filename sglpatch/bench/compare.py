"""Per-figure ratios between two sets of bench records: B / A, e.g. pristine image (A) against the
patched one (B), which is what the series buys. Records are matched by workload, pin and variant
(the pristine flag is what may differ), runs by the rate the client was asked for; the knee is
compared on the achieved rate."""

from __future__ import annotations

from sglpatch.bench.records import BenchRecord

SERVING_FIGURES = ("achieved_rps", "output_tok_s", "ttft_p50_s", "ttft_p95_s", "success", "cache_hit_rate",
                   "tok_s_per_w_gpu_sockets", "tok_s_per_w_node")
SINGLE_FIGURES = ("output_tok_s_after_first", "output_tok_s_end_to_end", "ttft_p50_s", "tok_s_per_w_after_first_gpu_sockets",
                  "tok_s_per_w_after_first_node")


def _key(record: BenchRecord) -> tuple[str, str, str]:
    return (record.workload, record.pin, record.variant)


def ratio(a, b) -> float | None:
    if a in (None, 0) or b is None:
        return None
    return b / a


def compare(a: list[BenchRecord], b: list[BenchRecord]) -> list[dict]:
    """One row per matched figure: workload, pin, variant, rate, figure, A, B, B / A."""
    rows = []
    by_key = {_key(record): record for record in a}
    for record in b:
        other = by_key.get(_key(record))
        if other is None:
            continue
        figures = SERVING_FIGURES if record.workload == "serving" else SINGLE_FIGURES
        a_runs = {str(run["rate"]): run.get("figures") or {} for run in other.runs}
        for run in record.runs:
            mine, theirs = run.get("figures") or {}, a_runs.get(str(run["rate"]))
            if theirs is None:
                continue
            for name in figures:
                if theirs.get(name) is None and mine.get(name) is None:
                    continue  # e.g. the whole node's power, where neither side measured it
                rows.append({"workload": record.workload, "pin": record.pin, "variant": record.variant,
                             "rate": run["rate"], "figure": name, "a": theirs.get(name), "b": mine.get(name),
                             "ratio": ratio(theirs.get(name), mine.get(name))})
        if record.workload == "serving":
            rows.append({"workload": record.workload, "pin": record.pin, "variant": record.variant, "rate": "knee",
                         "figure": "knee_achieved_rps", "a": other.knee_achieved_rps, "b": record.knee_achieved_rps,
                         "ratio": ratio(other.knee_achieved_rps, record.knee_achieved_rps)})
    return rows


def render(rows: list[dict]) -> str:
    if not rows:
        return "no figures in common between the two record sets"
    lines = ["| workload | pin | variant | rate | figure | A | B | B / A |", "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        def show(value):
            return "—" if value is None else f"{value:.4g}"
        lines.append(f"| {row['workload']} | {row['pin']} | {row['variant']} | {row['rate']} | {row['figure']}"
                     f" | {show(row['a'])} | {show(row['b'])} | {show(row['ratio'])} |")
    return "\n".join(lines)
