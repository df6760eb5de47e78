"""The ROCm CI plan: which jobs run for an event, what each runs, and the node-hours it costs.

One job per pin on one runner (a whole 8-GPU node), run by ``sglpatch matrix job PIN --event E``
(``sglpatch.rocm.job``): the patched image is built once, each server is started once per
distinct launch configuration and shared by the checks that launch the same one. The matrix cells
serve the synthetic checkpoint the job writes (four TP2 servers on the node at once, in lanes);
the full model serves the gate and the bench, one server at a time. Events:

- ``pr``: the pins whose patch renditions changed, plus the newest pin; the matrix (build, load,
  spec depths 1-6) on the synthetic checkpoint;
- ``nightly``: every pin; the same;
- ``weekly`` (and a manual run of the workflow): the newest pin; the full model's accuracy gate
  and the bench (serving sweep and single stream). Any other pin on demand:
  ``sglpatch matrix job PIN --event weekly``.

Node-hours are estimates, and every place that shows them says so (the text, ``--json``, the
GitHub outputs): from recorded durations (the ``seconds`` of ROCm cell records, the job records'
image builds, server starts and baselines, each bench record's runs; only records the runner
stamped as made on a ROCm GPU, never the stand-in image's) where there are some, else
from the stated defaults below, and each estimate names which of its figures were recorded and
which are defaults. A bench workload is estimated per launch variant (single stream: as shipped
and custom-all-reduce, each its own record and server), so two variants' records are never
averaged into one. The estimate counts exactly the server starts the job makes and the order it
makes them in: ``job_plan.job_groups`` and ``job_plan.phases`` decide both for the runner and the
estimate (load and the depth-5 spec cell launch the profile as shipped and share one; lanes run at
once, so a phase of lanes costs its longest lane, spec checks waiting for the baselines).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from sglpatch.matrix import job_plan
from sglpatch.plumbing.processes import user_git_env
from sglpatch.plumbing.project import Project
from sglpatch.rocm.constants import ROCM_GPU
from sglpatch.rocm.profiles import PROFILES, variants
from sglpatch.serving.profile import load_profile

EVENTS = ("pr", "nightly", "weekly")
DEFAULT_RUNNER = ["self-hosted", "linux-mi35x-gpu-8"]
# Seconds, where no record says otherwise. Stated, not measured: no ROCm runner has run them yet;
# the first job record of a runner replaces each with what it took.
DEFAULT_SECONDS = {
    # The released image (tens of GB) is pulled once per runner and kept by its engine, so a job
    # pays the layer-cache lookup and the series' own layer (git apply, the check scripts); the
    # first pull on a fresh runner (~10-20 min) is not a per-job cost and is not counted.
    "image": 120,
    # glm_checkpoint.py --size rocm writes 1.0 GB of seeded random bytes: 4-8 s with the standard
    # library, 18 s with transformers' import, on the 2-core development machine (shared); with a
    # container's start and a slower disk, a minute.
    "checkpoint": 60,
    # A TP2 server of the 1.0 GB synthetic checkpoint: Python, torch and two ranks' distributed
    # start (~40 s), weights in seconds, CUDA graphs of target and draft and the kernels' JIT load
    # from the image (~1-2 min): 2-3 minutes, the upper end taken.
    "server-start-checkpoint": 180,
    "server-start": 900,  # the full MXFP4 model (hundreds of GB) from local disk at TP8, and warm-up
    "build": 180,  # hipcc of the series' JIT kernel headers in the image (~1 min each, torch's import)
    # A check's own time, against a server already up, on the synthetic checkpoint: a container's
    # start and some hundred tokens of a model that decodes far faster than GLM-5.2.
    "load": 60,  # one generate and /server_info
    "spec": 120,  # 8 greedy prompts of 64 tokens, a decode of 512, a burst of 32 x 128
    "baseline": 60,  # the spec cells' greedy outputs or decode speed, both without speculation
    "accuracy": 1200,  # 200 GSM8K questions, 5-shot, on the full model
    # The bench, per launch variant (each its own server and record), on the full model:
    "bench-serving": 2 * 3600,  # six rates of ~2 minutes each, then upward to the knee, warm-ups
    "bench-single-stream": 1200,  # 16 requests of 10k in / 1.5k out, one at a time
}
RECORDED, DEFAULT = "recorded", "default"


@dataclass
class Job:
    pin: str
    event: str
    sessions: list[str]
    launches: list[str]  # one line per server start: what it launches and the checks it serves
    seconds: float  # an estimate
    # Per figure the estimate used (an image build, a server start, a check, a bench variant):
    # "recorded" (the mean of ROCm records) or "default" (DEFAULT_SECONDS, stated, not measured).
    figures: dict[str, str] = field(default_factory=dict)
    groups: list[job_plan.Group] = field(default_factory=list, repr=False)

    @property
    def node_hours(self) -> float:
        """Estimated, like ``seconds``."""
        return round(self.seconds / 3600, 2)

    @property
    def sources(self) -> list[str]:
        return [f"{key}: {source}" for key, source in sorted(self.figures.items())]

    def estimate_from(self) -> str:
        """Which figures of the estimate were recorded and which are defaults, in words."""
        return describe_sources(self.figures)

    @property
    def id(self) -> str:
        return f"rocm-{self.pin}"

    @property
    def door(self) -> str:
        return f'nox -s "rocm-job({self.pin})" -- --event {self.event}'


def sessions_for(event: str, pin: str) -> tuple[list[str], list[str]]:
    """(the nox sessions of one pin's job, one line per server start the job makes)."""
    items = job_plan.items_for(event)
    return [item.session(pin) for item in items], job_plan.server_lines(job_plan.job_groups(items), pin)


def describe_sources(figures: dict[str, str]) -> str:
    recorded = sorted(key for key, source in figures.items() if source == RECORDED)
    defaults = sorted(key for key, source in figures.items() if source == DEFAULT)
    said = []
    if recorded:
        said.append("recorded durations: " + ", ".join(recorded))
    if defaults:
        said.append("stated defaults (sglpatch.matrix.plan.DEFAULT_SECONDS, not measured): " + ", ".join(defaults))
    return "; ".join(said) or "nothing"


def bench_key(workload: str, variant: str) -> str:
    return f"bench-{workload} {variant}"


def made_on_a_rocm_gpu(data: dict) -> bool:
    """Whether a record says the runner made it on a ROCm GPU (``rocm.options.device_stamp``). A
    record from the stand-in image, or one that names no device, measured no GPU's time."""
    return data.get("device") == ROCM_GPU


def recorded_seconds(records_dir: Path | None) -> dict[str, float]:
    """Mean recorded seconds per ROCm check, per bench workload and launch variant, and per image
    build, server start and baseline of the job records, in a folder of records; only records
    made on a ROCm GPU (``made_on_a_rocm_gpu``) count."""
    if records_dir is None or not records_dir.is_dir():
        return {}
    totals: dict[str, list[float]] = {}
    for path in sorted(records_dir.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        if not isinstance(data, dict) or not made_on_a_rocm_gpu(data):
            continue
        if data.get("kind") == "bench":
            seconds = sum(run.get("seconds") or 0 for run in data.get("runs", []))
            if seconds:  # one record per variant: each variant's own mean, never the variants' mean
                totals.setdefault(bench_key(data["workload"], data.get("variant", "as-shipped")), []).append(seconds)
        elif data.get("kind") == "rocm-job":
            if data.get("image_s"):
                totals.setdefault("image", []).append(float(data["image_s"]))
            checkpoint = data.get("checkpoint") or {}
            if checkpoint.get("seconds") and not checkpoint.get("error"):
                totals.setdefault("checkpoint", []).append(float(checkpoint["seconds"]))
            for server in data.get("servers", []):
                if server.get("serving") and server.get("seconds"):
                    key = "server-start-checkpoint" if server.get("checkpoint") == "synthetic" else "server-start"
                    totals.setdefault(key, []).append(float(server["seconds"]))
            for baseline in data.get("baselines", []):
                if not baseline.get("error") and baseline.get("seconds"):
                    totals.setdefault("baseline", []).append(float(baseline["seconds"]))
        elif data.get("tier") == "rocm" and data.get("outcome") in ("passed", "failed") and data.get("seconds"):
            totals.setdefault(data["check"], []).append(float(data["seconds"]))
    return {key: sum(values) / len(values) for key, values in totals.items()}


def _step_keys(step: job_plan.Step) -> list[tuple[str, str]]:
    """(the key of a recorded duration, the key of its default) for each part of a step's time."""
    if step.kind in job_plan.BASELINES:
        return [("baseline", "baseline")]
    if step.kind == "bench":
        workload = step.item.workload
        return [(bench_key(workload, variant), f"bench-{workload}") for variant in variants(load_profile(PROFILES[workload]))]
    return [(step.kind, step.kind)]


def estimate(event: str, pin: str, recorded: dict[str, float]) -> Job:
    """The job's estimated seconds: the image once, the synthetic checkpoint once where a group
    serves it, then phase by phase as ``job_plan.phases`` runs them: a lane is its servers'
    starts and its steps' own times in turn (a bench step: each of its variants'; a spec step not
    before the baselines are done), a phase its longest lane. A cell record's seconds are its
    check's alone, without its server's start."""
    items = job_plan.items_for(event)
    groups = job_plan.job_groups(items)
    figures: dict[str, str] = {}

    def seconds(key: str, default: str | None = None) -> float:
        if key in recorded:
            figures[key] = RECORDED
            return recorded[key]
        figures[key] = DEFAULT
        return DEFAULT_SECONDS[default or key]

    total = seconds("image")
    if job_plan.needs_checkpoint(groups):
        total += seconds("checkpoint")
    for phase in job_plan.phases(groups):
        baselines_done, lane_ends = 0.0, []
        for lane in phase:  # lane 0 first: it carries the baselines' group first
            at = 0.0
            for group in lane:
                if group.launches:
                    at += seconds("server-start-checkpoint" if group.synthetic else "server-start") * len(group.launches)
                for step in group.steps:
                    if step.kind == "spec":
                        at = max(at, baselines_done)
                    at += sum(seconds(key, default) for key, default in _step_keys(step))
                    if step.kind in job_plan.BASELINES:
                        baselines_done = at
            lane_ends.append(at)
        total += max(lane_ends)
    return Job(pin, event, [item.session(pin) for item in items], job_plan.server_lines(groups, pin), total, figures, groups)


def changed_pins(project: Project, changed_files: list[str]) -> list[str]:
    """Pins whose patch rendition (or the series, pins or lock that decide them) a change touches."""
    pins = [pin.version for pin in project.pins().pins]
    root = project.root.resolve()
    touched = {str((root / name).resolve()) for name in changed_files}
    if any(name in ("patches/series", "upstream/pins.toml", "series.lock") for name in changed_files):
        return pins
    affected = []
    for patch in project.series().patches:
        for version in pins:
            rendition = patch.for_version(version)
            if rendition is not None and str(Path(rendition.path).resolve()) in touched:
                affected.append(version)
    return sorted(set(affected), key=Version)


def plan(project: Project, event: str, *, changed_files: list[str] | None = None, records_dir: Path | None = None) -> list[Job]:
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}; events: {', '.join(EVENTS)}")
    pins = sorted((pin.version for pin in project.pins().pins), key=Version)
    if event == "pr":
        chosen = set(changed_pins(project, changed_files or [])) | {pins[-1]}
        pins = [pin for pin in pins if pin in chosen]
    elif event == "weekly":
        pins = pins[-1:]  # the full model on the newest pin; any other on demand (sglpatch matrix job)
    recorded = recorded_seconds(records_dir)
    return [estimate(event, pin, recorded) for pin in pins]


def git_changed_files(root: Path, base: str) -> list[str]:
    """Files that differ between ``base`` and HEAD (three dots: since they forked)."""
    done = subprocess.run(["git", "diff", "--name-only", f"{base}...HEAD"], cwd=root, capture_output=True, text=True,
                          timeout=120, env=user_git_env())
    if done.returncode != 0:
        raise ValueError(f"git diff against {base} failed: {done.stderr.strip()[-300:]}")
    return done.stdout.split()


def total_figures(jobs: list[Job]) -> dict[str, str]:
    """Per figure over all jobs: recorded where every job that used it had it recorded, else default."""
    figures: dict[str, str] = {}
    for job in jobs:
        for key, source in job.figures.items():
            figures[key] = DEFAULT if DEFAULT in (source, figures.get(key)) else RECORDED
    return figures


def render(jobs: list[Job], event: str) -> str:
    lines = [f"ROCm CI plan for {event}: {len(jobs)} job(s), one per pin on one runner, "
             f"estimated {sum(j.node_hours for j in jobs):.2f} node-hours (an estimate from "
             f"{describe_sources(total_figures(jobs))})"]
    for job in jobs:
        lines.append(f"- {job.id}: estimated {job.node_hours:.2f} node-hours; {len(job.launches)} server start(s)")
        lines.append(f"    {job.door}")
        if job_plan.needs_checkpoint(job.groups):
            lines.append("    the synthetic checkpoint written once in the image (glm_checkpoint.py --size rocm), "
                         "mounted into every server marked so")
        number = 0
        for phase in job_plan.phases(job.groups):
            for lane, groups in enumerate(phase):
                at = ""
                if len(phase) > 1:
                    gpus, port = job_plan.lane_resources(lane)
                    at = f" [lane {lane}, at once with the other lanes: GPUs {gpus}, port {port}]"
                for group in groups:
                    number += 1
                    where = ", ".join(launch.name for launch in group.launches) or "no server"
                    lines.append(f"    {number}. {where}{at}: " + ", ".join(
                        f'nox -s "{step.label(job.pin)}"' if step.item else step.label(job.pin) for step in group.steps))
    return "\n".join(lines)


def to_json(jobs: list[Job], event: str) -> dict:
    """The plan as ``sglpatch matrix plan --json`` prints it: every node-hour figure named an
    estimate, beside which of its durations were recorded and which are defaults."""
    return {
        "event": event,
        "jobs": [{"id": job.id, "pin": job.pin, "event": job.event, "sessions": job.sessions, "launches": job.launches,
                  "door": job.door, "estimated_seconds": job.seconds, "estimated_node_hours": job.node_hours,
                  "estimate_durations": job.figures, "estimate_from": job.estimate_from()} for job in jobs],
        "estimated_node_hours": round(sum(job.node_hours for job in jobs), 2),
        "estimate_from": describe_sources(total_figures(jobs)),
    }


def github_outputs(jobs: list[Job], runner: list[str]) -> str:
    """``jobs=`` (the job matrix, each job's estimated node-hours beside where the estimate came
    from) and ``runner=`` lines for $GITHUB_OUTPUT."""
    include = [{"id": job.id, "pin": job.pin, "event": job.event, "sessions": json.dumps(job.sessions),
                "estimated_node_hours": job.node_hours, "estimate_from": job.estimate_from()} for job in jobs]
    return (f"jobs={json.dumps({'include': include}, separators=(',', ':'))}\n"
            f"runner={json.dumps(runner, separators=(',', ':'))}\n")
