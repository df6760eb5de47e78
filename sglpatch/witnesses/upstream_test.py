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

import dataclasses
import hashlib
import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

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

    version = "2"  # 2: skips, expected failures and unexpected successes are no verdict; per-test cases

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
        hermetic = f"; hermetic: {answer['hermetic']}" if answer.get("hermetic") else ""
        return dataclasses.replace(result, detail=f"{result.detail} [{probing.doubles_used(answer)}{hermetic}]"[:2500])

    def run(self, tree: Path, pin: Pin) -> WitnessResult:
        return probing.run_probe_witnesses([self], tree, pin)[self.name]


def release_written_for(rendition, pins) -> str | None:
    """The release a rendition's fix was written for, where its tests must find the bug: the pin
    its file is named after (``renditions/<patch>/<pin>.patch``), else the newest pin its
    ``Applies-To`` covers (``patch refresh`` writes ``==<pin>``, the pin it was made on), below
    its ``Fixed-Upstream-In`` where it has one (a fix upstream took was written before it); None
    where no pin is such."""
    versions = {pin.version: pin.parsed_version for pin in pins}
    if rendition.path.stem in versions and rendition.covers(rendition.path.stem):
        return rendition.path.stem
    fixed = (rendition.trailer("Fixed-Upstream-In") or "").split(" ", 1)[0]
    try:
        upstream = Version(fixed) if fixed else None
    except InvalidVersion:
        upstream = None
    covered = [version for version, parsed in versions.items()
               if rendition.covers(version) and (upstream is None or parsed < upstream)]
    return max(covered, key=versions.get) if covered else None


def judge(answer: dict, name: str = NAME) -> WitnessResult:
    """The witness's answer from the probe's (file -> what its tests did). Only a test that ran and
    failed its assertion finds the bug; only one that ran and passed is clean. A skip, an expected
    failure or an unexpected success is no verdict: named in the answer, never clean; a file whose
    every test skipped, an unexpected success, an error or a test that changed the tree make the
    whole answer unavailable. ``cases``: each test (``Class.test_method``) and its own verdict."""
    gpu = str(answer.get("emulated_gpu", "")).split(":")[0]
    files = answer.get("files") or {}
    ran = sum(int(f.get("tests_run") or 0) for f in files.values())
    level = f"unittest {gpu}".strip()
    cases = test_cases(files)
    cannot, noted = [], []
    for path, found in files.items():
        if found.get("unavailable") or found.get("refused"):
            cannot.append(f"{path}: {found.get('unavailable') or found.get('refused')}")
            continue
        if found.get("tree_changed"):
            cannot.append(f"{path}: the tests changed the tree they judge ({', '.join(found['tree_changed'][:5])}); "
                          "a test must leave it as it found it")
        skipped = found.get("skipped") or []
        if not found.get("tests_run"):
            cannot.append(f"{path}: no test ran")
        elif len(skipped) >= int(found.get("tests_run") or 0):
            cannot.append(f"{path}: every test skipped ({_skips(skipped)})")
        elif skipped:
            noted.append(f"skipped: {_skips(skipped)}")
        for error in found.get("errors") or []:
            cannot.append(f"{error['test']}: {_last_line(error['detail'])}")
        for test in found.get("unexpected_successes") or []:
            cannot.append(f"{_short_id(test)}: an unexpected success (marked @expectedFailure, it passed): "
                          "an expected failure judges nothing")
        for failed in found.get("expected_failures") or []:
            noted.append(f"expected failure (judges nothing): {_short_id(failed['test'])}")
    if not files or ran == 0:
        cannot.append("no test ran")
    if cannot:
        return WitnessResult(name, UNAVAILABLE, level, "cannot tell: " + "; ".join(cannot + noted)[:1500], cases=cases)
    failed = [f"{_short_id(f['test'])}: {_last_line(f['detail'])}"
              for found in files.values() for f in found.get("failures") or []]
    counts = ", ".join(f"{Path(path).name} {found.get('tests_run')} run" for path, found in files.items())
    also = f"; not verdicts: {'; '.join(noted)}" if noted else ""
    if failed:
        return WitnessResult(name, BUG, level, (f"{len(failed)} failed assertion(s) in {ran} tests ({counts}): "
                                                + "; ".join(failed) + also)[:2000], cases=cases)
    if noted:
        # Nothing failed, and not every test ran and passed: no test says the bug is gone.
        return WitnessResult(name, UNAVAILABLE, level, f"cannot tell: {ran} ran ({counts}), but {'; '.join(noted)}"[:1500],
                             cases=cases)
    return WitnessResult(name, CLEAN, level, f"{ran} passed ({counts})", cases=cases)


def test_cases(files: dict) -> dict[str, str]:
    """Each test that started (``Class.test_method``) and its own verdict: ``bug`` when its
    assertion failed (a subtest's included), ``clean`` when it ran and passed, ``unavailable``
    when it skipped, errored, or was an expected failure or an unexpected success; the worst of
    its subtests. A file that could not run gives none."""
    cases: dict[str, str] = {}
    rank = {CLEAN: 0, BUG: 1, UNAVAILABLE: 2}

    def note(test_id: str, state: str) -> None:
        key = _case_id(test_id)
        if key and rank[state] >= rank[cases.get(key, CLEAN)]:
            cases[key] = state

    for found in files.values():
        for test in found.get("tests") or []:
            note(test, CLEAN)
        for failed in found.get("failures") or []:
            note(failed["test"], BUG)
        for kind in ("errors", "skipped", "expected_failures"):
            for item in found.get(kind) or []:
                note(item["test"], UNAVAILABLE)
        for test in found.get("unexpected_successes") or []:
            note(test, UNAVAILABLE)
    return cases


def _case_id(test_id: str) -> str:
    """``module.Class.test_x (sub)`` -> ``Class.test_x``; "" for what is no test method
    (``setUpClass (module.Class)``)."""
    head = test_id.split(" ", 1)[0]
    parts = head.split(".")
    return ".".join(parts[-2:]) if len(parts) >= 3 else ""


def _skips(skipped: list[dict]) -> str:
    return "; ".join(f"{_short_id(s['test'])}: {s.get('reason') or 'no reason'}" for s in skipped[:5])


def _last_line(text: str) -> str:
    """The exception's own line (``AssertionError: ...``), else the last line."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line)]
    return (named or lines or [""])[-1]


def _short_id(test_id: str) -> str:
    """``module.Class.test_x (sub)`` -> ``Class.test_x (sub)``."""
    head, _, sub = test_id.partition(" ")
    return ".".join(head.split(".")[-2:]) + (f" {sub}" if sub else "")
