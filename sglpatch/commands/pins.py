"""``sglpatch pins``: the pinned releases."""

from __future__ import annotations

from dataclasses import asdict

from sglpatch import exitcodes
from sglpatch.cli_options import add, emit_json, json_flag, say


def register(sub) -> None:
    json_flag(add(sub, "pins", run, "list the pinned releases"))


def run(project, args) -> int:
    pins = project.pins().pins
    for pin in pins:
        commit = pin.commit[:12] if pin.commit else "(unknown)"
        verified = "verified" if pin.commit_verified else "unverified"
        say(args, f"{pin.version:<14} {pin.tag:<15} {commit:<12} {verified:<10} {pin.artifact}  {pin.rocm_image}")
    emit_json(args, [asdict(pin) for pin in pins])
    return exitcodes.OK
