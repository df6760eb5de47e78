"""Witness ``upstream-test``: a patch's own regression tests, in sglang's layout, run on the tree.

A patch's tests live beside it in ``patches/tests/<patch stem>/test/registered/unit/...`` (see
``sglpatch.series.patches``): the files its pull request adds, written as sglang's CPU unit tests are
(``register_cpu_ci`` at the top, ``unittest`` with ``CustomTestCase``, no server, no weights, a
``__main__`` block). This witness runs them with ``probes/upstream_test_probe.py`` in the pin's
CPU Python, in a child of the witnesses' fork server (the emulated MI355X box of
``probes/rocm_box.py`` and the stand-ins for the GPU-only packages that importing sglang needs
here: ours, not part of the tests), one child per tree for every patch's tests, apart from the
other probes so that no probe's state reaches a test. The answer is

- ``bug`` when a test's assertion fails (also one that sglang's ``CustomTestCase`` re-raises as
  its retry's error), and nothing could not run;
- ``clean`` when every test ran and passed;
- ``unavailable`` with the reason when the CPU environment cannot be had, the release has no CI
  collector (``sglang.test.ci.ci_register``), the collector would refuse a file (no
  registration, no ``__main__`` block), a file does not import, a test raised something other
  than a failed assertion, or no test ran.

A patch may name it as its only witness (``Witness: upstream-test``): its tests then judge every
rendition. A patch that keeps a witness of its own and has tests too runs them where its main
file (the rendition that goes upstream) applies: the tests are written against that code, and a
rebase that makes a new main file runs them on the new pin (``sglpatch.rebase``).
``registry.witnesses_for`` says which run. Answers are cached under a key that covers the tests' bytes, this module, the
probe and the probes' machinery, the launch profile's environment and the pin's CPU environment.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from sglpatch.serving.profile import load_profile
from sglpatch.sources.pins import Pin
from sglpatch.witnesses import cpu_envs, probe_runs
from sglpatch.witnesses import probing
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE, WitnessResult

NAME = "upstream-test"
PROBE_MODULE = "upstream_test_probe"
PROBE_LIMIT_S = 300
PROFILE = "glm-5.2-mxfp4-mi355x"  # the box the tests run on: the launch profile's environment
GROUP = "upstream-tests"  # every patch's tests on one tree share a child of their own
CODE = (Path(__file__), Path(__file__).parent / "probes" / f"{PROBE_MODULE}.py")


class UpstreamTestWitness:
    """The ``upstream-test`` witness bound to one patch's tests (``tests``: ``RegressionTest``s)."""

    version = "1"

    def __init__(self, stem: str = "", tests: tuple = ()):
        self.stem = stem
        self.tests = tuple(tests)
        # One witness per patch: answers are cached and shared by name.
        self.name = f"{NAME}:{stem}" if stem else NAME

    def fingerprint(self, pin: Pin) -> str:
        digest = hashlib.sha256(f"{self.version}\0{probe_runs.code_digest(list(CODE))}\0".encode())
        profile = load_profile(PROFILE)
        digest.update(f"{profile.name}\0{profile.content_digest()}\0".encode())
        for test in self.tests:
            digest.update(test.path.encode() + b"\0" + test.file.read_bytes() + b"\0")
        return f"{self.version}-{digest.hexdigest()[:24]}-{cpu_envs.env_fingerprint(pin)[:16]}"

    def probe_request(self, pin: Pin):
        profile = load_profile(PROFILE)
        spec = {"tests": [{"name": test.path, "path": str(Path(test.file).resolve())} for test in self.tests]}
        return probe_runs.ProbeRequest(self.name, PROBE_MODULE, spec, PROBE_LIMIT_S,
                                       import_env=probing.import_env(profile), group=GROUP)

    def judge_probe(self, answer: dict | None, failure: str | None, pin: Pin) -> WitnessResult:
        if not self.tests:
            return WitnessResult(self.name, UNAVAILABLE, detail=f"patch {self.stem or '?'} has no regression tests")
        if answer is None:
            return WitnessResult(self.name, UNAVAILABLE, detail=(failure or "no answer")[:1000])
        result = judge(answer, self.name)
        return WitnessResult(result.witness, result.state, result.level,
                             f"{result.detail} [{probing.doubles_used(answer)}]"[:2000])

    def run(self, tree: Path, pin: Pin) -> WitnessResult:
        return probing.run_probe_witnesses([self], tree, pin)[self.name]


def judge(answer: dict, name: str = NAME) -> WitnessResult:
    """The witness's answer from the probe's (file -> what its tests did)."""
    gpu = str(answer.get("emulated_gpu", "")).split(":")[0]
    files = answer.get("files") or {}
    ran = sum(int(f.get("tests_run") or 0) for f in files.values())
    level = f"unittest {gpu}".strip()
    cannot = []
    for path, found in files.items():
        if found.get("unavailable") or found.get("refused"):
            cannot.append(f"{path}: {found.get('unavailable') or found.get('refused')}")
        elif not found.get("tests_run"):
            cannot.append(f"{path}: no test ran")
        for error in found.get("errors") or []:
            cannot.append(f"{error['test']}: {_last_line(error['detail'])}")
    if not files or ran == 0:
        cannot.append("no test ran")
    if cannot:
        return WitnessResult(name, UNAVAILABLE, level, "cannot tell: " + "; ".join(cannot)[:1500])
    failed = [f"{_short_id(f['test'])}: {_last_line(f['detail'])}"
              for found in files.values() for f in found.get("failures") or []]
    counts = ", ".join(f"{Path(path).name} {found.get('tests_run')} run" for path, found in files.items())
    if failed:
        return WitnessResult(name, BUG, level, f"{len(failed)} failed assertion(s) in {ran} tests ({counts}): "
                             + "; ".join(failed)[:1500])
    skipped = sum(len(found.get("skipped") or []) for found in files.values())
    return WitnessResult(name, CLEAN, level, f"{ran} passed ({counts})" + (f", {skipped} skipped" if skipped else ""))


def _last_line(text: str) -> str:
    """The exception's own line (``AssertionError: ...``), else the last line."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)]
    return (named or lines or [""])[-1]


def _short_id(test_id: str) -> str:
    """``module.Class.test_x (sub)`` -> ``Class.test_x (sub)``."""
    head, _, sub = test_id.partition(" ")
    return ".".join(head.split(".")[-2:]) + (f" {sub}" if sub else "")
