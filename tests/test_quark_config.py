"""`sglpatch quark-mtp-exclude`: the hand fix for checkpoints, config.json only, idempotent; and
the hand fix as users rely on it: each spelling of a checkpoint's exclusions, rewritten by the
command, then built by every pristine release's own code (the MTP witness's probe)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from conftest import REAL_PINS, one_pin_per_rendition, read_only_tree, skip_unless_required
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.serving.quark_config import SHARED_EXPERT_FUSION, add_mtp_aliases, decoder_name, decoder_pattern
from sglpatch.witnesses import cpu_envs

EXCLUDE = [
    "lm_head",
    "model.layers.3.mlp.shared_experts.gate_up_proj",
    "model.layers.3.mlp.shared_experts.down_proj",
    "model.layers.3.eh_proj",
    "model.layers.3.shared_head.head",
    r"re:model\.layers\.3\.self_attn\..*",
    r"re:model\.layers\.\d+\.mlp\.gate$",
    "model.layers.0.self_attn.q_a_proj",
]


@pytest.fixture
def checkpoint(tmp_path):
    folder = tmp_path / "GLM-tiny-MXFP4"
    folder.mkdir()
    config = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "num_hidden_layers": 3,
        "quantization_config": {"quant_method": "quark", "exclude": list(EXCLUDE)},
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "model-00001-of-00001.safetensors").write_bytes(b"\x00weights" * 100)
    return folder


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_mtp_entries_get_decoder_names_exact_and_regex(checkpoint):
    rewrite = add_mtp_aliases(checkpoint)
    assert rewrite.added == [
        "model.decoder.mlp.shared_experts.gate_up_proj",
        "model.decoder.mlp.shared_experts.down_proj",
        "model.eh_proj",
        "model.shared_head.head",
        r"re:model\.decoder\.self_attn\..*",
        # sglang checks a fused module through its halves where its packed-modules mapping
        # holds gate_up_proj (0.5.14 on), by its fused name where it does not (0.5.10).
        "model.decoder.mlp.shared_experts.gate_proj",
        "model.decoder.mlp.shared_experts.up_proj",
    ]
    exclude = json.loads((checkpoint / "config.json").read_text())["quantization_config"]["exclude"]
    assert exclude[: len(EXCLUDE)] == EXCLUDE  # nothing removed or reordered


def test_unfused_halves_get_the_fused_decoder_name_too(tmp_path):
    halves = ["model.layers.3.mlp.shared_experts.gate_proj", "model.layers.3.mlp.shared_experts.up_proj",
              "model.layers.3.mlp.gate_proj"]  # a lone half: no fused name for it
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 3, "quantization_config": {"quant_method": "quark", "exclude": halves}}))
    added = add_mtp_aliases(tmp_path).added
    assert "model.decoder.mlp.shared_experts.gate_up_proj" in added
    assert "model.decoder.mlp.gate_up_proj" not in added


def test_a_kept_mtp_shared_expert_is_reported_as_beyond_config_alone(checkpoint, tmp_path):
    assert add_mtp_aliases(checkpoint).limits == [SHARED_EXPERT_FUSION]
    assert SHARED_EXPERT_FUSION.startswith("cannot fix by config alone: patch 0002 needed")
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 3, "quantization_config": {"quant_method": "quark", "exclude": ["model.layers.3.eh_proj"]}}))
    assert add_mtp_aliases(tmp_path).limits == []


def test_rewrite_keeps_a_backup_never_touches_weights_and_is_idempotent(checkpoint):
    original = (checkpoint / "config.json").read_bytes()
    weights = _digest(checkpoint / "model-00001-of-00001.safetensors")
    first = add_mtp_aliases(checkpoint)
    after_first = (checkpoint / "config.json").read_bytes()
    second = add_mtp_aliases(checkpoint)
    assert first.backup is not None and first.backup.read_bytes() == original
    assert second.added == [] and (checkpoint / "config.json").read_bytes() == after_first
    assert _digest(checkpoint / "model-00001-of-00001.safetensors") == weights
    assert sorted(p.name for p in checkpoint.iterdir()) == [
        "config.json",
        "config.json.sglpatch-backup",
        "model-00001-of-00001.safetensors",
    ]


def test_names_outside_the_mtp_layer_are_left_alone():
    assert decoder_name("model.layers.30.mlp.shared_experts.down_proj", 3) is None
    assert decoder_pattern(r"model\.layers\.30\.mlp", 3) is None


@pytest.mark.parametrize(
    "config, message",
    [
        ({"num_hidden_layers": 3}, "no Quark quantization_config"),
        ({"quantization_config": {"quant_method": "quark", "exclude": []}}, "num_hidden_layers is missing"),
        ({"num_hidden_layers": 3, "quantization_config": {"quant_method": "quark", "exclude": "x"}}, "not a list"),
        ({"num_hidden_layers": 3, "quantization_config": {"quant_method": "quark", "exclude": ["lm_head", 7]}},
         r"exclude\[1\] is 7, not a string"),
        ({"num_hidden_layers": 3, "quantization_config": {"quant_method": "quark",
                                                          "exclude": [{"re": "model.layers.3.*"}]}}, "not a string"),
        ([1, 2], "not a JSON object"),
    ],
)
def test_unusable_config_is_refused_naming_the_file(tmp_path, config, message):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SglpatchError, match=message) as error:
        add_mtp_aliases(tmp_path)
    assert str(tmp_path / "config.json") in str(error.value)
    assert not (tmp_path / "config.json.sglpatch-backup").exists()


def test_cli_works_outside_a_project(checkpoint, tmp_path):
    run = subprocess.run(["python", "-m", "sglpatch", "quark-mtp-exclude", str(checkpoint)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "added model.decoder.mlp.shared_experts.gate_up_proj" in run.stdout
    assert f"note: {SHARED_EXPERT_FUSION}" in run.stdout


def test_cli_refuses_a_non_string_exclude_entry_in_one_line_and_changes_nothing(tmp_path):
    config = {"num_hidden_layers": 3, "quantization_config": {"quant_method": "quark",
                                                             "exclude": ["model.layers.3.eh_proj", None]}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    before = sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir())
    run = subprocess.run(["python", "-m", "sglpatch", "quark-mtp-exclude", str(tmp_path)], capture_output=True,
                         text=True, cwd=tmp_path, timeout=60)
    assert run.returncode != 0
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "config.json" in lines[0] and "exclude[1]" in lines[0], run.stderr
    assert "Traceback" not in run.stderr
    assert sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir()) == before


# -- the hand fix through each pristine release's own code -------------------------------------


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """For each spelling: a tiny GLM-5 Quark checkpoint (the MTP witness's) spelled that way,
    rewritten by the command as a user runs it, and what the command said. The same for every
    pin (the rewrite reads only the checkpoint), so it is made once and read by each pin's test."""
    from sglpatch.witnesses import mtp_exclude
    from sglpatch.witnesses.probes import quark_checkpoint

    made = {}
    for seed, spelling in enumerate(mtp_exclude.EXCLUDED_SPELLINGS):
        folder = tmp_path_factory.mktemp("rewritten") / spelling
        quark_checkpoint.write_mtp_checkpoint(str(folder), spelling, seed=seed)
        run = subprocess.run(["python", "-m", "sglpatch", "quark-mtp-exclude", str(folder)], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        made[spelling] = (folder, run.stdout)
    return made


@pytest.mark.network
@pytest.mark.parametrize("version", one_pin_per_rendition("0002-quark-keep-mtp-draft-excluded-modules-unquantized"))
def test_rewritten_checkpoint_is_clean_on_the_pristine_pin_or_the_command_said_it_cannot(version, tmp_path, rewritten):
    from sglpatch.witnesses import mtp_exclude

    pin = REAL_PINS.select([version])[0]
    tree = read_only_tree(version)
    cases = {spelling: folder for spelling, (folder, _) in rewritten.items()}
    said = {spelling: stdout for spelling, (_, stdout) in rewritten.items()}
    try:
        answer = mtp_exclude.resolve_mtp_cases(tree, pin, cases)
    except cpu_envs.EnvUnavailable as exc:
        skip_unless_required(f"the pin's CPU Python cannot be built here: {exc}")
    for spelling, found in answer["cases"].items():
        assert "error" not in found, found
        problems = mtp_exclude.case_problems(found)
        print(f"{version} {spelling}: draft fusion {found['draft_fusion']}; {problems or 'clean'}")
        if not problems:
            continue
        # Not fixed: only what the command said config alone cannot fix may remain.
        assert f"note: {SHARED_EXPERT_FUSION}" in said[spelling]
        assert found["draft_fusion"] == "on"
        assert all(problem.split(" ", 1)[0] in mtp_exclude.SHARED_EXPERT and " fused into " in problem
                   for problem in problems), problems
