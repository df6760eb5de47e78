"""What a run on a ROCm node is given (``RocmOptions``: the base image, the model, the engine, the
limits) and whether it can run here at all: without a docker engine or without ``/dev/kfd`` every
record says skipped, with the reason -- never a failure of a machine that cannot run it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.plumbing.errors import Unavailable
from sglpatch.rocm import containers
from sglpatch.rocm.constants import KFD, NODE_GPUS, ROCM_GPU

IMAGE_ENV = "SGLPATCH_ROCM_IMAGE"  # a base image for every pin; "{version}" is replaced by the pin
MATRIX_MODEL_ENV = "SGLPATCH_MATRIX_MODEL"  # a model folder for the matrix cells instead of the synthetic checkpoint


@dataclass
class RocmOptions:
    base_image: str | None = None  # default: $SGLPATCH_ROCM_IMAGE, else the pin's rocm_image
    model: str | None = None  # default: $SGLPATCH_MODEL, else the profile's model folder
    hf_cache: Path = field(default_factory=lambda: Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"))
    docker_url: str | None = None  # default: $DOCKER_HOST or the local socket
    gpu: bool = True  # the AMD CI device flags, and /dev/kfd required
    server_timeout: int = 2400  # seconds for a server to become healthy
    health_poll_s: float = 5.0  # seconds between a starting server's health probes
    cell_timeout: int = 4 * 3600  # seconds for one check's container
    network: str = "host"
    # The build, load and spec cells' model: None, the synthetic checkpoint the job writes
    # (glm_checkpoint.py --size rocm: random weights, served at its own TP, several servers on the
    # node at once); a folder (or $SGLPATCH_MATRIX_MODEL), that model with the profile as shipped,
    # one server at a time, its accept length and greedy outputs judged too. The accuracy gate and
    # the bench always serve ``model``.
    matrix_model: str | None = field(default_factory=lambda: os.environ.get(MATRIX_MODEL_ENV) or None)
    gpus: int = NODE_GPUS  # a runner's GPUs, shared out between synthetic-checkpoint servers

    @property
    def synthetic(self) -> bool:
        return self.matrix_model is None

    def image_for(self, version: str, pinned_image: str) -> str:
        template = self.base_image or os.environ.get(IMAGE_ENV)
        return template.replace("{version}", version) if template else pinned_image


def unavailable_reason(options: RocmOptions):
    """(None, client) where the tier can run; (the reason, None) where it cannot."""
    if options.gpu and not KFD.exists():
        return f"no AMD GPU here: {KFD} does not exist (the ROCm tier needs a ROCm runner)", None
    try:
        return None, containers.connect(options.docker_url)
    except Unavailable as exc:
        return str(exc), None


def device_stamp(options: RocmOptions) -> str:
    """The device a run's records are made on, as the runner knows it (not as a container reports
    it): ``ROCM_GPU`` where its containers get the AMD device flags on a host with ``/dev/kfd``;
    otherwise none, and why (the stand-in image runs without them). Only a record stamped
    ``ROCM_GPU`` is a measured duration for the plan (``sglpatch.matrix.plan.recorded_seconds``)."""
    if not options.gpu:
        return "none: run without the AMD device flags (a stand-in)"
    if not KFD.exists():
        return f"none: {KFD} does not exist"
    return ROCM_GPU
