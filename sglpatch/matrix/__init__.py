"""The test matrix: build, load and speculative-decode checks of every patched pin, on two tiers.

Read it one file at a time:

- ``cells``      which cells exist (tier, check, pin[, depth]) and what each check proves
- ``kernels``    JIT kernels: their compile witnesses, where a pin compiles the multi-step one
- ``cpu_checks`` the build, load and spec checks on the real code of the pin, here
- ``cpu``        the CPU tier: runs a cell, caches settled answers, writes its record
- ``rocm_judge`` the ROCm tier's judgement of what the same checks printed in the patched image
- ``job_plan``   one ROCm job's plan: its sessions, one server per launch configuration, the lanes
- ``table``      the markdown table from a folder of cell records
- ``plan``       the CI jobs per event (one per pin on a runner) and their node-hours
- ``workflow``   the GitHub Actions workflow generated from the plan
- ``records``    the check records the matrix, the bench and the ROCm job write and read

The pin under test is ``sglpatch.apply.pin_under_test``; the ROCm tier's containers, image,
in-image checks and job runner are ``sglpatch.rocm``.
"""
