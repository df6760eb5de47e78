"""Patch 0003's own words: the warning it adds names --enable-aiter-allreduce-fusion and, in
0003's sentence, every gate that keeps the fusion from engaging.

The rocm-flags witness judges behaviour only (a warning-level record that names the flag, in
any words), so that an upstream fix worded otherwise is recognised; the wording 0003 chose is
checked here, on every rendition's text and on every patched pin's own ServerArgs."""

from __future__ import annotations

import re

import pytest

from conftest import REAL_PINS, REPO_ROOT, one_pin_per_rendition, read_only_tree, skip_unless_required
from sglpatch.series.patches import load_series
from sglpatch.witnesses import rocm_flags

PATCH = "0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default.patch"
SENTENCE = "--enable-aiter-allreduce-fusion has no effect: "
ENDING = ". The all-reduce and the RMSNorm run unfused."
# scenario of the witness -> the reason 0003 gives for it, in its words
REASONS = {
    "flag-no-custom-all-reduce": "--disable-custom-all-reduce is set",
    "flag-no-SGLANG_USE_AITER": "SGLANG_USE_AITER is not set",
    "flag-SGLANG_USE_AITER_AR-0": "SGLANG_USE_AITER_AR=0 picks sglang's custom all-reduce",
    "flag-1stage-allreduce": "SGLANG_USE_1STAGE_ALLREDUCE=1 picks sglang's custom all-reduce",
    "flag-dp-attention": "DP attention is enabled",
    "flag-tp6": "tp_size is 6",
}
GATES = tuple(REASONS.values())


def _added_lines(diff_text: str) -> str:
    return "\n".join(line[1:] for line in diff_text.splitlines() if line.startswith("+") and not line.startswith("+++"))


@pytest.mark.parametrize("rendition", load_series(REPO_ROOT / "patches").get(PATCH).renditions, ids=lambda r: r.path.name)
def test_every_rendition_words_the_inert_fusion_warning_with_each_gate(rendition):
    added = _added_lines(rendition.diff_text)
    assert '"--enable-aiter-allreduce-fusion has no effect: %s. The all-reduce "' in added
    assert '"and the RMSNorm run unfused.",' in added
    for gate in GATES:
        assert f'"{gate}"' in added, gate
    # A warning, from the logger of the hook that decides the fusion; the old wording is gone.
    assert re.search(r"logger\.warning\(\s*\"--enable-aiter-allreduce-fusion has no effect", added)
    assert "The unfused all-reduce is used" not in added and "not a ROCm build" not in added


@pytest.mark.network
@pytest.mark.parametrize("version", one_pin_per_rendition(PATCH))
def test_the_patched_pin_warns_in_0003s_words_naming_each_closed_gate(version, tmp_path):
    pin = REAL_PINS.select([version])[0]
    tree = read_only_tree(version, PATCH)
    try:
        resolved = rocm_flags.resolve_server_args(tree, pin, {name: rocm_flags.SCENARIOS[name] for name in
                                                             (*REASONS, "flag")})
    except rocm_flags.WitnessUnavailable as exc:
        skip_unless_required(str(exc))
    for scenario, reason in REASONS.items():
        warnings = rocm_flags.inert_fusion_warnings(resolved[scenario])
        assert len(warnings) == 1, (scenario, warnings)
        assert warnings[0].startswith(SENTENCE) and warnings[0].endswith(ENDING)
        assert reason in warnings[0], (scenario, warnings[0])
    assert rocm_flags.inert_fusion_warnings(resolved["flag"]) == []
