"""Witnesses: checks that fail on a tree with the bug and pass on a tree without it.

Each patch names its witness in its ``Witness`` trailer (``registry.witness_for``; the known
witnesses: ``registry.registry``). A witness runs against a checked-out tree (upstream layout,
``python/sglang/...``) of one pin and answers with a ``WitnessResult`` (``results``):

- ``bug``: the check fails -- the bug is there;
- ``clean``: the check passes -- the bug is not there;
- ``unavailable``: the check could not run here, with the reason (never silently a pass).

The protocol (``results.Witness``): ``name``, ``version``, ``run(tree, pin)``, and what its answer
depends on besides the tree, ``fingerprint(pin) -> str`` (its code and probes, the environment
it runs in: the CPU Python's requirements, Python version and the pin's overlay, or the
toolchain). Optionally ``levels`` (the levels it can run at, strongest first, as its results'
``level`` starts) with ``available_level(pin)`` (the strongest it can run at here now).

Answers are cached (``answer_cache.run_cached``, ``answer_cache.run_cached_many``) by witness name,
fingerprint, pin and tree hash, with the level that ran; an answer is reused only when nothing it
depends on changed and no stronger level has become available. ``unavailable`` is never cached.

Witnesses that run a probe in the pin's CPU Python (``results.ProbeWitness``:
``probe_request(pin)`` and ``judge_probe(answer, pin)``; what they share is in ``probing``)
share one child process per tree through ``run_cached_many``, which imports the tree's sglang
once for all of them. Callers with more than one witness for a tree (``apply``, the matrix)
should call::

    results = answer_cache.run_cached_many(witnesses, tree_hash, pin, materialize)   # {name: WitnessResult}

``materialize`` is called at most once, and only when some witness must really run.

The witnesses: ``rocm_guard`` (compiling with ``hip_toolchain``, the kernel unit of
``guard_kernel``), ``mtp_exclude`` and ``rocm_flags`` (CPU probes), and ``upstream_test`` (a
patch's own regression tests in sglang's layout, ``patches/tests/<patch>/``, run as a CPU probe
in a child of their own). A patch may have its own witness and tests both:
``registry.witnesses_for`` gives every witness that judges a rendition.
"""
