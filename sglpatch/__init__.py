"""sglpatch: a versioned patch series for sglang on ROCm, applied reproducibly to pinned releases.

The modules follow the path a pin takes: ``pins`` (what upstream release) -> ``sources`` (its
pristine tree as a git commit) -> ``series`` (our patches and their metadata) -> ``apply`` (one
commit per patch, classified) -> ``lock`` (the hashes everyone must reproduce) -> ``report``,
with ``witnesses`` proving each patch and ``matrix``, ``rocm`` and ``bench`` beyond. docs/tour.md
walks through every module.
"""

__version__ = "0.1.0"
