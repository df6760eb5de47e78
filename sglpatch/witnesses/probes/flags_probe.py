"""Probe for the ``rocm-flags`` witness: resolve a pin's own ``ServerArgs`` for many scenarios.

Runs in the pin's CPU Python under ``runner.py``, after the tree's sglang was imported on the
emulated MI355X box of ``rocm_box`` with the launch profile's environment (as the server is
started: ``SGLANG_USE_AITER`` and ``is_hip()`` are read at import time). Spec::

    {"scenarios": {name: {"argv": [...], "env": {NAME: value or null}, "arch": ... or null}}}

Each scenario runs with ``os.environ`` set to the import environment plus its own ``env`` (null
unsets a variable) and restored afterwards, since sglang's resolution both reads the environment
and writes to it; ``arch`` switches the emulated GPU (scenarios on the import-time GPU first:
module-level flags computed at import stay as they were, so another GPU is emulated only through
what is asked at resolution time).

The answer, per scenario: the resolved fields, ``log_records`` (every record of WARNING or above
from an ``sglang`` logger while it resolved: level, logger, message), ``warnings`` (those
records and Python warnings, as text, as before), and ``error`` (the exception, when
``ServerArgs`` rejects the arguments) or null. ``feature_probes`` shows what sglang's own
feature checks answered under the stand-ins; ``standin_reads`` and ``standins_called`` list what
the resolution of the scenarios read from or called on them (empty: nothing judged went through
a double).
"""

from __future__ import annotations

import argparse
import functools
import importlib
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
# sglang's own checks for optional GPU packages, by module and function name, where a release has them.
FEATURE_PROBES = (
    ("sglang.srt.utils.common", "is_flashinfer_available"),
    ("sglang.srt.utils.common", "is_sgl_kernel_available"),
    ("sglang.srt.utils.common", "is_aiter_available"),
    ("sglang.srt.utils", "is_flashinfer_available"),
)


class _Records(logging.Handler):
    """Every WARNING and above, from any logger, while a scenario resolves."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.records: list[dict] = []

    def emit(self, record):
        try:
            message = record.getMessage()
        except Exception:
            message = str(record.msg)
        self.records.append({"level": record.levelname, "logger": record.name, "message": message})


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


def feature_probes() -> dict[str, str]:
    answers = {}
    for module_name, function in FEATURE_PROBES:
        module = sys.modules.get(module_name) or _try_import(module_name)
        probe = getattr(module, function, None) if module is not None else None
        if callable(probe) and f"{function}" not in answers:
            try:
                answers[function] = repr(probe())
            except Exception as exc:  # noqa: BLE001 - reported as is
                answers[function] = f"{type(exc).__name__}: {exc}"
    import importlib.util

    for package in ("sgl_kernel", "aiter", "flashinfer"):
        try:
            answers[f"find_spec({package})"] = "found" if importlib.util.find_spec(package) else "missing"
        except (ValueError, ImportError) as exc:
            answers[f"find_spec({package})"] = f"{type(exc).__name__}: {exc}"
    return answers


def _try_import(name: str):
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001
        return None


def run(spec: dict, context) -> dict:
    from sglang.srt.server_args import ServerArgs

    import_environ = dict(os.environ)
    first_arch = context.box.get("emulated_gpu") or hip_emulation.MI355X
    records = _Records()
    root = logging.getLogger()
    root.addHandler(records)
    seconds: dict[str, float] = {}
    results = {}
    arch = first_arch
    scenarios = spec["scenarios"]
    order = sorted(scenarios, key=lambda n: (scenarios[n].get("arch") or first_arch) != first_arch)
    standins.reset_calls()
    answer: dict = {"feature_probes": feature_probes(), "feature_probe_reads": standins.reads()}
    standins.reset_calls()
    try:
        for name in order:
            scenario = scenarios[name]
            context.phase(f"scenario {name}")
            _set_environ(import_environ, scenario.get("env", {}))
            if (scenario.get("arch") or first_arch) != arch:
                arch = scenario.get("arch") or first_arch
                hip_emulation.set_arch(arch)
                _forget_device_answers()
            records.records = []
            started = time.monotonic()
            result: dict = {"error": None}
            with warnings.catch_warnings(record=True) as raised:
                warnings.simplefilter("always")
                try:
                    result.update(resolve(ServerArgs, scenario["argv"]))
                except Exception as exc:  # the argv was rejected
                    result["error"] = f"{type(exc).__name__}: {exc}"
                    result["traceback"] = traceback.format_exc(limit=6)
                except SystemExit as exc:  # argparse refuses an argument this way
                    result["error"] = f"SystemExit: {exc}"
            sglang_records = [r for r in records.records if r["logger"].split(".")[0] == "sglang"]
            result["log_records"] = sglang_records
            result["warnings"] = [f"{r['level']}: {r['message']}" for r in records.records] + [
                f"{w.category.__name__}: {w.message}" for w in raised]
            results[name] = result
            seconds[name] = round(time.monotonic() - started, 2)
    finally:
        root.removeHandler(records)
        _set_environ(import_environ, {})
        if arch != first_arch:
            hip_emulation.set_arch(first_arch)
            _forget_device_answers()
    answer.update(scenarios={name: results[name] for name in scenarios if name in results},
                  scenario_seconds=seconds, standins_called=standins.calls(), standin_reads=standins.reads())
    return answer
