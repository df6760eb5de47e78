"""The bench's table in the write-up's shape, with power beside every throughput, and its plot.

Serving: | sustained RPS (achieved) | requested RPS | tok/s/node | TTFT p50 / p95 | success | cache hit
| W, GPU sockets | tok/s/W, GPU sockets |, and the whole node's W and tok/s/W where it was measured;
the knee marked (on the achieved rate). Single stream: output speed after the first token and end to
end, with the same power columns. Each table's heading names the pin, the profile and its version,
the quantization, the series and the image; a note under it says what the watts count. The plot
(matplotlib) draws tok/s/node and TTFT p50/p95 against the achieved rate, the knee, and the
write-up's published points as a reference.
"""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from sglpatch.bench import scan
from sglpatch.bench.records import BenchRecord
from sglpatch.bench.workloads import PUBLISHED_SERVING, PUBLISHED_SINGLE_STREAM_TOK_S
from sglpatch.plumbing.errors import SglpatchError


def _number(value, spec: str, none: str = "—") -> str:
    return none if value is None else format(value, spec)


def heading(record: BenchRecord) -> str:
    env = record.environment or {}
    gpus = f"{env.get('gpu_count', '?')}x {env.get('gpu', 'GPU unknown')}"
    rocm = f"ROCm {env.get('rocm_version')}" if env.get("rocm_version") else "ROCm unknown"
    image = "pristine image (no series)" if record.pristine else f"series v{record.series_version} ({record.series_hash[:12]})"
    return (f"### {record.workload} — sglang {record.pin} — {record.profile} v{record.profile_version}"
            f" ({record.variant}) — {record.quantization} — {image} — {gpus}, {rocm}")


def _node_measured(records: list[BenchRecord]) -> bool:
    return any((run.get("power") or {}).get("node_w_mean") for record in records for run in record.runs)


def _power_cells(run: dict, per_w: str, node: bool) -> str:
    figures, power = run.get("figures") or {}, run.get("power") or {}
    cells = f" | {_number(power.get('gpu_sockets_w_mean'), '.0f')} | {_number(figures.get(per_w + '_gpu_sockets'), '.3f')}"
    if node:
        cells += f" | {_number(power.get('node_w_mean'), '.0f')} | {_number(figures.get(per_w + '_node'), '.3f')}"
    return cells + " |"


def _power_note(records: list[BenchRecord], node: bool) -> list[str]:
    """What the watts count, and the measured window they were averaged over."""
    runs = [run.get("power") or {} for record in records for run in record.runs]
    gpus = sorted({str(p["gpus"]) for p in runs if p.get("gpus")}) or ["?"]
    note = f"- W, GPU sockets: the sum of {'/'.join(gpus)} GPUs' socket power (amd-smi socket_power), not the node's"
    if node:
        note += "; W, whole node: " + ", ".join(sorted({p["node_source"] for p in runs if p.get("node_source")}))
    else:
        why = next((p["node_error"] for p in runs if p.get("node_error")), "the whole node's power was not measured")
        note += f"; {why[0].lower() + why[1:]}"
    windows = sorted({p["window"]["found"] for p in runs if (p.get("window") or {}).get("found")})
    if windows:
        note += f". Averaged over each run's measured window ({'; '.join(windows)})"
    return [note]


def serving_table(record: BenchRecord) -> list[str]:
    node = _node_measured([record])
    power_head = " W, GPU sockets | tok/s/W, GPU sockets |" + (" W, whole node | tok/s/W, whole node |" if node else "")
    lines = [heading(record), "",
             "| sustained RPS (achieved) | requested RPS | tok/s/node | TTFT p50 / p95 | success | cache hit |" + power_head,
             "|---|---|---|---|---|---|---|---|" + ("---|---|" if node else "")]
    for run in sorted(record.runs, key=lambda r: float(r["rate"])):
        figures = run.get("figures") or {}
        if not figures:
            lines.append(f"| not measured: {(run.get('error') or '')[:80]} | {run['rate']} | | | | | | |" + (" | |" if node else ""))
            continue
        achieved = _number(figures.get("achieved_rps"), ".2f")
        if record.knee_achieved_rps is not None and figures.get("achieved_rps") == record.knee_achieved_rps:
            achieved += " (knee)"
        ttft = f"{_number(figures.get('ttft_p50_s'), '.2f')} s / {_number(figures.get('ttft_p95_s'), '.2f')} s"
        hit = _number(figures.get("cache_hit_rate"), ".0%")
        lines.append(f"| {achieved} | {run['rate']} | {_number(figures.get('output_tok_s'), '.0f')} | {ttft}"
                     f" | {figures['success']:.0%} | {hit}" + _power_cells(run, "tok_s_per_w", node))
    limit = record.ttft_p95_limit_s
    knee = (f"**{record.knee_achieved_rps:.2f} RPS achieved** (asked for {record.knee_requested_rps})"
            if record.knee_achieved_rps is not None else "none of the rates")
    lines += ["", f"Knee (highest achieved rate with TTFT p95 <= {limit:g} s and 100% success): {knee}"]
    return lines + _notes(record) + _power_note([record], node)


def single_stream_table(records: list[BenchRecord]) -> list[str]:
    node = _node_measured(records)
    power_head = " W, GPU sockets | tok/s/W, GPU sockets |" + (" W, whole node | tok/s/W, whole node |" if node else "")
    lines = [heading(records[0]), "",
             "| variant | output tok/s after the first token | end to end | TTFT p50 | requests |" + power_head,
             "|---|---|---|---|---|---|---|" + ("---|---|" if node else "")]
    notes = []
    for record in records:
        for run in record.runs:
            figures = run.get("figures") or {}
            lines.append(f"| {record.variant} | {_number(figures.get('output_tok_s_after_first'), '.1f')}"
                         f" | {_number(figures.get('output_tok_s_end_to_end'), '.1f')} | {_number(figures.get('ttft_p50_s'), '.2f')} s"
                         f" | {figures.get('completed', 0)} of {figures.get('requests', 0)}"
                         + _power_cells(run, "tok_s_per_w_after_first", node))
        notes += _notes(record)
    lines.append("")
    lines.append(f"The write-up measured {PUBLISHED_SINGLE_STREAM_TOK_S} tok/s single stream (after the first token).")
    return lines + notes + _power_note(records, node)


def _notes(record: BenchRecord) -> list[str]:
    notes = [f"- {line}" for line in scan.describe(record.findings)]
    if record.outcome != "passed":
        notes.append(f"- **{record.outcome}** — {record.reason}")
    hit = next((r["figures"].get("cache_hit_source") for r in record.runs if (r.get("figures") or {}).get("cache_hit_source")), None)
    if hit:
        notes.append(f"- cache hit from the {hit}")
    return ([""] + notes) if notes else []


def render_bench_markdown(records: list[BenchRecord]) -> str:
    if not records:
        return "_no bench records_\n"
    out = []
    order = sorted(records, key=lambda r: (Version(r.pin), r.workload, r.pristine, r.variant))
    for record in order:
        if record.workload == "serving":
            out += serving_table(record) + [""]
    streams: dict[tuple, list[BenchRecord]] = {}
    for record in order:
        if record.workload == "single-stream":
            streams.setdefault((record.pin, record.pristine, record.profile), []).append(record)
    for group in streams.values():
        out += single_stream_table(group) + [""]
    return "\n".join(out)


def plot_points(record: BenchRecord) -> list[tuple[float, float, float, float]]:
    """(achieved RPS, tok/s/node, TTFT p50, TTFT p95) of each measured run, by achieved rate: the plot's points."""
    runs = [r["figures"] for r in record.runs if (r.get("figures") or {}).get("achieved_rps") is not None]
    return sorted((f["achieved_rps"], f["output_tok_s"], f["ttft_p50_s"], f["ttft_p95_s"]) for f in runs)


def plot_serving(record: BenchRecord, path: Path) -> Path:
    """tok/s/node and TTFT p50/p95 against the achieved rate, the knee marked, the write-up's points
    beside ours (at the rates it published)."""
    try:
        import matplotlib
    except ImportError:
        raise SglpatchError(f"{path.name}: the bench plot needs matplotlib: pip install 'sglpatch[bench]' "
                            "(nox's matrix-env has it)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = plot_points(record)
    rates = [point[0] for point in points]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    published = sorted(PUBLISHED_SERVING.items())
    top.plot(rates, [point[1] for point in points], "o-", label=f"sglang {record.pin} ({record.variant})")
    top.plot([p[0] for p in published], [p[1][0] for p in published], "s--", color="grey", alpha=0.7,
             label="write-up (published, tuned fp4 MoE)")
    top.set_ylabel("tok/s/node")
    top.legend(loc="upper left")
    bottom.plot(rates, [point[2] for point in points], "o-", label="TTFT p50")
    bottom.plot(rates, [point[3] for point in points], "^-", label="TTFT p95")
    bottom.plot([p[0] for p in published], [p[1][2] for p in published], "s--", color="grey", alpha=0.7,
                label="write-up TTFT p95")
    bottom.axhline(record.ttft_p95_limit_s, color="red", linewidth=0.8, linestyle=":", label=f"knee limit {record.ttft_p95_limit_s:g} s")
    bottom.set_ylabel("TTFT (s)")
    bottom.set_xlabel("sustained request rate, achieved (completed requests / measured s)")
    if record.knee_achieved_rps is not None:
        for axis in (top, bottom):
            axis.axvline(record.knee_achieved_rps, color="red", linewidth=1.0)
        top.annotate(f"knee {record.knee_achieved_rps:.2f} RPS", (record.knee_achieved_rps, top.get_ylim()[1] * 0.9), color="red")
    bottom.legend(loc="upper left")
    figure.suptitle(f"{record.profile} v{record.profile_version}, {record.quantization}\n"
                    f"sglang {record.pin}, {'pristine image' if record.pristine else 'series v' + record.series_version}",
                    fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
