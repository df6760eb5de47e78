"""The bench's launch profiles as each pin's own ServerArgs resolves them (CPU, HIP emulation)."""

from __future__ import annotations

import pytest

from conftest import REAL_PINS, read_only_tree, skip_unless_required
from sglpatch.serving.profile import load_profile
from sglpatch.witnesses import rocm_flags

pytestmark = pytest.mark.network  # the pins' trees and CPU Pythons come from the package index


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_tp4_x_dp2_is_two_tp4_replicas_without_dp_attention_on_the_pin(version, tmp_path):
    profile = load_profile("glm-5.2-mxfp4-mi355x-tp4dp2")
    tree = read_only_tree(version)
    try:
        resolved = rocm_flags.resolve_server_args(tree, REAL_PINS.select([version])[0], {"tp4dp2": ([], {})}, profile=profile)
    except rocm_flags.WitnessUnavailable as exc:
        skip_unless_required(f"no CPU Python for {version}: {exc}")
    fields = resolved["tp4dp2"]
    assert fields["error"] is None, fields.get("traceback")
    assert fields["tp_size"] == 4 and fields["dp_size"] == 2
    assert not fields["enable_dp_attention"]
    assert fields["kv_cache_dtype"] == "fp8_e4m3" and fields["speculative_num_draft_tokens"] == 6


def test_the_single_stream_profiles_variant_turns_the_custom_all_reduce_back_on():
    profile = load_profile("glm-5.2-mxfp4-mi355x")
    assert "--disable-custom-all-reduce" in profile.server_args("/m")
    variant = profile.variant("custom-all-reduce").server_args("/m")
    assert "--disable-custom-all-reduce" not in variant and "--enable-aiter-allreduce-fusion" in variant
    assert profile.workload == "single-stream" and load_profile("glm-5.2-mxfp4-mi355x-tp4dp2").workload == "serving"
    assert all("MTP shared expert kept in bf16" in load_profile(n).quantization
               for n in ("glm-5.2-mxfp4-mi355x", "glm-5.2-mxfp4-mi355x-tp4dp2"))
