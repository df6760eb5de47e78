"""``sglpatch pins``: the pinned releases."""

from __future__ import annotations

from dataclasses import asdict

from sglpatch import exitcodes
from sglpatch.cli_options import add, emit_json, json_flag, say


def register(sub) -> None:
    json_flag(add(sub, "pins", run, "list the pinned releases"))


# The columns, their headings as the glossary explains them (docs/glossary.md: pin, tag commit).
HEADINGS = ("version", "tag", "tag commit", "checked", "artifact", "ROCm image")


def run(project, args) -> int:
    pins = project.pins().pins
    rows = [HEADINGS] + [
        (pin.version, pin.tag, pin.commit[:12] if pin.commit else "(unknown)",
         "verified" if pin.commit_verified else "unverified", pin.artifact, pin.rocm_image)
        for pin in pins
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(HEADINGS) - 1)]
    for row in rows:
        say(args, "  ".join(f"{cell:<{width}}" for cell, width in zip(row, widths)) + f"  {row[-1]}")
    emit_json(args, [asdict(pin) for pin in pins])
    return exitcodes.OK
