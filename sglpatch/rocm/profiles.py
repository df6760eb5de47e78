"""The launch profiles a ROCm node serves beyond the matrix's own: which profile each bench
workload launches (the accuracy gate launches the single-stream one, MTP 5/1/6 as sglang's AMD CI
runs it), the variants each is also run with, and what a server container gets from a profile.
Shared by the bench that starts them, the job that runs them and the plan that counts them."""

from __future__ import annotations

from sglpatch.rocm.constants import MOE_INSIDE
from sglpatch.serving.profile import Profile

PROFILES = {"serving": "glm-5.2-mxfp4-mi355x-tp4dp2", "single-stream": "glm-5.2-mxfp4-mi355x"}


def variants(profile: Profile) -> list[str]:
    """The profile as shipped, then every variant it names (each its own server and record)."""
    return ["as-shipped", *profile.variants]


def launch_env(profile: Profile) -> tuple[dict[str, str], dict]:
    """The profile's environment, with aiter pointed at its tuned MoE config where the file exists;
    and the mount that brings the file into the container."""
    env = dict(profile.env)
    tuned = profile.moe_config_path()
    if tuned is None:
        return env, {}
    env["AITER_CONFIG_FMOE"] = f"{MOE_INSIDE}/{tuned.name}"
    return env, {str(tuned): (f"{MOE_INSIDE}/{tuned.name}", "ro")}
