"""Bench receipts: one JSON record per measured run of a workload on a pin and launch variant.

A record holds everything needed to trust or redo a figure: pin, series version and hash, the
image (digest and base, patched or pristine), GPU model and count, ROCm and driver version, the
launch profile (name, version, quantization, the exact launch arguments), the model and the hash
of its config.json, and per client run the exact command, the raw per-request file, the figures
computed from it, the power sampled over its measured window and the findings of the slow-path
scanners.

Power names what it counts: ``gpu_sockets_w_mean`` is the sum of the GPUs' socket power, and
``tok_s_per_w_gpu_sockets`` divides by it; ``node_w_mean`` and ``tok_s_per_w_node`` are there only
where the whole node's power was measured. Rates name theirs: ``requested_rps`` is the Poisson rate
the client was asked for, ``achieved_rps`` what completed per second of the measured duration; the
knee is on the achieved rate.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sglpatch.matrix.records import FAILED, PASSED, SKIPPED, Part, combine, json_objects
from sglpatch.plumbing.cache import write_atomically
from sglpatch.rocm.checks import bench_metrics


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
    device: str = ""  # the device the runner ran it on (``rocm.options.device_stamp``)
    model: str = ""
    model_config_hash: str = ""
    launch: list[str] = field(default_factory=list)
    env: dict = field(default_factory=dict)
    runs: list[dict] = field(default_factory=list)  # rate, command, output_file, figures, power, error
    knee_achieved_rps: float | None = None  # completed requests / measured seconds of the knee's run
    knee_requested_rps: float | None = None  # the Poisson rate that run asked for
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


POWER_COUNTS = {"gpu_sockets": "gpu_sockets_w_mean", "node": "node_w_mean"}


def measured_run(raw: dict) -> dict:
    """One client run as bench_run reported it, with tok/s/W beside its throughput: per watt of the
    GPU sockets, and per watt of the whole node where that was measured."""
    run = dict(raw)
    figures = run.get("figures") or {}
    power = run.get("power") or {}
    for counted, key in POWER_COUNTS.items():
        watts = power.get(key)
        for throughput in ("output_tok_s", "output_tok_s_after_first"):
            if figures.get(throughput) is not None and watts:
                figures[throughput.replace("output_tok_s", "tok_s_per_w") + f"_{counted}"] = figures[throughput] / watts
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
                 if not (r.get("power") or {}).get("gpu_sockets_w_mean")]
    record.parts.append(Part("GPU socket power sampled over every run's measured window", SKIPPED if unpowered else PASSED,
                             "; ".join(unpowered)[:600] if unpowered else
                             ", ".join(sorted({(r.get("power") or {}).get("source", "") for r in runs}))))


def write_bench_record(record: BenchRecord, folder: Path) -> Path:
    path = folder / f"{record.record_id}.json"
    write_atomically(path, record.to_json() + "\n")
    return path


def read_bench_records(folder: Path) -> list[BenchRecord]:
    """Every bench record under ``folder`` (recursively, as CI artifacts land)."""
    return [BenchRecord.from_dict(data) for data in json_objects(folder) if data.get("kind") == "bench"]
