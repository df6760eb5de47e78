"""`sglpatch quark-mtp-exclude`: the hand fix for checkpoints, config.json only, idempotent."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from sglpatch.errors import SglpatchError
from sglpatch.quark_config import add_mtp_aliases, decoder_name, decoder_pattern

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
    ]
    exclude = json.loads((checkpoint / "config.json").read_text())["quantization_config"]["exclude"]
    assert exclude[: len(EXCLUDE)] == EXCLUDE  # nothing removed or reordered


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
    ],
)
def test_unusable_config_is_refused_naming_the_file(tmp_path, config, message):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(SglpatchError, match=message) as error:
        add_mtp_aliases(tmp_path)
    assert str(tmp_path / "config.json") in str(error.value)
    assert not (tmp_path / "config.json.sglpatch-backup").exists()


def test_cli_works_outside_a_project(checkpoint, tmp_path):
    run = subprocess.run(["python", "-m", "sglpatch", "quark-mtp-exclude", str(checkpoint)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "added model.decoder.mlp.shared_experts.gate_up_proj" in run.stdout
