"""Everything about ROCm containers: the docker engine and our containers, the patched image, the
servers held in containers, the scripts that run inside the image, and the job that runs a pin's
ROCm checks on a node.

Read it one file at a time:

- ``constants``  what host and containers agree on: paths inside, our labels, the node's GPUs
- ``options``    what a run is given (``RocmOptions``), and whether it can run here at all
- ``containers`` docker mechanics: the engine, a check's container, clean-up of ours only
- ``image``      the pin's patched image, built FROM its released ROCm image
- ``profiles``   the launch profiles of the bench and the gate, their variants and environment
- ``server``     one sglang server held in its container for the checks that share it
- ``checkpoint`` the synthetic checkpoint a job writes once in the image for the matrix cells
- ``checks/``    the scripts that run inside the image (standard library only)
- ``job``        one ROCm job per pin (and a cell alone): the image once, each server once

Every module here but ``job`` sits below the matrix's checks and ``sglpatch.bench``, which import
it and never each other (all three write the records of ``sglpatch.matrix.records``); ``job`` alone
runs the matrix's and the bench's checks and imports them.
What a job runs and in which order is its plan, ``sglpatch.matrix.job_plan``.
"""
