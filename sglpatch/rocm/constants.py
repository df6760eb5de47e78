"""What the host and the containers of a ROCm node agree on: where things are inside the patched
image and its containers, the labels ours carry (clean-up removes only containers with them), the
node's size, and sglang's own AMD CI figure the gate and the spec cells are judged against."""

from __future__ import annotations

from pathlib import Path

# -- inside the patched image and its containers

CHECKOUT = "/sgl-workspace/sglang"  # sglang's checkout in its images, an editable install
TOOLS_DIR = "/opt/sglpatch"  # the series' patches, the apply script and the check scripts
CHECKS_INSIDE = f"{TOOLS_DIR}/checks"  # sglpatch/rocm/checks/*.py and the checkpoint generator
MOE_INSIDE = f"{TOOLS_DIR}/moe"  # a profile's tuned MoE config, mounted
STATE_INSIDE = "/sglpatch-state"  # build/matrix/rocm-state/PIN: the spec cells' baselines, the gate's state
LOGS_INSIDE = "/sglpatch-logs"  # build/matrix/logs: the servers' logs
OUT_INSIDE = "/sglpatch-out"  # the bench's raw files
HF_INSIDE = "/root/.cache/huggingface"
CHECKPOINT_INSIDE = "/sglpatch-checkpoint"  # the job's synthetic checkpoint, mounted read-only into servers

# -- the device a record was made on, stamped by the runner (``options.device_stamp``)

ROCM_GPU = "rocm-gpu"  # the containers ran with the AMD device flags, on a host with /dev/kfd

# -- our labels, on every image and container we make

LABEL_OWNER = "io.sglpatch.owner"
OWNER = "sglpatch"
LABEL_PIN = "io.sglpatch.pin"
LABEL_SERIES_VERSION = "io.sglpatch.series-version"
LABEL_SERIES_HASH = "io.sglpatch.series-hash"
LABEL_BASE = "io.sglpatch.base-image"
LABEL_CELL = "io.sglpatch.cell"
LABEL_JOB = "io.sglpatch.job"
LABEL_LAUNCH = "io.sglpatch.launch"

# -- the node

KFD = Path("/dev/kfd")
NODE_GPUS = 8

# Accept length (tokens per verify step, at most d + 1). The one published floor: sglang's own AMD
# CI asserts >= 5.0 for GLM-5.2 MXFP4 with MTP 5/1/6 (--kv-cache-dtype fp8_e4m3, SGLANG_USE_AITER=1).
SGLANG_CI_DEPTH, SGLANG_CI_ACCEPT_LENGTH = 5, 5.0
