"""Bench receipts: one JSON record per measured run of a workload on a pin and launch variant.

A record holds everything needed to trust or redo a figure: pin, series version and hash, the
image (digest and base, patched or pristine), GPU model and count, ROCm and driver version, the
launch profile (name, version, quantization, the exact launch arguments), the model and the hash
of its config.json, and per client run the exact command, the raw per-request file, the figures
computed from it, the power sampled during it and the findings of the slow-path scanners.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sglpatch.cache import write_atomically
from sglpatch.matrix.records import FAILED, PASSED, SKIPPED, Part, combine, json_objects
from sglpatch.rocm_checks import bench_metrics


@dataclass
class BenchRecord:
    workload: str  # "serving" or "single-stream"
    pin: str
    variant: str  # the launch variant (profile, and the variant of it the bench also runs)
    series_version: str
    series_hash: str
    profile: str
    profile_version: int
    quantization: str
    outcome: str = SKIPPED
    reason: str = ""
    pristine: bool = False  # the released image without the series (what the series buys, by compare)
    image_digest: str = ""
    base_image: str = ""
    environment: dict = field(default_factory=dict)  # gpu, gpu_count, hip, rocm_version, amdgpu_driver
    model: str = ""
    model_config_hash: str = ""
    launch: list[str] = field(default_factory=list)
    env: dict = field(default_factory=dict)
    runs: list[dict] = field(default_factory=list)  # rate, command, output_file, figures, power, error
    knee_rps: float | None = None
    ttft_p95_limit_s: float = bench_metrics.KNEE_TTFT_P95_S
    findings: dict = field(default_factory=dict)
    parts: list[Part] = field(default_factory=list)
    log: str = ""
    kind: str = "bench"
    finished: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    @property
    def record_id(self) -> str:
        return f"bench-{self.workload}-{self.pin}-{self.variant}" + ("-pristine" if self.pristine else "")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "BenchRecord":
        data = dict(data)
        data["parts"] = [Part(**part) for part in data.get("parts", [])]
        return cls(**data)

    def settle(self) -> None:
        self.outcome, self.reason = combine(self.parts)


def measured_run(raw: dict) -> dict:
    """One client run as bench_run reported it, with tok/s/W beside its throughput."""
    run = dict(raw)
    figures = run.get("figures") or {}
    watts = (run.get("power") or {}).get("node_w_mean")
    for key in ("output_tok_s", "output_tok_s_after_first"):
        if figures.get(key) is not None and watts:
            figures[key.replace("output_tok_s", "tok_s_per_w")] = figures[key] / watts
    if figures:
        run["figures"] = figures
    return run


def judge(record: BenchRecord, healthy_s, runs: list[dict], error: str = "") -> None:
    """The parts of a record: the server came up, every run measured, power sampled in each."""
    record.parts.append(Part("server healthy", PASSED if healthy_s is not None else FAILED,
                             f"after {healthy_s} s" if healthy_s is not None else f"not healthy: {error or 'see the server log'}"))
    if healthy_s is None:
        return
    broken = [f"rate {r.get('rate')}: {r.get('error') or 'exit ' + str(r.get('exit'))}" for r in runs
              if not r.get("figures") or r.get("exit") != 0]
    record.parts.append(Part("every client run measured", FAILED if broken or not runs else PASSED,
                             "; ".join(broken)[:600] if broken else f"{len(runs)} run(s)" if runs else error or "no run"))
    unpowered = [f"rate {r.get('rate')}: {(r.get('power') or {}).get('error')}" for r in runs
                 if not (r.get("power") or {}).get("node_w_mean")]
    record.parts.append(Part("GPU power sampled through every run", SKIPPED if unpowered else PASSED,
                             "; ".join(unpowered)[:600] if unpowered else
                             ", ".join(sorted({(r.get("power") or {}).get("source", "") for r in runs}))))


def write_bench_record(record: BenchRecord, folder: Path) -> Path:
    path = folder / f"{record.record_id}.json"
    write_atomically(path, record.to_json() + "\n")
    return path


def read_bench_records(folder: Path) -> list[BenchRecord]:
    """Every bench record under ``folder`` (recursively, as CI artifacts land)."""
    return [BenchRecord.from_dict(data) for data in json_objects(folder) if data.get("kind") == "bench"]
