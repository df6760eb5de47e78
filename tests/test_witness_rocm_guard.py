"""The rocm-guard witness on the real releases: fails where the guard is missing, passes where it
is there (patched, or fixed upstream), at the strongest level this machine has."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import REAL_PINS as PINS
from conftest import REQUIRE_WITNESSES, apply_rendition, one_pin_per_rendition, pristine_subtree, shipped_trees, witnessed
from sglpatch.plumbing import cache
from sglpatch.witnesses import guard_kernel, hip_toolchain, rocm_guard
from sglpatch.witnesses.results import BUG, CLEAN

GUARD_FIXED_UPSTREAM = Version("0.5.15")
PATCH = "0001-amd-guard-cuda-runtime-include-fused-metadata-copy.patch"
# A pin of each rendition, the newest, and the pins either side of upstream's own guard: the
# witness must tell them apart exactly there.
_AROUND_THE_FIX = sorted(
    {*one_pin_per_rendition(PATCH), PINS.newest.version,
     max((p.version for p in PINS.pins if p.parsed_version < GUARD_FIXED_UPSTREAM), key=Version),
     min((p.version for p in PINS.pins if p.parsed_version >= GUARD_FIXED_UPSTREAM), key=Version)},
    key=Version,
)

pytestmark = pytest.mark.network


def _pristine_kernels(pin, dest: Path) -> Path:
    return pristine_subtree(pin.version, dest, keep=lambda name: "jit" in name)


def _guarded(tree: Path, pin) -> Path:
    return apply_rendition(tree, PATCH, pin.version)


def _level_expected() -> str:
    # CI installs the toolchain, so there only the strong level is accepted.
    return "hip-compile" if REQUIRE_WITNESSES or hip_toolchain.HipToolchain.find() else "include-graph"


def _assert_both_mi300_and_mi355_targets(result) -> None:
    # gfx942 is MI300X, gfx950 MI355X (the write-up's GPU); each is judged with its own fp8 flag.
    if result.level.startswith("hip-compile"):
        assert result.level == "hip-compile gfx942,gfx950", result


@pytest.mark.parametrize("version", _AROUND_THE_FIX)
def test_rocm_guard_fails_exactly_where_the_guard_is_missing(version, tmp_path):
    pin = PINS.select([version])[0]
    result = witnessed(rocm_guard.RocmGuardWitness(), version, False, tmp_path / "tree")
    print(f"{version} pristine: {result}")
    expected = BUG if pin.parsed_version < GUARD_FIXED_UPSTREAM else CLEAN
    assert result.state == expected, result
    assert result.level.startswith(_level_expected())
    _assert_both_mi300_and_mi355_targets(result)
    if expected == BUG:
        assert "cuda_runtime.h" in result.detail and "fused_metadata_copy.cuh" in result.detail


@pytest.mark.parametrize("version", [v for v in _AROUND_THE_FIX if Version(v) < GUARD_FIXED_UPSTREAM])
def test_rocm_guard_passes_once_the_patch_is_applied(version, tmp_path):
    result = witnessed(rocm_guard.RocmGuardWitness(), version, True, tmp_path / "tree")
    print(f"{version} patched: {result}")
    assert result.state == CLEAN, result
    assert result.level.startswith(_level_expected())
    _assert_both_mi300_and_mi355_targets(result)


def test_one_real_pins_answer_is_computed_in_this_run_not_taken_from_the_answer_cache(tmp_path, monkeypatch):
    """The tests above share the persistent answer cache with apply (what one computed the next
    reads), so a run could pass on answers an older witness gave. Here one tree of one pin is
    asked with answers of its own: the witness and its compiles really run, every time; the
    downloads, the pristine trees and the toolchain are still shared."""
    version = "0.5.14"
    shipped_trees(version)  # the pin's trees, built with the shared caches before they are left out
    answers = tmp_path / "answers"
    monkeypatch.setenv(cache.ANSWERS_ENV, str(answers))
    result = witnessed(rocm_guard.RocmGuardWitness(), version, False, tmp_path / "tree")
    # answer_cache.run_cached checks the tree out only for a witness that must run.
    assert (tmp_path / "tree").is_dir(), "the answer was taken from a cache"
    assert list((answers / "witness" / "rocm-guard").glob("*.json")), "the fresh answer was not kept where it was computed"
    assert result.state == BUG and "fused_metadata_copy.cuh" in result.detail, result
    assert result.level.startswith(_level_expected())
    _assert_both_mi300_and_mi355_targets(result)


@pytest.mark.parametrize("guarded", [False, True], ids=["pristine", "patched"])
def test_include_graph_level_tells_the_same_without_the_toolchain(guarded, tmp_path, monkeypatch):
    monkeypatch.setenv("SGLPATCH_HIP_TOOLCHAIN", str(tmp_path / "no-toolchain-here"))
    pin = PINS.select(["0.5.14"])[0]
    tree = _pristine_kernels(pin, tmp_path / "tree")
    result = rocm_guard.RocmGuardWitness().run(_guarded(tree, pin) if guarded else tree, pin)
    assert result.level == "include-graph gfx942,gfx950"
    assert result.state == (CLEAN if guarded else BUG), result


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed on this machine")
def test_cuda_side_still_compiles_with_nvcc_after_the_patch(tmp_path):
    pin = PINS.select(["0.5.14"])[0]
    layout = guard_kernel.kernel_layout(_guarded(_pristine_kernels(pin, tmp_path), pin))
    result = rocm_guard.cuda_check(layout, rocm_guard.tvm_ffi_headers(rocm_guard.required_tvm_ffi(pin)))
    assert result.state == CLEAN, result
