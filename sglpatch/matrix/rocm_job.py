"""One ROCm job per pin: the patched image built once, each sglang server started once per launch
configuration and reused by every check that launches the same one, the checks in sequence.

A launch configuration is the exact ``sglang.launch_server`` argv and environment a check needs,
derived as the checks define it: the matrix cells from the launch profile and the depth
(``sglpatch.matrix.cells``), the accuracy gate and the bench from the bench's profiles
(``sglpatch.bench.rocm``). Checks whose configurations are equal share one server. In a pin's
matrix job load and the depth-5 spec cell launch the profile as shipped (MTP 5/1/6): one server;
every other depth is its own; so is the non-speculative run the spec cells' greedy outputs and
decode speed are compared with. ``job_groups`` decides this, and ``phases`` the order and what
runs at once, for the runner (``run_job``) and for the CI plan's estimate
(``sglpatch.matrix.plan``) alike.

The matrix cells (build, load, spec) serve a synthetic checkpoint the job writes once, in the
patched image, with the CPU probes' generator scaled (``glm_checkpoint.py --size rocm``: GLM-5's
architecture with its MTP layer and a Quark MXFP4 ``quantization_config`` keeping the MTP shared
expert bf16, random weights and zeroed final norms, about 1.0 GB), mounted read-only into every
server: the bugs the series fixes show when the draft layer is built and loaded and when the
kernels compile, at any size. It is served at TP2 (``SYNTHETIC_TP``), so four servers share the node at once, each on its
own GPUs and port (a lane). The full model (``RocmOptions.model``) serves only the accuracy gate
and the bench (the weekly job), and the matrix cells where ``matrix_model`` asks for it.

Mechanics: a server runs in a long-lived container (``serve_check.py`` in its serve mode); each
check of its group runs in a short container of the same image that joins the server container's
network and talks to it by URL; a check that needs no server (build) runs in its own container.
Every container carries our labels and the job's, and is stopped and removed when its group is
done, whatever happened. One record per cell (judged by ``sglpatch.matrix.rocm``, the gate by
``sglpatch.bench.accuracy``) and one job record listing the servers started, which the plan reads
its durations from. Without a docker engine or ``/dev/kfd`` every record says skipped, with the
reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.bench import accuracy
from sglpatch.bench import rocm as bench_rocm
from sglpatch.cache import write_atomically
from sglpatch.errors import SglpatchError
from sglpatch.matrix import containers
from sglpatch.matrix.cells import DEPTHS, PROFILE, Cell, depth_argv, matrix_dir
from sglpatch.matrix.pin import prepare_pin
from sglpatch.matrix.records import FAILED, PASSED, SKIPPED, CellRecord, Part, cell_id, combine, last_json, write_record
from sglpatch.matrix.rocm import (CHECKPOINT_INSIDE, HF_INSIDE, NODE_GPUS, STATE_INSIDE, RocmOptions, build_patched_image, judge,
                                  judge_figures, run_figures, unavailable_reason)
from sglpatch.profile import Profile, load_profile
from sglpatch.project import Project
from sglpatch.rocm_checks import serve_check

LABEL_JOB = "io.sglpatch.job"
LABEL_LAUNCH = "io.sglpatch.launch"
LOGS_INSIDE = "/sglpatch-logs"
CHECKS_INSIDE = f"{containers.TOOLS_DIR}/checks"
# serve_check's serve mode waits server_timeout for health after its GPU probe; the host gives it
# that, the probe's own limit, and a margin for the container and Python to start.
START_MARGIN_S = serve_check.GPU_PROBE_TIMEOUT_S + 120
# serve_check stops sglang with SIGTERM and gives it 120 s before SIGKILL; docker stop waits longer.
STOP_TIMEOUT_S = 150
# The synthetic checkpoint's tensor parallelism (glm_checkpoint.ROCM_TP: GLM-5's per-rank shapes
# at TP8): more than one rank, so the all-reduce paths and the aiter fusion's conditions are real.
SYNTHETIC_TP = 2
# sglang takes the ports after --port for its own (NCCL, dist-init): lanes' ports far apart.
LANE_PORT_STRIDE = 1000
CHECKPOINT_TIMEOUT_S = 1800  # writing ~1.0 GB of seeded random bytes takes seconds; a slow disk minutes


# -- what a job runs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Item:
    """One session of a job: a matrix cell (build, load, spec at a depth), the gate or a bench."""

    check: str  # build, load, spec, accuracy, bench
    depth: int | None = None
    workload: str | None = None  # bench only

    def session(self, pin: str) -> str:
        """The nox session that runs this item alone."""
        if self.check == "spec":
            return f"spec(rocm, {pin}, {self.depth})"
        if self.check == "bench":
            return f"bench(rocm, {pin}, {self.workload})"
        return f"{self.check}(rocm, {pin})"

    def record_id(self, pin: str) -> str:
        if self.check == "bench":
            return f"bench-{self.workload}-{pin}"
        return cell_id("rocm", self.check, pin, self.depth)


def items_for(event: str) -> list[Item]:
    """The sessions of one pin's job: on the weekly schedule (and on demand) what needs the full
    model, the accuracy gate and the bench; otherwise the matrix on the synthetic checkpoint (pull
    requests and the nightly run differ only in which pins run)."""
    if event == "weekly":
        return [Item("accuracy"), *[Item("bench", workload=workload) for workload in bench_rocm.PROFILES]]
    return [Item("build"), Item("load"), *[Item("spec", depth) for depth in DEPTHS]]


@dataclass(frozen=True)
class Launch:
    """One server launch configuration: equal argv and environment means one server."""

    name: str = field(compare=False)
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    mounts: tuple[tuple[str, tuple[str, str]], ...] = field(default=(), compare=False)  # follow from env

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps([self.argv, self.env]).encode()).hexdigest()[:12]

    @property
    def slug(self) -> str:
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-") + "-" + self.key[:8]

    @property
    def model(self) -> str:
        return self.argv[self.argv.index("--model-path") + 1]

    @property
    def synthetic(self) -> bool:
        """Served from the synthetic checkpoint the job writes."""
        return self.model == CHECKPOINT_INSIDE


class Launches:
    """The launch configurations of a pin's checks, derived the way each check defines its own.
    The matrix cells' (``shipped``, ``depth``, ``plain``) serve ``matrix_model``, or where that is
    None the synthetic checkpoint at ``SYNTHETIC_TP``; the gate and the bench serve ``model``."""

    def __init__(self, model: str | None = None, matrix_model: str | None = None):
        self.model = model
        self.matrix_model = matrix_model
        profile = load_profile(PROFILE)
        if matrix_model is None:
            profile = type(profile)(**{**profile.__dict__, "server": {**profile.server, "tp-size": SYNTHETIC_TP}})
        self.profile = profile

    def _model(self, profile: Profile) -> str:
        return self.model or os.environ.get("SGLPATCH_MODEL") or profile.model

    def _matrix(self) -> str:
        return self.matrix_model or CHECKPOINT_INSIDE

    @property
    def _on(self) -> str:
        return " (synthetic checkpoint)" if self.matrix_model is None else ""

    @staticmethod
    def _launch(name: str, profile: Profile, argv: list[str]) -> Launch:
        env, mounts = bench_rocm.launch_env(profile)
        return Launch(name, tuple(argv), tuple(sorted(env.items())), tuple(sorted(mounts.items())))

    def shipped(self) -> Launch:
        """load: the profile as shipped, MTP at its own depth."""
        return self._launch("profile as shipped" + self._on, self.profile, self.profile.server_args(self._matrix()))

    def depth(self, depth: int) -> Launch:
        return self._launch(f"EAGLE depth {depth}" + self._on, self.profile, depth_argv(self.profile, depth, self._matrix()))

    def plain(self) -> Launch:
        """The spec cells' greedy baseline: the profile without speculative decoding."""
        server = {k: v for k, v in self.profile.server.items() if not k.startswith("speculative-")}
        plain = type(self.profile)(**{**self.profile.__dict__, "server": server})
        return self._launch("no speculative decoding" + self._on, self.profile, plain.server_args(self._matrix()))

    def gate(self) -> Launch:
        """The accuracy gate's launch, as ``bench.rocm.run_accuracy`` makes it."""
        profile = load_profile(bench_rocm.PROFILES["single-stream"])
        return self._launch("profile as shipped", profile, profile.server_args(self._model(profile)))

    def bench(self, workload: str) -> tuple[Launch, ...]:
        """The servers ``bench_run.py`` starts for a workload, one per variant, as ``run_bench`` lists them."""
        profile = load_profile(bench_rocm.PROFILES[workload])
        return tuple(self._launch(f"{workload} {variant}", profile, profile.variant(variant).server_args(self._model(profile)))
                     for variant in bench_rocm.variants(profile))


BASELINES = {
    "greedy": "greedy outputs without speculative decoding (the spec cells' baseline)",
    "speed": "decode speed without speculative decoding (the spec cells' baseline)",
}
# Within a server's group: the baselines the spec cells compare with, load (is it up and answering),
# then the gate -- before the spec cells' bursts, since its accept length is the server's running
# average since start (it shares a server with them where the matrix serves the full model) --
# then the spec cells.
STEP_ORDER = {"greedy": 0, "speed": 0, "load": 1, "accuracy": 2, "spec": 3}


@dataclass(frozen=True)
class Step:
    kind: str  # an item's check, or a baseline ("greedy", "speed")
    item: Item | None = None

    def label(self, pin: str) -> str:
        return self.item.session(pin) if self.item else BASELINES[self.kind]


@dataclass
class Group:
    """Steps that run against the same servers: none (build), one launch configuration (the
    matrix and the gate), or a bench workload's variants, which ``bench_run.py`` starts in turn."""

    launches: tuple[Launch, ...]
    steps: list[Step]

    @property
    def synthetic(self) -> bool:
        """Served from the synthetic checkpoint: small enough to share the node with others."""
        return bool(self.launches) and all(launch.synthetic for launch in self.launches)

    @property
    def baselines(self) -> bool:
        return any(step.kind in BASELINES for step in self.steps)


def job_groups(items: list[Item], *, model: str | None = None, matrix_model: str | None = None,
               baselines_known: bool = False) -> list[Group]:
    """The job's steps grouped by the servers they need, in the order they run: serverless checks
    first, then the spec cells' baselines (the other cells compare with them), then one group per
    distinct launch configuration in the order of the items, then the bench. ``baselines_known``:
    the baselines were measured before on this image (a cell run alone reuses them)."""
    launches = Launches(model, matrix_model)
    serverless: list[Group] = []
    bench: list[Group] = []
    served: list[tuple[Launch, Step]] = []
    for item in items:
        if item.check == "build":
            serverless.append(Group((), [Step("build", item)]))
        elif item.check == "bench":
            bench.append(Group(launches.bench(item.workload), [Step("bench", item)]))
        elif item.check == "load":
            served.append((launches.shipped(), Step("load", item)))
        elif item.check == "accuracy":
            served.append((launches.gate(), Step("accuracy", item)))
        elif item.check == "spec":
            served.append((launches.depth(item.depth), Step("spec", item)))
        else:
            raise SglpatchError(f"a ROCm job has no check {item.check!r}")
    if not baselines_known and any(step.kind == "spec" for _, step in served):
        # Both baselines on the one server without speculation: what every depth, 3 included, is compared with.
        served[:0] = [(launches.plain(), Step("greedy")), (launches.plain(), Step("speed"))]
    by_launch: dict[Launch, Group] = {}
    for launch, step in served:
        by_launch.setdefault(launch, Group((launch,), [])).steps.append(step)
    for group in by_launch.values():
        group.steps.sort(key=lambda step: STEP_ORDER[step.kind])
    return serverless + list(by_launch.values()) + bench


def server_starts(groups: list[Group]) -> int:
    return sum(len(group.launches) for group in groups)


def needs_checkpoint(groups: list[Group]) -> bool:
    return any(group.synthetic for group in groups)


def phases(groups: list[Group], gpus: int = NODE_GPUS) -> list[list[list[Group]]]:
    """The order the groups run in: a list of phases, each a list of lanes that run at once, each
    lane a list of groups in turn. The serverless checks first, one at a time; then the groups on
    the synthetic checkpoint, dealt in order over ``gpus // SYNTHETIC_TP`` lanes of their own GPUs
    (the baselines' group first, on lane 0); then every group on the full model alone, since each
    of its servers takes the whole node."""
    serverless = [[[group]] for group in groups if not group.launches]
    synthetic = [group for group in groups if group.synthetic]
    whole_node = [[[group]] for group in groups if group.launches and not group.synthetic]
    count = max(1, min(len(synthetic), gpus // SYNTHETIC_TP))
    lanes = [synthetic[lane::count] for lane in range(count)] if synthetic else []
    return serverless + ([lanes] if lanes else []) + whole_node


def lane_resources(lane: int) -> tuple[str, int]:
    """(the GPUs a lane's servers see, as HIP_VISIBLE_DEVICES, their port)."""
    gpus = ",".join(str(gpu) for gpu in range(lane * SYNTHETIC_TP, (lane + 1) * SYNTHETIC_TP))
    return gpus, serve_check.PORT + lane * LANE_PORT_STRIDE


def server_lines(groups: list[Group], pin: str) -> list[str]:
    """One line per server start: what it launches and the steps it serves."""
    lines = []
    for group in groups:
        steps = ", ".join(step.label(pin) for step in group.steps)
        lines += [f"{launch.name}: {steps}" for launch in group.launches]
    return lines


def describe(groups: list[Group], pin: str) -> list[str]:
    """The server starts, then the steps that need none."""
    serverless = [f"no server: {step.label(pin)}" for group in groups if not group.launches for step in group.steps]
    return server_lines(groups, pin) + serverless


# -- a server held in its container ------------------------------------------------------------


class ServerContainer:
    """One sglang server (``serve_check.py`` in its serve mode) in a container of the patched image,
    held for the checks of its launch configuration."""

    def __init__(self, client, image: str, launch: Launch, labels: dict[str, str], options: RocmOptions,
                 mounts: dict, log_inside: str, emit, *, lane_env: dict | None = None, port: int = serve_check.PORT):
        self.client, self.image, self.launch, self.labels = client, image, launch, labels
        self.options, self.mounts, self.log_inside, self.emit = options, mounts, log_inside, emit
        self.lane_env, self.port = lane_env or {}, port
        self.container = None
        self.report: dict | None = None
        self._reported = threading.Event()
        self._reader: threading.Thread | None = None
        self.exit_code: int | None = None

    @property
    def short_id(self) -> str:
        return self.container.id[:12] if self.container is not None else ""

    def start(self) -> dict:
        """Start it and wait for its report: {"serving", "healthy_s", "gpu", "log", "mismatch_lines", "error"}."""
        config = {"mode": "serve", "argv": list(self.launch.argv), "env": dict(self.launch.env), "port": self.port,
                  "timeout": self.options.server_timeout, "health_poll_s": self.options.health_poll_s, "log": self.log_inside}
        gpu = dict(containers.GPU_RUN_OPTIONS) if self.options.gpu else {}
        env = {**(containers.GPU_ENV if self.options.gpu else {}), **dict(self.launch.env), **self.lane_env}
        volumes = {host: {"bind": inside, "mode": mode} for host, (inside, mode) in self.mounts.items()}
        try:
            self.container = self.client.containers.create(
                self.image, ["python3", f"{CHECKS_INSIDE}/serve_check.py", json.dumps(config)],
                labels={**self.labels, containers.LABEL_OWNER: containers.OWNER}, environment=env, volumes=volumes,
                network_mode=self.options.network, **gpu)
            reason = containers.start(self.container, self.emit)
        except Exception as exc:  # docker.errors.APIError: the reason is in its explanation
            reason = str(getattr(exc, "explanation", None) or exc)
        if reason is not None:
            self.emit(f"the server container did not start: {reason}")
            return {"serving": False, "healthy_s": None, "error": f"the server container did not start: {reason}"[:600]}
        self._reader = threading.Thread(target=self._follow, daemon=True)
        self._reader.start()
        limit = self.options.server_timeout + START_MARGIN_S
        if not self._reported.wait(limit):
            return {"serving": False, "healthy_s": None,
                    "error": f"the server container {self.short_id} reported nothing in {limit} s"}
        if self.report is None:
            return {"serving": False, "healthy_s": None,
                    "error": f"the server container {self.short_id} exited before it reported"}
        return self.report

    def _follow(self) -> None:
        buffer = b""
        try:
            for chunk in self.container.logs(stream=True, follow=True):
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for raw in complete:
                    self._line(raw.decode(errors="replace"))
            if buffer:
                self._line(buffer.decode(errors="replace"))
        finally:
            self._reported.set()  # it ended: whatever it reported (or nothing) is all there is

    def _line(self, line: str) -> None:
        self.emit(line)
        if self.report is None and line.startswith("{") and '"serving"' in line:
            try:
                self.report = json.loads(line)
            except ValueError:
                return
            self._reported.set()

    def still_serving(self, report: dict) -> dict:
        """``report``, or, where the server's container has stopped since (the server died while
        held), a report that says so: the checks still to run fail with that reason."""
        if not report.get("serving"):
            return report
        try:
            self.container.reload()
            state = self.container.attrs.get("State", {})
        except Exception as exc:
            return {**report, "serving": False, "error": f"the server container {self.short_id} is gone: {exc}"[:600]}
        if state.get("Running"):
            return report
        return {**report, "serving": False,
                "error": f"the server stopped (container exit {state.get('ExitCode')}) before this check; see its log"}

    def stop(self) -> None:
        """Stop the server (serve_check stops sglang) and remove its container, whatever state it is in."""
        if self.container is None:
            return
        try:
            self.container.stop(timeout=STOP_TIMEOUT_S)
            self.container.reload()
            self.exit_code = self.container.attrs.get("State", {}).get("ExitCode")
        except Exception as exc:
            self.emit(f"stopping the server container {self.short_id} failed: {exc}")
        finally:
            try:
                self.container.remove(force=True)
            except Exception as exc:
                self.emit(f"removing the server container {self.short_id} failed: {exc}")
            if self._reader is not None:
                self._reader.join(timeout=30)


# -- the runner --------------------------------------------------------------------------------


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
                self.bench_records += bench_rocm.run_bench(self.project, self.pin, item.workload, self.options, on_log=self.emit)
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
                    self.bench_records += bench_rocm.run_bench(self.project, self.pin, item.workload, self.options, on_log=self.emit)
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

    # -- the synthetic checkpoint, written once per job in the patched image and mounted

    def _write_checkpoint(self) -> None:
        """The CPU probes' generator at the ROCm size, run with the image's Python (and its
        transformers' GlmMoeDsaConfig), into a folder of the job's state that every synthetic
        server mounts read-only. A failure fails every cell that needed it, with the reason."""
        started = time.monotonic()
        shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
        self.checkpoint_dir.mkdir(parents=True)
        self.emit(f"# writing the synthetic checkpoint into {self.checkpoint_dir} (glm_checkpoint.py --size rocm, in the image)")
        run = containers.run_check(
            self.client, self.digest, ["python3", f"{CHECKS_INSIDE}/glm_checkpoint.py", CHECKPOINT_INSIDE, "--size", "rocm"],
            self._labels(**{containers.LABEL_CELL: f"{self.name}-checkpoint"}),
            # Our own uid, so the next job can remove what this one wrote; no GPU, no network needed.
            containers.RunOptions(gpu=False, network="none", timeout=CHECKPOINT_TIMEOUT_S,
                                  mounts={str(self.checkpoint_dir): (CHECKPOINT_INSIDE, "rw")},
                                  user=f"{os.getuid()}:{os.getgid()}"),
            self.emit)
        written = last_json(run.log) or {}
        seconds = round(time.monotonic() - started, 2)
        if run.exit_code == 0 and written.get("folder") == CHECKPOINT_INSIDE and (self.checkpoint_dir / "config.json").is_file():
            self.summary["checkpoint"] = {**written, "host_folder": str(self.checkpoint_dir), "seconds": seconds}
            return
        why = "timed out" if run.timed_out else run.start_error or f"exit {run.exit_code}: {run.log.strip()[-400:]}"
        self.checkpoint_error = f"the synthetic checkpoint was not written: {why}"[:600]
        self.summary["checkpoint"] = {"error": self.checkpoint_error, "seconds": seconds}
        self.emit(self.checkpoint_error)

    # -- records

    def _new_record(self, item: Item) -> CellRecord:
        record = CellRecord("rocm", item.check, self.pin, item.depth, self.series.version, self.series.digest(), SKIPPED)
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
                self.client, self.digest, command, self._labels(**{containers.LABEL_CELL: record.cell_id}),
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
                              {containers.LABEL_CELL: f"{self.name}-baseline-{step.kind}"})
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
                run = self._check(server, launch, script, config, {containers.LABEL_CELL: record.cell_id}, emit)
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
            records = bench_rocm.run_bench(self.project, self.pin, step.item.workload, self.options, on_log=self.emit)
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
            "kind": "rocm-job", "job": self.name, "pin": self.pin, "event": self.event,
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
