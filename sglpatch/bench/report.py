"""The bench's table in the write-up's shape, with power beside every throughput, and its plot.

Serving: | sustained RPS | tok/s/node | TTFT p50 / p95 | success | cache hit | W/node | tok/s/W |,
the knee marked; single stream: output speed after the first token and end to end, with power. Each
table's heading names the pin, the profile and its version, the quantization, the series and the
image. The plot (matplotlib) draws tok/s/node and TTFT p50/p95 against RPS, the knee, and the
write-up's published points as a reference.
"""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from sglpatch.bench import scan
from sglpatch.bench.records import BenchRecord
from sglpatch.bench.workloads import PUBLISHED_SERVING, PUBLISHED_SINGLE_STREAM_TOK_S
from sglpatch.errors import SglpatchError


def _number(value, spec: str, none: str = "—") -> str:
    return none if value is None else format(value, spec)


def heading(record: BenchRecord) -> str:
    env = record.environment or {}
    gpus = f"{env.get('gpu_count', '?')}x {env.get('gpu', 'GPU unknown')}"
    rocm = f"ROCm {env.get('rocm_version')}" if env.get("rocm_version") else "ROCm unknown"
    image = "pristine image (no series)" if record.pristine else f"series v{record.series_version} ({record.series_hash[:12]})"
    return (f"### {record.workload} — sglang {record.pin} — {record.profile} v{record.profile_version}"
            f" ({record.variant}) — {record.quantization} — {image} — {gpus}, {rocm}")


def serving_table(record: BenchRecord) -> list[str]:
    lines = [heading(record), "",
             "| sustained RPS | tok/s/node | TTFT p50 / p95 | success | cache hit | W/node | tok/s/W |",
             "|---|---|---|---|---|---|---|"]
    for run in sorted(record.runs, key=lambda r: float(r["rate"])):
        figures, power = run.get("figures") or {}, run.get("power") or {}
        rate = f"{run['rate']}" + (" (knee)" if record.knee_rps is not None and float(run["rate"]) == record.knee_rps else "")
        if not figures:
            lines.append(f"| {rate} | not measured: {(run.get('error') or '')[:80]} | | | | | |")
            continue
        ttft = f"{_number(figures.get('ttft_p50_s'), '.2f')} s / {_number(figures.get('ttft_p95_s'), '.2f')} s"
        hit = _number(figures.get("cache_hit_rate"), ".0%")
        lines.append(f"| {rate} | {_number(figures.get('output_tok_s'), '.0f')} | {ttft} | {figures['success']:.0%} | {hit}"
                     f" | {_number(power.get('node_w_mean'), '.0f')} | {_number(figures.get('tok_s_per_w'), '.3f')} |")
    limit = record.ttft_p95_limit_s
    lines += ["", f"Knee (highest rate with TTFT p95 <= {limit:g} s and 100% success): "
              + (f"**{record.knee_rps} RPS**" if record.knee_rps is not None else "none of the rates")]
    return lines + _notes(record)


def single_stream_table(records: list[BenchRecord]) -> list[str]:
    lines = [heading(records[0]), "",
             "| variant | output tok/s after the first token | end to end | TTFT p50 | W/node | tok/s/W | requests |",
             "|---|---|---|---|---|---|---|"]
    notes = []
    for record in records:
        for run in record.runs:
            figures, power = run.get("figures") or {}, run.get("power") or {}
            lines.append(f"| {record.variant} | {_number(figures.get('output_tok_s_after_first'), '.1f')}"
                         f" | {_number(figures.get('output_tok_s_end_to_end'), '.1f')} | {_number(figures.get('ttft_p50_s'), '.2f')} s"
                         f" | {_number(power.get('node_w_mean'), '.0f')} | {_number(figures.get('tok_s_per_w_after_first'), '.3f')}"
                         f" | {figures.get('completed', 0)} of {figures.get('requests', 0)} |")
        notes += _notes(record)
    lines.append("")
    lines.append(f"The write-up measured {PUBLISHED_SINGLE_STREAM_TOK_S} tok/s single stream (after the first token).")
    return lines + notes


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


def plot_serving(record: BenchRecord, path: Path) -> Path:
    """tok/s/node and TTFT p50/p95 against RPS, the knee marked, the write-up's points beside ours."""
    try:
        import matplotlib
    except ImportError:
        raise SglpatchError(f"{path.name}: the bench plot needs matplotlib: pip install 'sglpatch[bench]' "
                            "(nox's matrix-env has it)") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = sorted((r for r in record.runs if r.get("figures")), key=lambda r: float(r["rate"]))
    rates = [float(r["rate"]) for r in runs]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True)
    published = sorted(PUBLISHED_SERVING.items())
    top.plot(rates, [r["figures"]["output_tok_s"] for r in runs], "o-", label=f"sglang {record.pin} ({record.variant})")
    top.plot([p[0] for p in published], [p[1][0] for p in published], "s--", color="grey", alpha=0.7,
             label="write-up (published, tuned fp4 MoE)")
    top.set_ylabel("tok/s/node")
    top.legend(loc="upper left")
    bottom.plot(rates, [r["figures"]["ttft_p50_s"] for r in runs], "o-", label="TTFT p50")
    bottom.plot(rates, [r["figures"]["ttft_p95_s"] for r in runs], "^-", label="TTFT p95")
    bottom.plot([p[0] for p in published], [p[1][2] for p in published], "s--", color="grey", alpha=0.7,
                label="write-up TTFT p95")
    bottom.axhline(record.ttft_p95_limit_s, color="red", linewidth=0.8, linestyle=":", label=f"knee limit {record.ttft_p95_limit_s:g} s")
    bottom.set_ylabel("TTFT (s)")
    bottom.set_xlabel("sustained request rate (RPS)")
    if record.knee_rps is not None:
        for axis in (top, bottom):
            axis.axvline(record.knee_rps, color="red", linewidth=1.0)
        top.annotate(f"knee {record.knee_rps} RPS", (record.knee_rps, top.get_ylim()[1] * 0.9), color="red")
    bottom.legend(loc="upper left")
    figure.suptitle(f"{record.profile} v{record.profile_version}, {record.quantization}\n"
                    f"sglang {record.pin}, {'pristine image' if record.pristine else 'series v' + record.series_version}",
                    fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
