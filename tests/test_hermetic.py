"""Every child gets a declared environment, never the caller's shell: the same tree gets the same
answers in a shell full of the variables a ROCm image or a user carries as in a clean one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from conftest import REAL_PINS, git, shipped_trees
from sglpatch.apply.checkouts import checkout_commit
from sglpatch.plumbing import cache, processes
from sglpatch.witnesses import answer_cache, mtp_exclude, rocm_flags, rocm_guard
from sglpatch.witnesses import probe_children
from sglpatch.witnesses.results import CLEAN

# What a ROCm image or a user's shell may hold: each would change what sglang resolves, what
# torch reports or what a compiler finds, and no answer's key covers it.
ROCM_SHELL = {
    "SGLANG_USE_AITER_AR": "0",
    "SGLANG_USE_AITER": "0",
    "SGLANG_ENABLE_TORCH_COMPILE": "1",
    "HIP_VISIBLE_DEVICES": "0",
    "ROCR_VISIBLE_DEVICES": "0",
    "HSA_OVERRIDE_GFX_VERSION": "9.4.2",
    "CUDA_VISIBLE_DEVICES": "",
    "TORCH_CUDA_ARCH_LIST": "9.0",
    "PYTORCH_ROCM_ARCH": "gfx942",
    "OMP_NUM_THREADS": "1",
    "CPATH": "/nonexistent/include",
    "CPLUS_INCLUDE_PATH": "/nonexistent/include",
    "PYTHONPATH": "/nonexistent/site-packages",
}


def test_a_child_gets_only_what_it_needs_to_run_and_what_it_is_declared(monkeypatch):
    for name, value in ROCM_SHELL.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("PIP_INDEX_URL", "file:///an/index")
    env = processes.declared_env(extra={"SGLANG_USE_AITER": "1"})
    assert env["PATH"] == os.environ["PATH"] and env["LC_ALL"] == "C.UTF-8"
    assert env["SGLANG_USE_AITER"] == "1"  # declared
    assert not [name for name in ROCM_SHELL if name in env and name != "SGLANG_USE_AITER"]
    assert "PIP_INDEX_URL" not in env and processes.pip_env()["PIP_INDEX_URL"] == "file:///an/index"
    seen = processes.run_tool([sys.executable, "-c", "import os, json; print(json.dumps(dict(os.environ)))"],
                              "python", 60).stdout
    assert "SGLANG_USE_AITER_AR" not in seen and "HSA_OVERRIDE_GFX_VERSION" not in seen


def test_the_probe_child_environment_holds_nothing_of_the_callers_shell(monkeypatch, tmp_path):
    for name, value in ROCM_SHELL.items():
        monkeypatch.setenv(name, value)
    env = probe_children.child_env(tmp_path)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "python"), str(probe_children.PROBES)]
    assert not [name for name in ROCM_SHELL if name in env and name != "PYTHONPATH"]


@pytest.mark.network
def test_a_real_pins_witnesses_answer_the_same_in_a_rocm_shell_as_in_a_clean_one(monkeypatch, tmp_path):
    """0.5.23 patched, every witness computed fresh (answer caches of the test's own; the
    downloads, environments and toolchain are shared): in a shell holding SGLANG_USE_AITER_AR=0
    and the rest, 0003's witness once called this tree witness-failed."""
    version = "0.5.23"
    pin = REAL_PINS.select([version])[0]
    shipped = shipped_trees(version)
    tree_hash = git(Path(shipped.tree_path), "rev-parse", f"{shipped.commit}^{{tree}}").strip()
    asked = [rocm_guard.RocmGuardWitness(), mtp_exclude.MtpQuarkExcludeWitness(), rocm_flags.RocmFlagsWitness()]

    def answers(shell: dict[str, str], where: str) -> dict[str, tuple[str, str]]:
        with monkeypatch.context() as scope:
            scope.setenv(cache.ANSWERS_ENV, str(tmp_path / where / "answers"))
            for name, value in shell.items():
                scope.setenv(name, value)
            probe_children.close_fork_servers()  # each shell starts its own probe children
            found = answer_cache.run_cached_many(
                asked, tree_hash, pin, lambda: checkout_commit(Path(shipped.tree_path), shipped.commit, tmp_path / where / "tree"))
            probe_children.close_fork_servers()
        assert (tmp_path / where / "tree").is_dir(), "the answers were not computed fresh"
        return {name: (result.state, result.level) for name, result in found.items()}

    clean = answers({}, "clean")
    assert answers(ROCM_SHELL, "rocm-shell") == clean
    assert {state for state, _ in clean.values()} == {CLEAN}, clean
