"""sglpatch: a versioned patch series for sglang on ROCm, applied reproducibly to pinned releases.

The modules follow the path a pin takes: ``pins`` (what upstream release) -> ``sources`` (its
pristine tree as a git commit) -> ``series`` (our patches and their metadata) -> ``apply`` (one
commit per patch, classified) -> ``lock`` (the hashes everyone must reproduce) -> ``report``.
"""

__version__ = "0.1.0"
