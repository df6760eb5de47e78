"""The witness cache: an answer is reused only for the same witness code and probes, the same
environment, the same tree, and no stronger level available now; written atomically; and the
batch API runs every CPU-probe witness of a tree in one go."""

from __future__ import annotations

import json
import shutil
import threading

import pytest

from conftest import REAL_PINS
from sglpatch.witnesses import answer_cache, mtp_exclude, probing, rocm_flags
from sglpatch.witnesses import cpu_envs, probe_children, probe_runs
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE, WitnessResult

PIN = REAL_PINS.newest


class Counting:
    """A witness whose answer and fingerprint the test sets."""

    version = "1"

    def __init__(self, name="counting", state=CLEAN, level="text", print_="a"):
        self.name, self.state, self.level, self.print_ = name, state, level, print_
        self.runs = 0

    def fingerprint(self, pin):
        return self.print_

    def run(self, tree, pin):
        self.runs += 1
        return WitnessResult(self.name, self.state, self.level, f"run {self.runs}")


class Levelled(Counting):
    """Two levels, the stronger first; ``now`` is what can run here."""

    levels = ("hip-compile", "include-graph")

    def __init__(self):
        super().__init__("levelled", level="include-graph")
        self.now = "include-graph"

    def available_level(self, pin):
        return self.now


def _tree(tmp_path):
    """The tree a witness runs on: a folder of its own (the cache lives beside it, in tmp_path)."""
    tree = tmp_path / "tree"
    tree.mkdir(exist_ok=True)
    return lambda: tree


def test_the_same_tree_and_fingerprint_reuse_the_answer_and_a_new_fingerprint_runs_again(cache_dir, tmp_path):
    witness = Counting()
    first = answer_cache.run_cached(witness, "tree1", PIN, _tree(tmp_path))
    again = answer_cache.run_cached(witness, "tree1", PIN, _tree(tmp_path))
    assert (witness.runs, again) == (1, first)
    answer_cache.run_cached(witness, "tree2", PIN, _tree(tmp_path))
    assert witness.runs == 2
    witness.print_ = "b"  # its code, probes or environment changed
    answer_cache.run_cached(witness, "tree1", PIN, _tree(tmp_path))
    assert witness.runs == 3


def test_an_answer_from_a_weaker_level_than_now_available_is_not_reused(cache_dir, tmp_path):
    witness = Levelled()
    answer_cache.run_cached(witness, "t", PIN, _tree(tmp_path))
    answer_cache.run_cached(witness, "t", PIN, _tree(tmp_path))
    assert witness.runs == 1
    witness.now, witness.level = "hip-compile", "hip-compile gfx942"  # the toolchain got installed
    assert answer_cache.run_cached(witness, "t", PIN, _tree(tmp_path)).level == "hip-compile gfx942"
    assert witness.runs == 2
    answer_cache.run_cached(witness, "t", PIN, _tree(tmp_path))
    assert witness.runs == 2  # the stronger answer is kept
    entry = next((cache_dir / "answers" / "witness" / "levelled").glob("*.json"))
    assert json.loads(entry.read_text())["level"] == "hip-compile gfx942"


def test_unavailable_is_never_cached(cache_dir, tmp_path):
    witness = Counting(state=UNAVAILABLE)
    answer_cache.run_cached(witness, "t", PIN, _tree(tmp_path))
    answer_cache.run_cached(witness, "t", PIN, _tree(tmp_path))
    assert witness.runs == 2


def test_a_witness_without_a_fingerprint_is_keyed_by_the_file_of_its_class(cache_dir, tmp_path, monkeypatch):
    module = tmp_path / "plain_witness.py"
    module.write_text("from sglpatch.witnesses.results import WitnessResult\n"
                      "class Plain:\n    name = 'plain'\n    version = '1'\n"
                      "    def run(self, tree, pin):\n        return WitnessResult('plain', 'bug')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from plain_witness import Plain

    before = answer_cache.fingerprint(Plain(), PIN)
    module.write_text(module.read_text() + "# edited\n")
    assert answer_cache.fingerprint(Plain(), PIN) != before


def test_writes_are_atomic_under_unique_names(cache_dir, tmp_path):
    witness = Counting()
    key = answer_cache._key(witness, "t", "a")
    entry = answer_cache._entry(witness, "t", PIN, "a")
    errors = []

    def write(n):
        try:
            for i in range(30):
                answer_cache._store(key, WitnessResult("counting", BUG, "text", f"{n}-{i}"), "a", "t")
                json.loads(entry.read_text())  # never half-written
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [p.name for p in entry.parent.iterdir()] == [entry.name], "a temporary file was left behind"


def test_a_damaged_entry_is_run_again(cache_dir, tmp_path):
    witness = Counting()
    answer_cache.run_cached(witness, "t", PIN, _tree(tmp_path))
    entry = next((cache_dir / "answers" / "witness" / "counting").glob("*.json"))
    entry.write_text("{not json")
    answer_cache.run_cached(witness, "t", PIN, _tree(tmp_path))
    assert witness.runs == 2


# -- the CPU witnesses' fingerprints: code, probes, environment ---------------------------------


@pytest.fixture
def offline_env(monkeypatch, tmp_path):
    """The CPU environment's inputs without the network: the pin's overlay specs as given."""
    overlay = {"specs": ("transformers==5.19.0",)}
    monkeypatch.setattr(cpu_envs, "_pin_overlay_specs", lambda version, sha256, pin: overlay["specs"])
    return overlay


@pytest.mark.parametrize("witness", [mtp_exclude.MtpQuarkExcludeWitness(), rocm_flags.RocmFlagsWitness()],
                         ids=lambda w: w.name)
def test_editing_a_probe_changes_the_cpu_witness_fingerprint(witness, offline_env, tmp_path, monkeypatch, cache_dir):
    before = answer_cache.fingerprint(witness, PIN)
    probes = tmp_path / "probes"
    shutil.copytree(probe_children.PROBES, probes)
    monkeypatch.setattr(probe_children, "PROBES", probes)
    assert answer_cache.fingerprint(witness, PIN) == before  # the same files
    (probes / "standins.py").write_text((probes / "standins.py").read_text() + "\n# a changed stand-in\n")
    assert answer_cache.fingerprint(witness, PIN) != before


@pytest.mark.parametrize("witness", [mtp_exclude.MtpQuarkExcludeWitness(), rocm_flags.RocmFlagsWitness()],
                         ids=lambda w: w.name)
def test_changing_the_cpu_environment_changes_the_fingerprint(witness, offline_env, tmp_path, monkeypatch, cache_dir):
    before = answer_cache.fingerprint(witness, PIN)
    requirements = tmp_path / "requirements-cpu.txt"
    requirements.write_text(cpu_envs.REQUIREMENTS.read_text() + "sglpatch-extra==1.0\n")
    monkeypatch.setattr(cpu_envs, "REQUIREMENTS", requirements)
    changed_base = answer_cache.fingerprint(witness, PIN)
    assert changed_base != before
    offline_env["specs"] = ("transformers==5.20.0",)  # the pin's overlay
    assert answer_cache.fingerprint(witness, PIN) not in (before, changed_base)


def _built_environment(versions: dict[str, str]) -> None:
    """The pin's CPU environment as its build records it (the base alone: the offline overlay
    specs are satisfied by its transformers), without building anything."""
    base = cpu_envs._base_path()
    base.mkdir(parents=True, exist_ok=True)
    (base / "sglpatch-complete.json").write_text(json.dumps({"packages": versions}, sort_keys=True))


@pytest.mark.parametrize("witness", [mtp_exclude.MtpQuarkExcludeWitness(), rocm_flags.RocmFlagsWitness()],
                         ids=lambda w: w.name)
def test_the_versions_pip_installed_change_the_cpu_witness_fingerprint(witness, offline_env, cache_dir):
    _built_environment({"torch": "2.13.0+cpu", "transformers": "5.19.0", "numpy": "2.3.0"})
    before = answer_cache.fingerprint(witness, PIN)
    _built_environment({"torch": "2.13.0+cpu", "transformers": "5.19.0", "numpy": "2.3.1"})  # the same specifiers
    assert answer_cache.fingerprint(witness, PIN) != before


def test_an_answer_run_before_the_environment_was_built_is_kept_under_the_built_environments_key(
        offline_env, cache_dir, tmp_path):
    class Building(mtp_exclude.MtpQuarkExcludeWitness):
        probe_request = None
        runs = 0

        def run(self, tree, pin):
            Building.runs += 1
            _built_environment({"torch": "2.13.0+cpu", "transformers": "5.19.0"})  # as cpu_python(pin) would
            return WitnessResult(self.name, BUG, "build+load gfx950", "stub answer for the cache test")

    witness = Building()
    assert not cpu_envs.env_built(PIN)
    unbuilt = answer_cache.fingerprint(witness, PIN)
    answer_cache.run_cached(witness, "t", PIN, _tree(tmp_path))
    assert cpu_envs.env_built(PIN) and answer_cache.fingerprint(witness, PIN) != unbuilt
    assert not answer_cache._entry(witness, "t", PIN, unbuilt).exists()
    answer_cache.run_cached(witness, "t", PIN, _tree(tmp_path))
    assert Building.runs == 1


@pytest.mark.parametrize("make", [mtp_exclude.MtpQuarkExcludeWitness, rocm_flags.RocmFlagsWitness],
                         ids=lambda m: m.name)
def test_editing_the_launch_profile_changes_the_cpu_witness_fingerprint(make, offline_env, tmp_path, monkeypatch,
                                                                         cache_dir):
    from sglpatch.serving import profile

    before = answer_cache.fingerprint(make(), PIN)
    profiles = tmp_path / "profiles"
    shutil.copytree(profile.PROFILES_DIR, profiles)
    monkeypatch.setattr(profile, "PROFILES_DIR", profiles)
    assert answer_cache.fingerprint(make(), PIN) == before  # the same content elsewhere
    edited = profiles / f"{rocm_flags.PROFILE}.toml"
    edited.write_text(edited.read_text().replace("[env]", "[env]\nSGLANG_EXTRA_KNOB = \"1\"", 1))  # name and version unchanged
    assert answer_cache.fingerprint(make(), PIN) != before


def test_a_changed_probe_runs_the_witness_again_through_the_cache(offline_env, tmp_path, monkeypatch, cache_dir):
    class Probing(mtp_exclude.MtpQuarkExcludeWitness):
        probe_request = None  # run() below, not the CPU probe
        runs = 0

        def run(self, tree, pin):
            Probing.runs += 1
            return WitnessResult(self.name, BUG, "build+load gfx950", "stub answer for the cache test")

    probes = tmp_path / "probes"
    shutil.copytree(probe_children.PROBES, probes)
    monkeypatch.setattr(probe_children, "PROBES", probes)
    witness = Probing()
    answer_cache.run_cached(witness, "t", PIN, _tree(tmp_path))
    answer_cache.run_cached(witness, "t", PIN, _tree(tmp_path))
    assert Probing.runs == 1
    (probes / "mtp_probe.py").write_text((probes / "mtp_probe.py").read_text() + "\n# edited\n")
    answer_cache.run_cached(witness, "t", PIN, _tree(tmp_path))
    assert Probing.runs == 2


# -- the batch API --------------------------------------------------------------------------------


class FakeProbe(Counting):
    def probe_request(self, pin):
        return probe_runs.ProbeRequest(self.name, "fake", {}, 10)

    def judge_probe(self, answer, failure, pin):
        return WitnessResult(self.name, CLEAN if answer else UNAVAILABLE, "probe", failure or "")


def test_run_cached_many_runs_the_probe_witnesses_of_a_tree_together_and_materializes_once(cache_dir, tmp_path, monkeypatch):
    batches = []

    def run_probe_witnesses(group, tree, pin):
        batches.append(sorted(w.name for w in group))
        return {w.name: w.judge_probe({"ok": True}, None, pin) for w in group}

    monkeypatch.setattr(probing, "run_probe_witnesses", run_probe_witnesses)
    made = []
    plain, mtp, flags = Counting("plain"), FakeProbe("mtp-like"), FakeProbe("flags-like")

    def materialize():
        made.append(1)
        return tmp_path

    results = answer_cache.run_cached_many([plain, mtp, flags], "t", PIN, materialize)
    assert list(results) == ["plain", "mtp-like", "flags-like"]
    assert batches == [["flags-like", "mtp-like"]] and plain.runs == 1 and made == [1]
    again = answer_cache.run_cached_many([plain, mtp, flags], "t", PIN, materialize)
    assert again == results and batches == [["flags-like", "mtp-like"]] and made == [1]  # all cached


def test_one_probe_child_that_fails_makes_each_of_its_witnesses_unavailable_with_the_reason(tmp_path, monkeypatch):
    class Python:
        def run_probes(self, tree, requests):
            return probe_runs.ProbeRun({}, {}, "the CPU probe runner for t hung in 'mtp: fused: build the draft'", 1.0)

    monkeypatch.setattr(probe_runs, "cpu_python", lambda pin: Python())
    results = probing.run_probe_witnesses([FakeProbe("a"), FakeProbe("b")], tmp_path, PIN)
    assert {r.state for r in results.values()} == {UNAVAILABLE}
    assert all("hung in 'mtp: fused: build the draft'" in r.detail for r in results.values())


def test_no_cpu_environment_is_unavailable_for_every_probe_witness(tmp_path, monkeypatch):
    def unavailable(pin):
        raise cpu_envs.EnvUnavailable("CPU witness environment (base): pip failed")

    monkeypatch.setattr(probe_runs, "cpu_python", unavailable)
    results = probing.run_probe_witnesses([FakeProbe("a")], tmp_path, PIN)
    assert results["a"].state == UNAVAILABLE and results["a"].detail.startswith("CPU environment:")


class Slow(Counting):
    def run(self, tree, pin):
        import time

        time.sleep(1.0)
        return super().run(tree, pin)


def test_two_askers_of_the_same_answer_run_the_witness_once(cache_dir, tmp_path):
    witness = Slow()
    answers = []

    def ask():
        answers.append(answer_cache.run_cached(witness, "tree-a", PIN, _tree(tmp_path)))

    askers = [threading.Thread(target=ask) for _ in range(2)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    assert witness.runs == 1 and len(answers) == 2 and answers[0] == answers[1]


def test_one_witness_asked_for_twice_at_once_is_run_once(cache_dir, tmp_path):
    witness = Counting()
    answers = answer_cache.run_cached_many([witness, witness], "tree-b", PIN, _tree(tmp_path))
    assert witness.runs == 1 and list(answers) == ["counting"]
