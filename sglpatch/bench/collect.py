"""From what bench_run measured (one launch variant: its runs and server log) to a bench record."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

from sglpatch.bench import scan
from sglpatch.bench.records import BenchRecord, judge, measured_run
from sglpatch.rocm.checks import bench_metrics


def collect(template: BenchRecord, variant: str, measured: dict, *, ttft_p95_s: float = bench_metrics.KNEE_TTFT_P95_S) -> BenchRecord:
    """``template`` (pin, series, image, profile, ...) filled with one variant's runs, knee, findings
    and parts. ``measured`` is bench_run's entry for the variant."""
    record = replace(template, variant=variant, runs=[measured_run(r) for r in measured.get("runs", [])],
                     launch=list(measured.get("argv") or template.launch), env=dict(measured.get("env") or template.env),
                     ttft_p95_limit_s=ttft_p95_s, parts=[], findings={})
    if record.workload == "serving":
        knee = bench_metrics.knee([r["figures"] for r in record.runs if r.get("figures")], ttft_p95_s)
        if knee is not None:
            record.knee_achieved_rps, record.knee_requested_rps = knee["achieved_rps"], knee.get("requested_rps")
    log = Path(measured.get("server_log") or "")
    if log.is_file():
        record.findings = scan.scan(log.read_text(errors="replace"))
        record.log = str(log)
    judge(record, measured.get("healthy_s"), record.runs, measured.get("error", ""))
    record.settle()
    return record


def config_hash(model: Path) -> str:
    """sha256 of the model's config.json ('' where the model folder is not readable here)."""
    config = model / "config.json"
    return hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else ""
