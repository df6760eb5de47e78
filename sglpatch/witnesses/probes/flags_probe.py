"""Child side of the ``rocm-flags`` witness: resolve a pin's own ``ServerArgs`` for many scenarios.

    python flags_probe.py SPEC.json OUT.json

Runs in the pin's CPU interpreter with the tree's ``python/`` folder first on the path (see
``sglpatch.pyenv``). SPEC holds the synthetic model folder, the environment to import sglang
under, and the scenarios: ``{name: {"argv": [...], "env": {NAME: value or null}, "arch": ...}}``.
Every scenario is resolved in this one process, so sglang is imported once:

- sglang reads ``SGLANG_USE_AITER`` and ``is_hip()`` at import time, so the import happens under
  the spec's ``import_env`` on an emulated ROCm node (``hip_emulation``);
- each scenario then runs with ``os.environ`` set to the import environment plus its own ``env``
  (null unsets a variable) and restored afterwards, since sglang's resolution both reads the
  environment and writes to it; ``arch`` switches the emulated GPU.

OUT gets, per scenario, the resolved fields, the warnings logged or raised while resolving, and
``error`` (the exception, when ``ServerArgs`` rejects the arguments) or null.

No sglpatch imports: this file runs in the pin's interpreter, not ours.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import time
import traceback
import warnings

import hip_emulation
import standins

FIELDS = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "enable_aiter_allreduce_fusion",
    "disable_aiter_allreduce_fusion_in_prefill",
    "kv_cache_dtype",
    "tp_size",
    "dp_size",
    "enable_dp_attention",
    "disable_custom_all_reduce",
    "page_size",
)
STANDINS = ("torchvision", "sgl_kernel", "aiter")


class _Records(logging.Handler):
    """Every WARNING and above, from any logger, while a scenario resolves."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        self.messages.append(f"{record.levelname}: {message}")


def _set_environ(base: dict[str, str], changes: dict[str, str | None]) -> None:
    os.environ.clear()
    os.environ.update(base)
    for name, value in changes.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _forget_device_answers() -> None:
    """Clear sglang's memoised device queries (``is_gfx95_supported`` and kin are ``lru_cache``d),
    so a scenario on another emulated GPU is asked afresh."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("sglang") or module is None:
            continue
        for value in list(vars(module).values()):
            # isinstance only: sglang's lazy-import proxies import their module on any getattr.
            if isinstance(value, functools._lru_cache_wrapper):
                value.cache_clear()


def resolve(server_args_cls, argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    server_args_cls.add_cli_args(parser)
    args = server_args_cls.from_cli_args(parser.parse_args(argv))
    if hasattr(args, "resolve_once"):  # 0.5.19 on: resolution is a pipeline run on demand
        args.resolve_once()
    values = args.resolved_dict() if hasattr(args, "resolved_dict") else vars(args)
    return {name: values.get(name) for name in FIELDS}


def main(spec_path: str, out_path: str) -> int:
    with open(spec_path) as handle:
        spec = json.load(handle)
    _set_environ(dict(os.environ), spec.get("import_env", {}))
    first_arch = spec.get("arch") or hip_emulation.MI355X
    hip_emulation.emulate(first_arch, workdir=spec["workdir"])
    stood_in = standins.install(*STANDINS)
    import_environ = dict(os.environ)

    records = _Records()
    root = logging.getLogger()
    root.addHandler(records)
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)

    started = time.monotonic()
    from sglang.srt.server_args import ServerArgs

    seconds = {"import": round(time.monotonic() - started, 2)}

    results = {}
    arch = first_arch
    # Scenarios on the import-time GPU first: module-level flags computed at import stay as they
    # were, so another GPU is emulated only through what is asked at resolution time.
    order = sorted(spec["scenarios"], key=lambda n: (spec["scenarios"][n].get("arch") or first_arch) != first_arch)
    for name in order:
        scenario = spec["scenarios"][name]
        _set_environ(import_environ, scenario.get("env", {}))
        if (scenario.get("arch") or first_arch) != arch:
            arch = scenario.get("arch") or first_arch
            hip_emulation.set_arch(arch)
            _forget_device_answers()
        records.messages = []
        started = time.monotonic()
        result: dict = {"error": None}
        with warnings.catch_warnings(record=True) as raised:
            warnings.simplefilter("always")
            try:
                result.update(resolve(ServerArgs, scenario["argv"]))
            except BaseException as exc:  # SystemExit from argparse too: the argv was rejected
                if isinstance(exc, KeyboardInterrupt):
                    raise
                result["error"] = f"{type(exc).__name__}: {exc}"
                result["traceback"] = traceback.format_exc(limit=6)
        result["warnings"] = records.messages + [f"{w.category.__name__}: {w.message}" for w in raised]
        results[name] = result
        seconds[name] = round(time.monotonic() - started, 2)
    results = {name: results[name] for name in spec["scenarios"]}
    _set_environ(import_environ, {})

    with open(out_path, "w") as handle:
        json.dump({"standins": stood_in, "seconds": seconds, "scenarios": results}, handle, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
