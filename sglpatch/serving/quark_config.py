"""The hand fix for Quark checkpoints, for users who cannot patch their image: copy the MTP
layer's exclude entries under the names sglang builds the draft layer with.

Quark names the MTP layer after its index, ``model.layers.{num_hidden_layers}.*``; sglang builds
it as ``model.decoder.*``, with the MTP-only pieces at ``model.eh_proj``, ``model.enorm``,
``model.hnorm`` and ``model.shared_head.*``. sglang matches the exclude list by exact name or
``re:`` pattern, and a fused module (``gate_up_proj``) through the packed-modules mapping by its
halves (``gate_proj``, ``up_proj``), from 0.5.21 also by its fused name; the loader puts the halves
in that mapping for Quark from 0.5.11 (0.5.10 has none). So a fused module is written in both
forms: the halves of a fused entry, and the fused name once all its halves are excluded. This
rewrites only ``config.json`` (never a weight file), keeps a backup of the original, and running
it twice changes nothing the second time. From 0.5.16 sglang carries exact names over itself, so
there only ``re:`` entries need it (docs/research/mtp/NOTES.md); and from 0.5.19 the added
``model.decoder.mlp.shared_experts.*`` names cost the target its shared-experts fusion, which the
release keeps with the checkpoint's own names (Quark's fusion gate counts ``model.layers.{N}.*``
as the draft's, not the decoder names), so there it is worth it only for ``re:`` spellings.

What config alone cannot fix (``Rewrite.limits``): on AMD gfx942/gfx950 the MTP draft of sglang
0.5.10 to 0.5.15 fuses its shared expert into the MXFP4 routed experts whatever the exclude list
says, so it cannot stay bf16, and routed experts the checkpoint excludes expert by expert stay
MXFP4 in the draft's fused ``mlp.experts`` (per-expert names match that module only from 0.5.21);
there patch 0002 is needed. On 0.5.22 and 0.5.23 the draft would
fuse it as well, and the added ``model.decoder.*`` names stop that only because Quark's fusion
gate takes them for the target's own shared experts (``QuarkConfig._is_draft_layer`` knows
``model.layers.{N}.*``, not the decoder names), which turns the target's fusion off too; patch
0002 keeps the target's. ``sglpatch quark-mtp-exclude`` says so whenever the checkpoint keeps the
MTP shared expert out of quantization. What the command gives on each release is checked on one
pin per rendition of 0002 by ``tests/test_quark_config.py`` (each spelling, rewritten, through
the pristine release's own code).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.plumbing.errors import SglpatchError

BACKUP_SUFFIX = ".sglpatch-backup"
MTP_ONLY = ("eh_proj", "enorm", "hnorm", "shared_head")
# sglang's fused modules and the halves the checkpoint keeps separate (packed_modules_mapping).
FUSED = {"gate_up_proj": ("gate_proj", "up_proj"), "fused_qkv_a_proj_with_mqa": ("q_a_proj", "kv_a_proj_with_mqa")}
SHARED_EXPERT_FUSION = (
    "cannot fix by config alone: patch 0002 needed. On AMD gfx942/gfx950 the MTP draft of sglang "
    "0.5.10 to 0.5.15 fuses its shared expert into the MXFP4 routed experts whatever the exclude list "
    "says, so it cannot stay bf16, and routed experts excluded expert by expert stay MXFP4 there. On 0.5.22 and 0.5.23 the names added here keep it out of the fusion "
    "only because sglang takes them for the target's shared experts, which turns the target's fusion "
    "off too (0.5.16 to 0.5.21 keep it bf16 with these names and do not fuse it)"
)


def decoder_name(name: str, mtp_layer: int) -> str | None:
    """The name sglang gives checkpoint module ``name``, or None when it is not in the MTP layer."""
    prefix = f"model.layers.{mtp_layer}."
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix) :]
    head = rest.split(".", 1)[0]
    return f"model.{rest}" if head in MTP_ONLY else f"model.decoder.{rest}"


def decoder_pattern(pattern: str, mtp_layer: int) -> str | None:
    """A ``re:`` exclude pattern rewritten to match the decoder names, or None if it is not
    written for the MTP layer (it must spell the layer index out literally)."""
    match = re.search(rf"layers(\\\.|\.){mtp_layer}(\\\.|\.)", pattern)
    if not match:
        return None
    head, tail = pattern[: match.start()], pattern[match.end() :]
    if re.match(rf"\(?(?:{'|'.join(MTP_ONLY)})\b", tail):
        return head + tail  # model.layers.N.eh_proj -> model.eh_proj
    return head + "decoder" + match.group(2) + tail


def fused_forms(names: list[str]) -> list[str]:
    """The other spelling of each fused module among exact ``names``: the halves of a fused
    name, and the fused name of halves that are all present."""
    present = set(names)
    extra = []
    for name in names:
        stem, _, leaf = name.rpartition(".")
        if leaf in FUSED:
            extra += [f"{stem}.{half}" for half in FUSED[leaf]]
        for fused, halves in FUSED.items():
            if leaf in halves and all(f"{stem}.{half}" in present for half in halves):
                extra.append(f"{stem}.{fused}")
    return extra


@dataclass(frozen=True)
class Rewrite:
    path: Path
    added: list[str]
    backup: Path | None
    limits: list[str] = field(default_factory=list)  # what config alone cannot fix here


def add_mtp_aliases(checkpoint: Path) -> Rewrite:
    """Add decoder-name copies of the MTP layer's exclude entries to ``checkpoint/config.json``."""
    config_path = checkpoint / "config.json" if checkpoint.is_dir() else checkpoint
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise SglpatchError(f"{config_path}: not found") from None
    except ValueError as exc:
        raise SglpatchError(f"{config_path}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise SglpatchError(f"{config_path}: not a JSON object")
    quant = config.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "quark":
        raise SglpatchError(f"{config_path}: no Quark quantization_config (quant_method 'quark')")
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool):
        raise SglpatchError(f"{config_path}: num_hidden_layers is missing; it is the MTP layer's index")
    exclude = quant.get("exclude")
    if not isinstance(exclude, list):
        raise SglpatchError(f"{config_path}: quantization_config.exclude is not a list")
    for position, entry in enumerate(exclude):
        if not isinstance(entry, str):
            raise SglpatchError(
                f"{config_path}: quantization_config.exclude[{position}] is {json.dumps(entry)}, not a string "
                "(a module name or a re: pattern)")
    aliases = []
    for entry in exclude:
        if entry.startswith("re:"):
            alias = decoder_pattern(entry[3:], layers)
            aliases.append(f"re:{alias}" if alias is not None else None)
        else:
            aliases.append(decoder_name(entry, layers))
    exact = [alias for alias in aliases if alias is not None and not alias.startswith("re:")]
    added = []
    for alias in [*aliases, *fused_forms(exact)]:
        if alias is not None and alias not in exclude and alias not in added:
            added.append(alias)
    backup = None
    if added:
        backup = config_path.with_name(config_path.name + BACKUP_SUFFIX)
        if not backup.exists():
            backup.write_bytes(config_path.read_bytes())
        quant["exclude"] = exclude + added
        tmp = config_path.with_name(f".{config_path.name}.sglpatch-{id(added)}.tmp")
        tmp.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        tmp.replace(config_path)
    keeps_shared_expert = any(_names_shared_expert(entry, layers) for entry in exclude)
    return Rewrite(path=config_path, added=added, backup=backup,
                   limits=[SHARED_EXPERT_FUSION] if keeps_shared_expert else [])


def _names_shared_expert(entry: str, layer: int) -> bool:
    """Whether an exclude entry keeps (part of) the MTP layer's shared expert out of quantization."""
    if entry.startswith("re:"):
        try:
            return re.search(entry[3:], f"model.layers.{layer}.mlp.shared_experts.down_proj") is not None or \
                re.search(entry[3:], f"model.layers.{layer}.mlp.shared_experts.gate_proj") is not None
        except re.error:
            return False
    return entry.startswith(f"model.layers.{layer}.mlp.shared_experts.")
