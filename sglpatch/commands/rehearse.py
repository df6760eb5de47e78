"""``sglpatch rehearse PIN``: the ROCm job's in-image checks against the pin's real sglang server on
CPU, and a table of what ran and what could not (docs/rehearsal.md). It records no verdict."""

from __future__ import annotations

import signal
import sys

from packaging.version import Version

from sglpatch import exitcodes
from sglpatch.cli_options import add, say
from sglpatch.plumbing.errors import SglpatchError


def register(sub) -> None:
    parser = add(sub, "rehearse", run, "the ROCm job's checks against each pin's real sglang server on CPU (records no verdict)")
    parser.add_argument("pins", nargs="*", help="pin versions, rehearsed one after the other")
    parser.add_argument("--oldest-and-newest", action="store_true",
                        help="the oldest and the newest pin (what CI rehearses), after any named")


def run(project, args) -> int:
    from sglpatch.rehearsal.runner import rehearse, render

    # SIGTERM (a CI timeout, a person's kill) unwinds like an error: the held server is stopped.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    pins = project.pins().select(args.pins) if args.pins else []
    if args.oldest_and_newest:
        every = sorted(project.pins().select(None), key=lambda pin: Version(pin.version))
        pins += [pin for pin in (every[0], every[-1]) if pin not in pins]
    if not pins:
        raise SglpatchError("rehearse: name the pins to rehearse, or --oldest-and-newest")
    try:
        results = []
        for version in pins:
            rehearsal = rehearse(project, version.version, on_log=lambda line: say(args, line))
            say(args, render(rehearsal))
            results.append(rehearsal)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return exitcodes.OK if all(r.ok for r in results) else exitcodes.FAILED
