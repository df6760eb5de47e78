"""The ROCm CI plan: which jobs run for an event, what each runs, and the node-hours it costs.

One job per pin on one runner (a whole 8-GPU node): the patched image is built once and every
session of the pin runs in it in sequence. Events:

- ``pr``: the pins whose patch renditions changed, plus the newest pin; the matrix and the gate;
- ``nightly``: every pin; the matrix and the gate;
- ``weekly`` (and on demand): every pin; the bench (serving sweep and single stream).

Node-hours are estimated from recorded durations (the ``seconds`` of ROCm records, or the bench
runs' own seconds) where there are some, else from the defaults below, and the plan says which.
A server start loads a model of several hundred gigabytes, so the estimate counts one start per
distinct launch configuration of a job: load, accuracy and the depth-5 spec cell launch the
profile as shipped and are counted once.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from sglpatch.matrix.cells import DEPTHS
from sglpatch.project import Project

EVENTS = ("pr", "nightly", "weekly")
DEFAULT_RUNNER = ["self-hosted", "linux-mi35x-gpu-8"]
# Seconds, where no record says otherwise. Stated, not measured: no ROCm runner has run them yet.
DEFAULT_SECONDS = {
    "image": 1800,  # pull the released ROCm image (tens of GB) and apply the series
    "server-start": 900,  # load the MXFP4 model (hundreds of GB) and warm up
    "build": 300,
    "load": 120,  # beyond its server start
    "spec": 600,  # greedy prompts, accept length, decode speed, a burst of 32
    "accuracy": 1200,  # 200 GSM8K questions
    "bench-serving": 2 * 3600,  # six rates of ~2 minutes each, then upward to the knee, warm-ups
    "bench-single-stream": 2 * 1200,  # two variants, 16 requests of 1.5k tokens each
}


@dataclass
class Job:
    pin: str
    sessions: list[str]
    launches: list[str]  # distinct server launch configurations
    seconds: float
    sources: list[str] = field(default_factory=list)  # where each estimate came from

    @property
    def node_hours(self) -> float:
        return round(self.seconds / 3600, 2)

    @property
    def id(self) -> str:
        return f"rocm-{self.pin}"


def sessions_for(event: str, pin: str) -> tuple[list[str], list[str]]:
    """(the nox sessions of one pin's job, the distinct server launches they need)."""
    if event == "weekly":
        return ([f"bench(rocm, {pin}, serving)", f"bench(rocm, {pin}, single-stream)"],
                ["serving: tp4dp2 as shipped", "single-stream: as shipped", "single-stream: custom-all-reduce"])
    sessions = [f"build(rocm, {pin})", f"load(rocm, {pin})"]
    sessions += [f"spec(rocm, {pin}, {depth})" for depth in DEPTHS]
    sessions.append(f"accuracy(rocm, {pin})")
    launches = ["profile as shipped (load, accuracy, spec depth 5)", "no speculative decoding (greedy baseline)"]
    launches += [f"spec depth {d}" for d in DEPTHS if d != 5]
    return sessions, launches


def recorded_seconds(records_dir: Path | None) -> dict[str, float]:
    """Mean recorded seconds per ROCm check (and per bench workload) in a folder of records."""
    if records_dir is None or not records_dir.is_dir():
        return {}
    totals: dict[str, list[float]] = {}
    for path in sorted(records_dir.rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        if data.get("kind") == "bench":
            seconds = sum(run.get("seconds") or 0 for run in data.get("runs", []))
            if seconds:
                totals.setdefault(f"bench-{data['workload']}", []).append(seconds)
        elif data.get("tier") == "rocm" and data.get("outcome") in ("passed", "failed") and data.get("seconds"):
            totals.setdefault(data["check"], []).append(float(data["seconds"]))
    return {key: sum(values) / len(values) for key, values in totals.items()}


def estimate(event: str, pin: str, recorded: dict[str, float]) -> Job:
    sessions, launches = sessions_for(event, pin)
    sources = []

    def seconds(key: str) -> float:
        if key in recorded:
            sources.append(f"{key}: recorded")
            return recorded[key]
        return DEFAULT_SECONDS[key]

    total = DEFAULT_SECONDS["image"]
    if event == "weekly":
        total += seconds("bench-serving") + seconds("bench-single-stream")
    else:
        # A recorded cell's seconds include its own server starts; a default adds them.
        total += seconds("build")
        for check, count in (("load", 1), ("spec", len(DEPTHS)), ("accuracy", 1)):
            total += seconds(check) * count
        if not {"load", "spec", "accuracy"} & recorded.keys():
            total += DEFAULT_SECONDS["server-start"] * len(launches)
    return Job(pin, sessions, launches, total, sorted(set(sources)) or ["defaults (sglpatch.matrix.plan.DEFAULT_SECONDS)"])


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
    recorded = recorded_seconds(records_dir)
    return [estimate(event, pin, recorded) for pin in pins]


def git_changed_files(root: Path, base: str) -> list[str]:
    """Files that differ between ``base`` and HEAD (three dots: since they forked)."""
    done = subprocess.run(["git", "diff", "--name-only", f"{base}...HEAD"], cwd=root, capture_output=True, text=True,
                          timeout=120)
    if done.returncode != 0:
        raise ValueError(f"git diff against {base} failed: {done.stderr.strip()[-300:]}")
    return done.stdout.split()


def render(jobs: list[Job], event: str) -> str:
    lines = [f"ROCm CI plan for {event}: {len(jobs)} job(s), one per pin on one runner, "
             f"{sum(j.node_hours for j in jobs):.2f} node-hours"]
    for job in jobs:
        lines.append(f"- {job.id}: {job.node_hours:.2f} node-hours ({', '.join(job.sources)}); "
                     f"{len(job.launches)} server launch(es)")
        lines += [f"    nox -s \"{session}\"" for session in job.sessions]
    return "\n".join(lines)


def github_outputs(jobs: list[Job], runner: list[str]) -> str:
    """``jobs=`` (the job matrix) and ``runner=`` lines for $GITHUB_OUTPUT."""
    include = [{"id": job.id, "pin": job.pin, "sessions": json.dumps(job.sessions), "node_hours": job.node_hours}
               for job in jobs]
    return (f"jobs={json.dumps({'include': include}, separators=(',', ':'))}\n"
            f"runner={json.dumps(runner, separators=(',', ':'))}\n")
