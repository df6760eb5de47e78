"""The CPU probe runner: one child per tree, every probe under its own time limit, and a child that
hangs or fails gives every witness an answer naming what hung or failed, never a TimeoutExpired.

The tree here is a stand-in sglang package written by the test (the runner imports ``sglang``
and its ``server_args``), with probes that sleep; the interpreter is the real CPU Python."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from conftest import REAL_PINS, skip_unless_required
from sglpatch.witnesses import cpu_envs, probe_children, probe_runs
from sglpatch.witnesses import probing
from sglpatch.witnesses.results import CLEAN, UNAVAILABLE, WitnessResult

pytestmark = pytest.mark.network  # the pin's CPU Python

SLEEPY = '''
import signal
import time


def run(spec, context):
    context.phase("sleeping in the probe")
    if spec.get("ignore_alarm"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(spec["sleep"])
    return {"slept": spec["sleep"]}
'''


@pytest.fixture
def python():
    try:
        return probe_runs.cpu_python(REAL_PINS.newest)
    except cpu_envs.EnvUnavailable as exc:
        skip_unless_required(f"no CPU Python here: {exc}")


def _tree(root: Path, broken: bool = False) -> Path:
    package = root / "python" / "sglang"
    (package / "srt").mkdir(parents=True)
    (package / "__init__.py").write_text('raise ImportError("this sglang does not import")\n' if broken
                                         else '__version__ = "0.0.0+test-tree"\n')
    (package / "srt" / "__init__.py").write_text("")
    (package / "srt" / "server_args.py").write_text("class ServerArgs:\n    pass\n")
    (root / "python" / "sleepy_probe.py").write_text(textwrap.dedent(SLEEPY))
    return root


def _sleepy(name: str, sleep: float, limit_s: float, **spec) -> probe_runs.ProbeRequest:
    return probe_runs.ProbeRequest(name, "sleepy_probe", {"sleep": sleep, **spec}, limit_s)


class SleepyWitness:
    version = "1"

    def __init__(self, name, sleep, limit_s):
        self.name, self.sleep, self.limit_s = name, sleep, limit_s

    def probe_request(self, pin):
        return _sleepy(self.name, self.sleep, self.limit_s)

    def judge_probe(self, answer, failure, pin):
        if answer is None:
            return WitnessResult(self.name, UNAVAILABLE, detail=failure)
        return WitnessResult(self.name, CLEAN, detail=f"slept {answer['slept']}")

    def run(self, tree, pin):
        return probing.run_probe_witnesses([self], tree, pin)[self.name]


def test_a_probe_past_its_limit_is_unavailable_naming_its_phase_and_the_next_probe_still_runs(python, tmp_path, monkeypatch):
    monkeypatch.setattr(probe_runs, "cpu_python", lambda pin: python)
    tree = _tree(tmp_path / "tree")
    slow, quick = SleepyWitness("slow", sleep=60, limit_s=2), SleepyWitness("quick", sleep=0, limit_s=30)
    started = time.monotonic()
    results = probing.run_probe_witnesses([slow, quick], tree, REAL_PINS.newest)
    assert time.monotonic() - started < 50
    assert results["slow"].state == UNAVAILABLE
    assert "ran past its 2 s limit while in: sleeping in the probe" in results["slow"].detail, results["slow"]
    assert results["quick"].state == CLEAN, results["quick"]


def test_a_child_that_hangs_past_the_whole_limit_is_killed_and_the_answer_names_the_phase(python, tmp_path):
    tree = _tree(tmp_path / "tree")
    started = time.monotonic()
    run = python.run_probes(tree, [_sleepy("stuck", sleep=600, limit_s=600, ignore_alarm=True)], timeout=8)
    assert time.monotonic() - started < 60
    assert run.answers == {}
    assert run.failure("stuck") == run.error
    assert "hung in 'stuck: sleeping in the probe' and was killed after 8 s" in run.error, run.error


def test_a_tree_whose_sglang_does_not_import_fails_every_probe_with_the_reason(python, tmp_path):
    run = python.run_probes(_tree(tmp_path / "tree", broken=True), [_sleepy("a", 0, 10), _sleepy("b", 0, 10)])
    for name in ("a", "b"):
        assert "failed in 'import sglang'" in run.failure(name) and "this sglang does not import" in run.failure(name)


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_a_child_forked_from_the_fork_server_answers_as_a_fresh_interpreter(version, tmp_path, monkeypatch):
    """The fork server imports the environment's packages before any tree's sglang; the witnesses'
    answers must not depend on that."""
    import re

    from conftest import apply_rendition, pristine_subtree
    from sglpatch.witnesses import mtp_exclude, rocm_flags

    pin = REAL_PINS.select([version])[0]
    try:
        python = probe_runs.cpu_python(pin)
    except cpu_envs.EnvUnavailable as exc:
        skip_unless_required(f"no CPU Python here: {exc}")
    tree = pristine_subtree(version, tmp_path / "tree")
    for patch in ("0002-quark-keep-mtp-draft-excluded-modules-unquantized.patch",
                  "0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default.patch"):
        apply_rendition(tree, patch, version)
    checks = [mtp_exclude.MtpQuarkExcludeWitness(), rocm_flags.RocmFlagsWitness()]

    def answers():
        run = python.run_probes(tree, [w.probe_request(pin) for w in checks])
        results = [w.judge_probe(run.answers.get(w.probe_request(pin).name), run.failure(w.probe_request(pin).name), pin)
                   for w in checks]
        return [(r.state, r.level, re.sub(r"resolved in \d+s", "", r.detail)) for r in results], run.runner

    forked, forked_runner = answers()
    monkeypatch.setenv(probe_children.FORK_SERVER_ENV, "0")
    fresh, fresh_runner = answers()
    assert forked_runner.get("fork_server") and not fresh_runner.get("fork_server")
    assert forked == fresh
    assert [state for state, _, _ in forked] == ["clean", "clean"]


COUNTING = '''
import os


def run(spec, context):
    with open(os.environ["SGLPATCH_TEST_PROBE_RUNS"], "a") as handle:
        handle.write("ran\\n")
    with open(spec["checkpoint"]) as handle:
        return {"read": handle.read(), "from": spec["checkpoint"]}
'''


def test_a_remembered_probe_run_is_given_back_for_the_same_content_anywhere_and_run_again_when_it_changes(python, tmp_path):
    import uuid

    runs = tmp_path / "runs"
    content = f"weights {uuid.uuid4()}\n"  # a key no other run has made

    def ask(where: str, text: str | None = content):
        root = _tree(tmp_path / where)
        (root / "python" / "counting_probe.py").write_text(textwrap.dedent(COUNTING))
        checkpoint = tmp_path / f"{where}-checkpoint.txt"
        if text is not None:
            checkpoint.write_text(text)
        request = probe_runs.ProbeRequest("counting", "counting_probe", {"checkpoint": str(checkpoint)}, 60,
                                     import_env=(("SGLPATCH_TEST_PROBE_RUNS", str(runs)),))
        run = python.run_probes(root, [request], remember=True)
        return run, checkpoint, (runs.read_text().count("ran") if runs.exists() else 0)

    first, checkpoint, ran = ask("a")
    assert first.failure("counting") is None and first.answers["counting"]["from"] == str(checkpoint) and ran == 1
    again, checkpoint, ran = ask("b")  # the same tree and checkpoint, in other folders
    assert ran == 1 and again.runner.get("remembered")
    assert again.answers["counting"]["read"] == content and again.answers["counting"]["from"] == str(checkpoint)
    _, _, ran = ask("c", f"other weights {uuid.uuid4()}\n")  # new to this run too, wherever tmp_path is
    assert ran == 2
    for where in ("d", "e"):  # a run whose probe failed is never kept
        failed, _, _ = ask(where, None)
        assert failed.failure("counting")
    assert runs.read_text().count("ran") == 4
