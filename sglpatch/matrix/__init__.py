"""The test matrix: build, load and speculative-decode checks of every patched pin, on two tiers.

Read it one file at a time:

- ``cells``      which cells exist (tier, check, pin[, depth]) and what each check proves
- ``pin``        the pin under test: the series applied, its trees, what the series touches
- ``kernels``    JIT kernels: their compile witnesses, where a pin compiles the multi-step one
- ``cpu_checks`` the build, load and spec checks on the real code of the pin, here
- ``cpu``        the CPU tier: runs a cell, caches settled answers, writes its record
- ``containers`` docker mechanics: the patched image, check containers, clean-up of ours only
- ``rocm``       the ROCm tier: the same checks in the patched image on AMD GPUs, judged here
- ``rocm_job``   one ROCm job per pin: the image once, one server per launch configuration, shared
- ``records``    one JSON record per cell, and the markdown table from a folder of them
- ``plan``       the CI jobs per event (one per pin on a runner) and their node-hours
"""

from sglpatch.matrix.cells import CHECKS, DEPTHS, PROFILE, TIERS, Cell, Check, cells, depth_argv, depth_flags, matrix_dir, validate_cell
from sglpatch.matrix.cpu import run_cpu_cell
from sglpatch.matrix.cpu_checks import spec_scenarios, synthetic_checkpoint_part
from sglpatch.matrix.kernels import multi_step_kernel_threshold
from sglpatch.matrix.pin import PinUnderTest, prepare_pin
from sglpatch.matrix.records import last_json

__all__ = [
    "CHECKS", "DEPTHS", "PROFILE", "TIERS", "Cell", "Check", "PinUnderTest", "cells", "depth_argv", "depth_flags",
    "last_json", "matrix_dir", "multi_step_kernel_threshold", "prepare_pin", "run_cpu_cell", "spec_scenarios",
    "synthetic_checkpoint_part", "validate_cell",
]
