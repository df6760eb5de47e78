"""One ROCm job per pin: the patched image built once, each sglang server started once per launch
configuration and reused by every check that launches the same one, the checks in sequence; a
cell alone (``run_rocm_cell``) is a job of one cell. What runs, which checks share a server and
which lanes run at once is the job's plan (``sglpatch.matrix.job_plan``), the same the CI plan
estimates; the runner here carries it out. Of ``sglpatch.rocm`` this module alone runs the
matrix's and the bench's checks, so it alone imports them.

Mechanics: a server runs in a long-lived container (``sglpatch.rocm.server``); each check of its
group runs in a short container of the same image that joins the server container's network and
talks to it by URL; a check that needs no server (build) runs in its own container. Every
container carries our labels and the job's, and is stopped and removed when its group is done,
whatever happened. One record per cell (judged by ``sglpatch.matrix.rocm_judge``, the gate by
``sglpatch.bench.accuracy``) and one job record listing the servers started, which the plan reads
its durations from. Without a docker engine or ``/dev/kfd`` every record says skipped, with the
reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.apply.pin_under_test import prepare_pin
from sglpatch.bench import accuracy, on_rocm_node
from sglpatch.matrix.cells import Cell, validate_cell
from sglpatch.matrix.job_plan import Group, Item, Launch, Launches, Step, describe, job_groups, lane_resources, needs_checkpoint, phases, server_starts
from sglpatch.matrix.records import FAILED, PASSED, SKIPPED, CellRecord, Part, combine, last_json, matrix_dir, write_record
from sglpatch.matrix.rocm_judge import judge, judge_figures, run_figures
from sglpatch.plumbing.cache import write_atomically
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.project import Project
from sglpatch.rocm import containers
from sglpatch.rocm.checkpoint import write_checkpoint
from sglpatch.rocm.checks import serve_check
from sglpatch.rocm.constants import (CHECKPOINT_INSIDE, CHECKS_INSIDE, HF_INSIDE, LABEL_CELL, LABEL_JOB, LABEL_LAUNCH, LOGS_INSIDE,
                                     STATE_INSIDE)
from sglpatch.rocm.image import build_patched_image
from sglpatch.rocm.options import RocmOptions, device_stamp, unavailable_reason
from sglpatch.rocm.server import START_MARGIN_S, ServerContainer


def run_rocm_cell(project: Project, cell: Cell, options: RocmOptions | None = None, on_log=print) -> CellRecord:
    """One cell alone, for a person debugging it: a ROCm job of that one cell, reusing the pin's
    non-speculative baseline measured before on the same image where there is one."""
    validate_cell(cell)
    if cell.tier != "rocm":
        raise SglpatchError(f"{cell.label}: the ROCm tier runs rocm cells only")
    return run_job(project, cell.pin, [Item(cell.check, cell.depth)], options, on_log=on_log, reuse_baselines=True).records[0]


@dataclass
class JobResult:
    job: str
    pin: str
    records: list[CellRecord]  # one per matrix cell and gate, in the order of the items
    bench_records: list = field(default_factory=list)
    servers: list[dict] = field(default_factory=list)  # one per server start, in order
    reason: str = ""  # why nothing ran here
    path: Path | None = None  # the job record

    @property
    def outcomes(self) -> list[str]:
        return [r.outcome for r in self.records] + [r.outcome for r in self.bench_records]

    @property
    def outcome(self) -> str:
        outcomes = self.outcomes
        if outcomes and all(o == SKIPPED for o in outcomes):
            return SKIPPED
        return FAILED if FAILED in outcomes else PASSED


def job_name(pin: str, items: list[Item], event: str | None) -> str:
    if event:
        return f"rocm-job-{pin}-{event}"
    if len(items) == 1:
        return "rocm-job-" + items[0].record_id(pin).removeprefix("rocm-")
    return f"rocm-job-{pin}-{len(items)}-sessions"


def run_job(project: Project, pin: str, items: list[Item], options: RocmOptions | None = None, *,
            event: str | None = None, on_log=print, reuse_baselines: bool = False) -> JobResult:
    """Run ``items`` of one pin as one job (see the module's docstring); every record is written
    under build/matrix/records, the job's own beside them."""
    return _Job(project, pin, items, options or RocmOptions(), event, on_log, reuse_baselines).run()


class _Job:
    def __init__(self, project: Project, pin: str, items: list[Item], options: RocmOptions, event: str | None,
                 on_log, reuse_baselines: bool):
        self.project, self.pin, self.items, self.options, self.event = project, pin, items, options, event
        self.on_log, self.reuse_baselines = on_log, reuse_baselines
        self.name = job_name(pin, items, event)
        self.label = f"{self.name}-{os.getpid()}-{time.time_ns()}"  # this run's containers only
        self.out = matrix_dir(project)
        self.logs = self.out / "logs"
        self.state = self.out / "rocm-state" / pin
        self.checkpoint_dir = self.state / "checkpoint"
        self.checkpoint_error = ""
        self.series = project.series()
        self.records: dict[Item, CellRecord] = {}
        self.bench_records: list = []
        self.servers: list[dict] = []
        self.baseline_steps: list[dict] = []
        self.summary: dict = {}
        self._lock = threading.Lock()
        self._log = None
        self._cell_logs: set = set()
        # Set once the spec cells' baselines are measured (or known): spec checks in other lanes wait.
        self._baselines_ready = threading.Event()
        self._stopping = threading.Event()  # a lane failed or the job was interrupted: start nothing new

    # -- logging: everything to the job's log; a cell's own lines to its log too

    def emit(self, line: str, cell=None) -> None:
        with self._lock:
            for handle in (self._log, cell):
                if handle is not None and not handle.closed:
                    handle.write(line + "\n")
                    handle.flush()
        self.on_log(line)

    def run(self) -> JobResult:
        started = time.monotonic()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        job_log = self.logs / f"{self.name}.log"
        reason, client = unavailable_reason(self.options)
        with open(job_log, "w") as self._log:
            self.emit(f"# {self.name}: {', '.join(item.session(self.pin) for item in self.items)}")
            if reason:
                self.emit(f"skipped: {reason}")
                self._skip_all(reason)
            else:
                self.client = client
                try:
                    self._run_all()
                finally:
                    self._stopping.set()
                    with self._lock:
                        for handle in self._cell_logs:
                            handle.close()
                        self._cell_logs.clear()
                    containers.remove_ours(client, {LABEL_JOB: self.label})
                    # Written once per job: a runner that runs every pin keeps none of them.
                    shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
        self._log = None
        return self._write_job_record(reason, job_log, time.monotonic() - started)

    def _skip_all(self, reason: str) -> None:
        for item in self.items:
            if item.check == "bench":
                self.bench_records += on_rocm_node.run_bench(self.project, self.pin, item.workload, self.options, on_log=self.emit)
                continue
            record = self._new_record(item)
            record.parts.append(Part(f"{item.check} in a patched ROCm container", SKIPPED, reason))
            self._finish(record, self.logs / f"{record.cell_id}.log", 0.0, header=f"skipped: {reason}")

    def _run_all(self) -> None:
        image_started = time.monotonic()
        try:
            self.put = prepare_pin(self.project, self.pin)
            self.spec, self.digest = build_patched_image(self.client, self.put, self.options, self.emit)
        except SglpatchError as exc:
            self.emit(str(exc))
            for item in self.items:
                if item.check == "bench":  # the bench builds (and reports on) the image itself
                    self.bench_records += on_rocm_node.run_bench(self.project, self.pin, item.workload, self.options, on_log=self.emit)
                    continue
                record = self._new_record(item)
                record.parts.append(Part(f"{item.check} in a patched ROCm container", FAILED, str(exc)[:1000]))
                self._finish(record, self.logs / f"{record.cell_id}.log", 0.0, header=str(exc)[:1000])
            return
        self.summary.update(image_digest=self.digest, base_image=self.spec.base_image,
                            image_s=round(time.monotonic() - image_started, 2))
        self.launches = Launches(self.options.model, self.options.matrix_model)
        self.baseline_path = self.state / f"baseline-{self.digest.split(':')[-1][:12]}-{self._baseline_key()}.json"
        self.baseline = self._known_baseline() if self.reuse_baselines else None
        groups = job_groups(self.items, model=self.options.model, matrix_model=self.options.matrix_model,
                            baselines_known=self.baseline is not None)
        if self.baseline is not None or not any(group.baselines for group in groups):
            self._baselines_ready.set()
        self.baseline = self.baseline or {}
        self.emit(f"# {server_starts(groups)} server start(s): " + "; ".join(describe(groups, self.pin)))
        checkpoint_written = False
        for phase in phases(groups, self.options.gpus):
            if not checkpoint_written and needs_checkpoint([group for lane in phase for group in lane]):
                self._write_checkpoint()
                checkpoint_written = True
            if len(phase) == 1:
                for group in phase[0]:
                    self._run_group(group, None)
            else:
                self._run_lanes(phase)

    def _run_group(self, group: Group, lane: int | None) -> None:
        if group.steps[0].kind == "bench":
            self._run_bench(group)
        elif not group.launches:
            for step in group.steps:
                self._run_build(step.item)
        else:
            self._run_served(group, lane)

    def _run_lanes(self, lanes: list[list[Group]]) -> None:
        """Each lane's groups in turn, the lanes at once, each on its own GPUs and port. A lane that
        raises stops the others from starting new servers; the first error is raised here."""
        errors: list[BaseException] = []

        def lane_work(lane: int, groups: list[Group]) -> None:
            try:
                for group in groups:
                    if self._stopping.is_set():
                        return
                    self._run_group(group, lane if group.synthetic else None)
            except BaseException as exc:  # KeyboardInterrupt from a log callback too: the main thread re-raises it
                errors.append(exc)
                self._stopping.set()
                self._baselines_ready.set()  # no lane waits for baselines that will not come

        threads = [threading.Thread(target=lane_work, args=(lane, groups), name=f"{self.name}-lane-{lane}", daemon=True)
                   for lane, groups in enumerate(lanes)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def _write_checkpoint(self) -> None:
        self.summary["checkpoint"], self.checkpoint_error = write_checkpoint(
            self.client, self.digest, self.checkpoint_dir, self._labels(**{LABEL_CELL: f"{self.name}-checkpoint"}), self.emit)

    # -- records

    def _new_record(self, item: Item) -> CellRecord:
        record = CellRecord("rocm", item.check, self.pin, item.depth, self.series.version, self.series.digest(), SKIPPED,
                            device=device_stamp(self.options))
        with self._lock:
            self.records[item] = record
        return record

    def _finish(self, record: CellRecord, log_path: Path, seconds: float, header: str = "") -> None:
        if header:
            with open(log_path, "a") as handle:
                handle.write(header + "\n")
        record.outcome, record.reason = combine(record.parts)
        record.log = str(log_path)
        record.seconds = round(seconds, 2)
        write_record(record, self.out / "records")

    def _begin_cell(self, record: CellRecord, header: str):
        """(the cell's log, a function that writes a line to it and to the job's log)."""
        log_path = self.logs / f"{record.cell_id}.log"
        record.image_digest = self.digest
        record.tree = self.put.patched_tree
        record.figures["base_image"] = self.spec.base_image
        handle = open(log_path, "w")
        with self._lock:
            self._cell_logs.add(handle)

        def emit(line: str) -> None:
            self.emit(line, handle)

        emit.handle = handle
        emit(f"# {record.cell_id}: {header} (job {self.name}, log {self.logs / (self.name + '.log')})")
        return log_path, emit

    def _end_cell(self, emit) -> None:
        with self._lock:
            self._cell_logs.discard(emit.handle)
            emit.handle.close()

    def _labels(self, **extra: str) -> dict[str, str]:
        return {**self.spec.labels, LABEL_JOB: self.label, **extra}

    # -- steps

    def _run_build(self, item: Item) -> None:
        record = self._new_record(item)
        cell = Cell("rocm", item.check, self.pin, item.depth)
        log_path, emit = self._begin_cell(record, "in its own container, no server")
        started = time.monotonic()
        try:
            command = ["python3", f"{CHECKS_INSIDE}/build_check.py", *sorted({Path(k).name for k in self.put.touched_kernels})]
            run = containers.run_check(
                self.client, self.digest, command, self._labels(**{LABEL_CELL: record.cell_id}),
                containers.RunOptions(gpu=self.options.gpu, network=self.options.network, timeout=self.options.cell_timeout),
                emit)
            judge(cell, run, record)
        finally:
            self._end_cell(emit)
        self._finish(record, log_path, time.monotonic() - started)

    def _mounts(self, launch: Launch) -> dict:
        mounts = {str(self.state): (STATE_INSIDE, "rw"), str(self.logs): (LOGS_INSIDE, "rw"),
                  str(self.options.hf_cache): (HF_INSIDE, "rw"), **dict(launch.mounts)}
        if launch.synthetic:
            mounts[str(self.checkpoint_dir)] = (CHECKPOINT_INSIDE, "ro")
        elif Path(launch.model).is_absolute():
            mounts[launch.model] = (launch.model, "ro")
        return mounts

    def _run_served(self, group: Group, lane: int | None) -> None:
        launch = group.launches[0]
        server_log = f"{self.name}-server-{launch.slug}.log"
        lane_env, port = {}, serve_check.PORT
        if lane is not None:
            gpus, port = lane_resources(lane)
            lane_env = {"HIP_VISIBLE_DEVICES": gpus}
        where = f" (lane {lane}: GPUs {lane_env['HIP_VISIBLE_DEVICES']}, port {port})" if lane is not None else ""
        self.emit(f"# server {launch.name}{where} for {', '.join(step.label(self.pin) for step in group.steps)}")
        entry = {"launch": launch.name, "key": launch.key, "argv": list(launch.argv), "env": dict(launch.env),
                 "steps": [step.label(self.pin) for step in group.steps], "log": str(self.logs / server_log),
                 "checkpoint": "synthetic" if launch.synthetic else "model", "lane": lane, "port": port, **lane_env}
        with self._lock:
            self.servers.append(entry)
        if launch.synthetic and self.checkpoint_error:
            # No server without its checkpoint: every check of the group fails with why.
            report = {"serving": False, "healthy_s": None, "error": self.checkpoint_error}
            entry.update(serving=False, error=self.checkpoint_error)
            for step in group.steps:
                if step.item is None:
                    self._record_baseline(step, {"error": f"{launch.name}: {self.checkpoint_error}"[:600]}, 0.0)
                else:
                    self._run_against(step, launch, None, report, {"launch": launch.name, "container": ""})
            if group.baselines:
                self._baselines_ready.set()
            return
        server = ServerContainer(self.client, self.digest, launch, self._labels(**{LABEL_LAUNCH: launch.key}), self.options,
                                 self._mounts(launch), f"{LOGS_INSIDE}/{server_log}", self.emit, lane_env=lane_env, port=port)
        started = time.monotonic()
        try:
            if self._stopping.is_set():
                raise SglpatchError(f"{self.name} is stopping: the server {launch.name} was not started")
            report = server.start()
            entry.update(container=server.short_id, serving=bool(report.get("serving")), healthy_s=report.get("healthy_s"),
                         seconds=round(time.monotonic() - started, 2), error=report.get("error", ""))
            context = {"launch": launch.name, "container": server.short_id, "healthy_s": report.get("healthy_s"),
                       "log": entry["log"], "shared_by": entry["steps"], "port": port, **lane_env}
            for step in group.steps:
                if step.item is None:
                    self._run_baseline(step, launch, server, report)
                else:
                    self._run_against(step, launch, server, report, context)
        finally:
            if group.baselines:
                self._baselines_ready.set()
            server.stop()
            containers.remove_ours(self.client, {LABEL_JOB: self.label, LABEL_LAUNCH: launch.key})
            entry["held_s"] = round(time.monotonic() - started, 2)

    def _check(self, server: ServerContainer, launch: Launch, script: str, config: dict, labels: dict,
               emit=None) -> containers.ContainerRun:
        """A check's container, in the server container's network, talking to it by URL."""
        if self._stopping.is_set():
            # The job is ending (interrupted, or another lane failed): a container made now could
            # outlive the clean-up that is already running.
            return containers.ContainerRun(None, "the job is stopping", start_error="the job is stopping")
        return containers.run_check(
            self.client, self.digest, ["python3", f"{CHECKS_INSIDE}/{script}", json.dumps(config)], self._labels(**labels),
            containers.RunOptions(gpu=self.options.gpu, env=dict(launch.env), mounts=self._mounts(launch),
                                  network=f"container:{server.container.id}", timeout=self.options.cell_timeout),
            emit or self.emit)

    @staticmethod
    def _server_config(report: dict, server: ServerContainer, launch: Launch) -> dict:
        return {"url": f"http://127.0.0.1:{server.port}", "argv": list(launch.argv),
                "server": {key: report.get(key) for key in ("healthy_s", "gpu", "log")}}

    def _run_baseline(self, step: Step, launch: Launch, server: ServerContainer, report: dict) -> None:
        started = time.monotonic()
        report = server.still_serving(report)
        if not report.get("serving"):
            result = {"error": f"{launch.name}: the server was not healthy: {report.get('error', 'see the log')}"}
        else:
            run = self._check(server, launch, "serve_check.py", {"mode": step.kind, **self._server_config(report, server, launch)},
                              {LABEL_CELL: f"{self.name}-baseline-{step.kind}"})
            figures = last_json(run.log) or {}
            wanted = "outputs" if step.kind == "greedy" else "decode_tok_s"
            if figures.get(wanted) and not figures.get("error"):
                result = {wanted: figures[wanted]}
            else:
                why = "timed out" if run.timed_out else figures.get("error") or run.start_error or f"exit {run.exit_code}, no figures"
                result = {"error": f"{launch.name}: {why}"[:600]}
        self._record_baseline(step, result, time.monotonic() - started)

    def _record_baseline(self, step: Step, result: dict, seconds: float) -> None:
        with self._lock:
            self.baseline["plain" if step.kind == "greedy" else "plain_speed"] = result
            self.baseline["image"] = self.digest
            write_atomically(self.baseline_path, json.dumps(self.baseline, indent=1) + "\n")
            self.baseline_steps.append({"step": step.label(self.pin), "seconds": round(seconds, 2),
                                        "error": result.get("error", "")})

    def _run_against(self, step: Step, launch: Launch, server: ServerContainer | None, report: dict, context: dict) -> None:
        item = step.item
        record = self._new_record(item)
        cell = Cell("rocm", item.check, self.pin, item.depth)
        shown = f"against the server {launch.name} (container {server.short_id})" if server else f"without a server: {launch.name}"
        log_path, emit = self._begin_cell(record, shown)
        started = time.monotonic()
        try:
            if server is not None:
                report = server.still_serving(report)
            if report.get("serving"):
                config = {"mode": item.check, **self._server_config(report, server, launch)}
                script = "serve_check.py"
                if item.check == "spec":
                    if not self._baselines_ready.is_set():
                        emit("# waiting for the spec cells' baselines (measured in another lane)")
                    self._baselines_ready.wait(self.options.server_timeout + START_MARGIN_S + 2 * self.options.cell_timeout)
                    config.update(depth=item.depth, baseline=f"{STATE_INSIDE}/{self.baseline_path.name}")
                elif item.check == "accuracy":
                    script = "accuracy_check.py"
                    config.update(mode="attach", state=STATE_INSIDE, questions=accuracy.QUESTIONS, shots=accuracy.SHOTS)
                run = self._check(server, launch, script, config, {LABEL_CELL: record.cell_id}, emit)
                if run.start_error:
                    # The server may have died between the look above and the check joining its network.
                    report = server.still_serving(report)
            if report.get("serving"):
                figures = run_figures(item.check, run, record)
            else:
                # The server never came up (or died): the check fails with what was reported.
                figures = {"healthy_s": None, "error": report.get("error", "see the server log"),
                           "mismatch_lines": report.get("mismatch_lines") or [], "gpu": report.get("gpu", "")}
            if figures is not None:
                if item.check == "accuracy":
                    record.gpu = str(figures.pop("gpu", ""))
                    record.figures.update(figures)
                    record.parts += accuracy.judge(figures)
                else:
                    judge_figures(cell, figures, record, synthetic=launch.synthetic)
            record.figures["server"] = context
        finally:
            self._end_cell(emit)
        self._finish(record, log_path, time.monotonic() - started)

    def _run_bench(self, group: Group) -> None:
        # bench_run.py starts the workload's servers itself, one per variant, in one container (the
        # image build inside run_bench is a layer-cache hit of the one this job built).
        for step in group.steps:
            started = time.monotonic()
            records = on_rocm_node.run_bench(self.project, self.pin, step.item.workload, self.options, on_log=self.emit)
            self.bench_records += records
            for launch in group.launches:
                self.servers.append({"launch": launch.name, "key": launch.key, "argv": list(launch.argv), "env": dict(launch.env),
                                     "steps": [step.label(self.pin)], "started_by": "bench_run.py", "checkpoint": "model",
                                     "seconds": round(time.monotonic() - started, 2)})

    # -- the spec cells' baselines, kept per image so a cell run alone can reuse them

    def _baseline_key(self) -> str:
        # "plain_speed": a file from before the speed baseline moved off depth 3 is not reused.
        return hashlib.sha256((self.launches.plain().key + "plain_speed").encode()).hexdigest()[:12]

    def _known_baseline(self) -> dict | None:
        try:
            known = json.loads(self.baseline_path.read_text())
        except (OSError, ValueError):
            return None
        if known.get("plain", {}).get("outputs") and known.get("plain_speed", {}).get("decode_tok_s"):
            self.emit(f"# reusing the spec cells' baseline measured on this image: {self.baseline_path}")
            return known
        return None

    # -- the job's own record

    def _write_job_record(self, reason: str, job_log: Path, seconds: float) -> JobResult:
        records = [self.records[item] for item in self.items if item in self.records]
        data = {
            "kind": "rocm-job", "job": self.name, "pin": self.pin, "event": self.event, "device": device_stamp(self.options),
            "series_version": self.series.version, "series_hash": self.series.digest(),
            "sessions": [item.session(self.pin) for item in self.items], **self.summary,
            "server_starts": len(self.servers), "servers": self.servers, "baselines": self.baseline_steps,
            "cells": {record.cell_id: record.outcome for record in records},
            "bench": {f"{r.workload} {r.variant}": r.outcome for r in self.bench_records},
            "reason": reason, "log": str(job_log), "seconds": round(seconds, 2),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        path = self.out / "records" / f"{self.name}.json"
        write_atomically(path, json.dumps(data, indent=2, sort_keys=True) + "\n")
        return JobResult(self.name, self.pin, records, self.bench_records, self.servers, reason, path)
