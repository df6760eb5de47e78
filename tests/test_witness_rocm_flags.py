"""The rocm-flags witness on the real releases: every pin's own ServerArgs, resolved on CPU with the
GLM-5.2 MI355X launch profile, misses the fusion / fp8 KV defaults or stays silent about an inert
fusion (bug); with patch 0003's rendition for the pin it does neither (clean)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REAL_PINS as PINS
from conftest import apply_rendition, pristine_subtree
from sglpatch.witnesses import BUG, CLEAN
from sglpatch.witnesses import rocm_flags

PATCH = "0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default"

pytestmark = pytest.mark.network


def _pristine_tree(pin, dest: Path) -> Path:
    return pristine_subtree(pin.version, dest)


def _patched(tree: Path, version: str) -> Path:
    return apply_rendition(tree, PATCH, version)


@pytest.mark.parametrize("version", [pin.version for pin in PINS.pins])
def test_pristine_pin_misses_the_defaults_or_hides_the_inert_fusion(version, tmp_path):
    pin = PINS.select([version])[0]
    result = rocm_flags.RocmFlagsWitness().run(_pristine_tree(pin, tmp_path), pin)
    print(f"{version}: {result}")
    assert result.state == BUG, result
    # Every pin: the profile's KV default is bf16 on gfx950 and no pin warns about the inert fusion.
    assert "defaults: kv_cache_dtype bfloat16, want fp8_e4m3" in result.detail
    assert "profile: silent" in result.detail


@pytest.mark.parametrize("version", [pin.version for pin in PINS.pins])
def test_patched_pin_defaults_fusion_and_fp8_and_names_every_inert_gate(version, tmp_path):
    pin = PINS.select([version])[0]
    result = rocm_flags.RocmFlagsWitness().run(_patched(_pristine_tree(pin, tmp_path), version), pin)
    print(f"{version}: {result}")
    assert result.state == CLEAN, result


def test_resolve_server_args_reports_depth_normalisation_and_rejected_argv(tmp_path):
    pin = PINS.select(["0.5.23"])[0]
    depth3 = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "6"]
    resolved = rocm_flags.resolve_server_args(
        _pristine_tree(pin, tmp_path),
        pin,
        {
            # The profile is depth 5 (5/1/6); depth 3 with a stale draft-token count: sglang
            # forces D = N + 1 when top-k is 1.
            "depth3": (depth3, {}),
            "bad-tp": (["--tp-size", "eight"], {}),
        },
    )
    depth = resolved["depth3"]
    assert depth["error"] is None, depth
    assert (depth["speculative_algorithm"], depth["speculative_num_steps"], depth["speculative_eagle_topk"]) == (
        "EAGLE",
        3,
        1,
    )
    assert depth["speculative_num_draft_tokens"] == 4
    assert isinstance(depth["warnings"], list)
    assert resolved["bad-tp"]["error"] and "SystemExit" in resolved["bad-tp"]["error"]


def test_profile_argv_edits_drop_and_override_the_profiles_flags():
    profile = rocm_flags.load_profile(rocm_flags.PROFILE)
    edits = ["!--kv-cache-dtype", "!--disable-custom-all-reduce", "--tp-size", "6"]
    argv = rocm_flags.profile_argv(profile, "/m", edits)
    assert "--kv-cache-dtype" not in argv and "--disable-custom-all-reduce" not in argv
    assert argv[:2] == ["--model-path", "/m"]
    # argparse keeps the last value, so the scenario's --tp-size wins over the profile's.
    assert argv[len(argv) - 1 - argv[::-1].index("--tp-size") + 1] == "6"
    assert "--enable-aiter-allreduce-fusion" in argv and argv[argv.index("--device") + 1] == "cuda"
