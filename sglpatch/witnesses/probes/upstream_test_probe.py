"""Probe for the ``upstream-test`` witness: run a patch's regression tests, written in sglang's own
layout (``test/registered/unit/...``), against the tree's sglang.

Runs in the pin's CPU Python under ``runner.py`` (a child of the fork server, on the emulated
MI355X box of ``rocm_box``, with the stand-ins for the GPU-only packages), in a child of its own:
no other probe has touched sglang's global state first. Spec::

    {"tests": [{"name": "test/registered/unit/.../test_x.py", "path": "/abs/path/test_x.py"}, ...]}

Each file is first parsed by the tree's own CI collector (``sglang.test.ci.ci_register``, as
upstream's suite runner does): a file it would refuse (no ``register_cpu_ci`` call, no
``if __name__ == "__main__"`` block that runs something) is answered ``refused``. Then the file
is imported as a module of its own and its ``unittest`` cases run, with ``os.environ`` restored
afterwards. The answer, per file: ``tests_run``, ``failures`` (a failed assertion, also one that
sglang's ``CustomTestCase`` re-raised as its retry's error) and ``errors`` (any other exception: test id and the
last lines of the traceback), ``skipped`` (test id and reason), ``registrations`` (what the
collector read), ``output`` (the runner's text, its tail), or ``unavailable`` (why the file could
not be run at all: the collector is missing, the file does not import).

No sglpatch imports: this file runs in the pin's interpreter, not ours.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import os
import sys
import traceback
import unittest

TAIL = 1500


def _collector(path: str) -> tuple[list[str], bool | None]:
    """What sglang's own collector reads in the file: its CPU registrations and whether it has a
    main block (None where the release's collector does not say)."""
    from sglang.test.ci import ci_register

    parsed = ci_register.ut_parse_one_file(path)
    registries, has_main = parsed if isinstance(parsed, tuple) else (parsed, None)
    found = []
    for registry in registries:
        backend = getattr(getattr(registry, "backend", None), "name", "?")
        suite = getattr(registry, "effective_suite", None) or getattr(registry, "suite", None)
        found.append(f"{backend}:{suite}")
    return found, has_main


def _short(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-6:])[-TAIL:]


class _Result(unittest.TextTestResult):
    """Also tells, for each error, whether an assertion failed underneath it: sglang's
    ``CustomTestCase`` retries a test and reports a failed assertion as the retry's exception."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asserted: set[str] = set()

    def addError(self, test, err):
        exc, seen = err[1], set()
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            if isinstance(exc, AssertionError):
                self.asserted.add(test.id())
                break
            exc = exc.__cause__ or exc.__context__
        super().addError(test, err)


def _assertion(text: str) -> str:
    """The failed assertion's own lines (the first traceback of a chain: the retry's wrapper
    comes after it)."""
    first = text.split("\nDuring handling of the above exception")[0]
    return _short(first)


def run_file(name: str, path: str) -> dict:
    answer: dict = {"name": name}
    try:
        registrations, has_main = _collector(path)
    except ImportError as exc:
        answer["unavailable"] = f"the release has no CI collector (sglang.test.ci.ci_register): {exc}"
        return answer
    except SyntaxError as exc:
        answer["unavailable"] = f"the file does not parse: {exc}"
        return answer
    answer["registrations"] = registrations
    refused = []
    if not any(r.startswith("CPU:") for r in registrations):
        refused.append("no register_cpu_ci(...) call at the top")
    if has_main is False or "if __name__ ==" not in open(path, encoding="utf-8").read():
        refused.append('no `if __name__ == "__main__": unittest.main()` block')
    if refused:
        answer["refused"] = "sglang's CI collector would refuse it: " + "; ".join(refused)
        return answer
    module_name = "sglpatch_upstream_test_" + os.path.splitext(os.path.basename(path))[0]
    environ = dict(os.environ)
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:  # noqa: BLE001 - the file cannot be run here: say why
            if isinstance(exc, KeyboardInterrupt):
                raise
            answer["unavailable"] = f"the test file does not import: {type(exc).__name__}: {exc}"
            answer["traceback"] = traceback.format_exc(limit=-6)[-TAIL:]
            return answer
        suite = unittest.defaultTestLoader.loadTestsFromModule(module)
        stream = io.StringIO()
        result = unittest.TextTestRunner(stream=stream, verbosity=2, resultclass=_Result).run(suite)
    finally:
        os.environ.clear()
        os.environ.update(environ)
        sys.modules.pop(module_name, None)
    answer.update(
        tests_run=result.testsRun,
        failures=[{"test": test.id(), "detail": _assertion(text)} for test, text in result.failures]
        + [{"test": test.id(), "detail": _assertion(text)} for test, text in result.errors if test.id() in result.asserted],
        errors=[{"test": test.id(), "detail": _short(text)} for test, text in result.errors
                if test.id() not in result.asserted],
        unexpected_successes=[test.id() for test in result.unexpectedSuccesses],
        skipped=[{"test": test.id(), "reason": reason} for test, reason in result.skipped],
        output=stream.getvalue()[-4000:],
    )
    return answer


def run(spec: dict, context) -> dict:
    files = {}
    for test in spec.get("tests", []):
        context.phase(f"test {test['name']}")
        files[test["name"]] = run_file(test["name"], test["path"])
    return {"files": files}
