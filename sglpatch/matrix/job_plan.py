"""One ROCm job's plan: the sessions of a pin's job, the server launch configurations they need,
grouped by the server they share, and the order and the lanes the groups run in -- decided here
once, for the runner (``sglpatch.rocm.job``) and for the CI plan's estimate
(``sglpatch.matrix.plan``) alike.

A launch configuration is the exact ``sglang.launch_server`` argv and environment a check needs,
derived as the checks define it: the matrix cells from the launch profile and the depth
(``sglpatch.matrix.cells``), the accuracy gate and the bench from the bench's profiles
(``sglpatch.rocm.profiles``). Checks whose configurations are equal share one server. In a pin's
matrix job load and the depth-5 spec cell launch the profile as shipped (MTP 5/1/6): one server;
every other depth is its own; so is the non-speculative run the spec cells' greedy outputs and
decode speed are compared with. ``job_groups`` decides this, and ``phases`` the order and what
runs at once.

The matrix cells (build, load, spec) serve a synthetic checkpoint the job writes once, in the
patched image, with the CPU probes' generator scaled (``glm_checkpoint.py --size rocm``: GLM-5's
architecture with its MTP layer and a Quark MXFP4 ``quantization_config`` keeping the MTP shared
expert bf16, random weights and zeroed final norms, about 1.0 GB), mounted read-only into every
server: the bugs the series fixes show when the draft layer is built and loaded and when the
kernels compile, at any size. It is served at TP2 (``SYNTHETIC_TP``), so four servers share the node at once, each on its
own GPUs and port (a lane). The full model (``RocmOptions.model``) serves only the accuracy gate
and the bench (the weekly job), and the matrix cells where ``matrix_model`` asks for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field

from sglpatch.matrix.cells import DEPTHS, PROFILE, depth_argv
from sglpatch.matrix.records import cell_id
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.rocm.checks import serve_check
from sglpatch.rocm.constants import CHECKPOINT_INSIDE, NODE_GPUS
from sglpatch.rocm.profiles import PROFILES, launch_env, variants
from sglpatch.serving.profile import Profile, load_profile

# The synthetic checkpoint's tensor parallelism (glm_checkpoint.ROCM_TP: GLM-5's per-rank shapes
# at TP8): more than one rank, so the all-reduce paths and the aiter fusion's conditions are real.
SYNTHETIC_TP = 2
# sglang takes the ports after --port for its own (NCCL, dist-init): lanes' ports far apart.
LANE_PORT_STRIDE = 1000


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
        return [Item("accuracy"), *[Item("bench", workload=workload) for workload in PROFILES]]
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
        env, mounts = launch_env(profile)
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
        """The accuracy gate's launch, as ``bench.on_rocm_node.run_accuracy`` makes it."""
        profile = load_profile(PROFILES["single-stream"])
        return self._launch("profile as shipped", profile, profile.server_args(self._model(profile)))

    def bench(self, workload: str) -> tuple[Launch, ...]:
        """The servers ``bench_run.py`` starts for a workload, one per variant, as ``run_bench`` lists them."""
        profile = load_profile(PROFILES[workload])
        return tuple(self._launch(f"{workload} {variant}", profile, profile.variant(variant).server_args(self._model(profile)))
                     for variant in variants(profile))


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
