"""The hand fix for Quark checkpoints, for users who cannot patch their image: copy the MTP
layer's exclude entries under the names sglang builds the draft layer with.

Quark names the MTP layer after its index, ``model.layers.{num_hidden_layers}.*``; sglang builds
it as ``model.decoder.*``, with the MTP-only pieces at ``model.eh_proj``, ``model.enorm``,
``model.hnorm`` and ``model.shared_head.*``. This rewrites only ``config.json`` (never a weight
file), keeps a backup of the original, and running it twice changes nothing the second time.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from sglpatch.errors import SglpatchError

BACKUP_SUFFIX = ".sglpatch-backup"
MTP_ONLY = ("eh_proj", "enorm", "hnorm", "shared_head")


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


@dataclass(frozen=True)
class Rewrite:
    path: Path
    added: list[str]
    backup: Path | None


def add_mtp_aliases(checkpoint: Path) -> Rewrite:
    """Add decoder-name copies of the MTP layer's exclude entries to ``checkpoint/config.json``."""
    config_path = checkpoint / "config.json" if checkpoint.is_dir() else checkpoint
    try:
        config = json.loads(config_path.read_text())
    except FileNotFoundError:
        raise SglpatchError(f"{config_path}: not found") from None
    except ValueError as exc:
        raise SglpatchError(f"{config_path}: not valid JSON: {exc}") from None
    quant = config.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "quark":
        raise SglpatchError(f"{config_path}: no Quark quantization_config (quant_method 'quark')")
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int):
        raise SglpatchError(f"{config_path}: num_hidden_layers is missing; it is the MTP layer's index")
    exclude = quant.get("exclude")
    if not isinstance(exclude, list):
        raise SglpatchError(f"{config_path}: quantization_config.exclude is not a list")
    added = []
    for entry in list(exclude):
        if entry.startswith("re:"):
            alias = decoder_pattern(entry[3:], layers)
            alias = f"re:{alias}" if alias is not None else None
        else:
            alias = decoder_name(entry, layers)
        if alias is not None and alias not in exclude and alias not in added:
            added.append(alias)
    backup = None
    if added:
        backup = config_path.with_name(config_path.name + BACKUP_SUFFIX)
        if not backup.exists():
            backup.write_bytes(config_path.read_bytes())
        quant["exclude"] = exclude + added
        tmp = config_path.with_name(config_path.name + ".tmp")
        tmp.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        tmp.replace(config_path)
    return Rewrite(path=config_path, added=added, backup=backup)
