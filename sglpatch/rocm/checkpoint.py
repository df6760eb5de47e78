"""The synthetic checkpoint a ROCm job's matrix cells serve, written once per job in the patched
image: the CPU probes' generator at the ROCm size (``glm_checkpoint.py --size rocm``), run with the
image's Python (and its transformers' GlmMoeDsaConfig), into a folder of the job's state that
every synthetic server mounts read-only (``CHECKPOINT_INSIDE``)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from sglpatch.matrix.records import last_json
from sglpatch.rocm import containers
from sglpatch.rocm.constants import CHECKPOINT_INSIDE, CHECKS_INSIDE

CHECKPOINT_TIMEOUT_S = 1800  # writing ~1.0 GB of seeded random bytes takes seconds; a slow disk minutes


def write_checkpoint(client, image: str, folder: Path, labels: dict[str, str], emit) -> tuple[dict, str]:
    """(what the job record says of it, the error: "" where it was written). A failure fails every
    cell that needed it, with the reason."""
    started = time.monotonic()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    emit(f"# writing the synthetic checkpoint into {folder} (glm_checkpoint.py --size rocm, in the image)")
    run = containers.run_check(
        client, image, ["python3", f"{CHECKS_INSIDE}/glm_checkpoint.py", CHECKPOINT_INSIDE, "--size", "rocm"], labels,
        # Our own uid, so the next job can remove what this one wrote; no GPU, no network needed.
        containers.RunOptions(gpu=False, network="none", timeout=CHECKPOINT_TIMEOUT_S,
                              mounts={str(folder): (CHECKPOINT_INSIDE, "rw")},
                              user=f"{os.getuid()}:{os.getgid()}"),
        emit)
    written = last_json(run.log) or {}
    seconds = round(time.monotonic() - started, 2)
    if run.exit_code == 0 and written.get("folder") == CHECKPOINT_INSIDE and (folder / "config.json").is_file():
        return {**written, "host_folder": str(folder), "seconds": seconds}, ""
    why = "timed out" if run.timed_out else run.start_error or f"exit {run.exit_code}: {run.log.strip()[-400:]}"
    error = f"the synthetic checkpoint was not written: {why}"[:600]
    emit(error)
    return {"error": error, "seconds": seconds}, error
