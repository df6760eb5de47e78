"""sglpatch: a versioned patch series for sglang on ROCm, applied reproducibly to pinned releases.

The packages follow the path a pin takes: ``sources`` (the pinned release and its pristine tree
as a git commit) -> ``series`` (our patches, their checks, the lock everyone must reproduce) ->
``apply`` (one commit per patch, classified, reported), with ``witnesses`` proving each patch,
``matrix``, ``rocm``, ``bench`` and ``rehearsal`` beyond, ``rebase`` and ``upstream`` for new
releases and pull requests, ``serving`` for launch profiles, and ``plumbing`` under them all.
``cli`` (with ``cli_options`` and ``exitcodes``) and ``commands`` are the doors. docs/tour.md walks through every module.
"""

__version__ = "0.1.0"
