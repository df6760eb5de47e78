"""The launch profile: the flags the GLM-5.2 MXFP4 bring-up needs, at any speculative depth."""

from __future__ import annotations

import pytest

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.serving.profile import load_profile, profile_names


def test_glm_profile_carries_every_flag_the_bring_up_needed():
    profile = load_profile("glm-5.2-mxfp4-mi355x")
    args = profile.server_args("/m")
    assert profile.architecture == "GlmMoeDsaForCausalLM" and profile.env == {"SGLANG_USE_AITER": "1"}
    for flag in ("--enable-aiter-allreduce-fusion", "--disable-custom-all-reduce", "--trust-remote-code"):
        assert flag in args
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert args[args.index("--tp-size") + 1] == "8"
    assert args[:2] == ["--model-path", "/m"]


@pytest.mark.parametrize("depth", range(1, 7))
def test_depth_d_means_d_steps_topk_1_and_d_plus_1_draft_tokens(depth):
    args = load_profile("glm-5.2-mxfp4-mi355x").with_depth(depth).server_args()
    value = lambda flag: args[args.index(flag) + 1]  # noqa: E731
    assert value("--speculative-algorithm") == "EAGLE"
    assert (value("--speculative-num-steps"), value("--speculative-eagle-topk"), value("--speculative-num-draft-tokens")) == (
        str(depth), "1", str(depth + 1))


def test_model_comes_from_the_environment_when_not_given(monkeypatch):
    monkeypatch.setenv("SGLPATCH_MODEL", "/data/glm")
    assert load_profile(profile_names()[0]).server_args()[1] == "/data/glm"


def test_unknown_profile_is_refused_with_the_known_ones():
    with pytest.raises(SglpatchError, match="known: glm-5.2-mxfp4-mi355x"):
        load_profile("nope")


def _said(capsys, *argv) -> tuple[int, str, str]:
    from sglpatch import cli

    status = cli.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_another_depth_says_that_depth_in_the_header_too(capsys):
    status, out, _ = _said(capsys, "profile", "--depth", "3")
    header, command = out.splitlines()
    assert status == 0 and header.endswith("EAGLE/MTP depth 3") and "depth 5" not in header
    assert "--speculative-num-steps 3 " in command and "--speculative-num-draft-tokens 4" in command
    assert _said(capsys, "profile")[1].splitlines()[0].endswith("EAGLE/MTP depth 5")


@pytest.mark.parametrize("argv, says", [
    (["profile", "--depth", "0"], "sglpatch profile: error: argument --depth: '0' is no speculative depth: "
                                  "a depth is a whole number of draft steps from 1 to 16"),
    (["profile", "--depth", "five"], "sglpatch profile: error: argument --depth: 'five' is no speculative depth"),
    # README invites --depth beside the serve recipe's apply: the depth is the launch profile's.
    (["apply", "0.5.23", "--depth", "9"], "sglpatch apply: error: unrecognized arguments: --depth 9; --depth is an "
                                          "option of sglpatch profile: speculative depth D, a whole number of draft "
                                          "steps from 1 to 16"),
])
def test_a_depth_that_is_no_depth_or_given_to_another_command_is_one_line_saying_which_depths_are(capsys, argv, says):
    status, out, err = _said(capsys, *argv)
    assert status == 2 and out == "" and len(err.splitlines()) == 1 and err.startswith(says), err
    assert ".toml" not in err and "usage:" not in err
