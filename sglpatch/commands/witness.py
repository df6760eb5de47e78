"""``sglpatch witness``: every patch's witness on pins, pristine and patched; it records nothing."""

from __future__ import annotations

import tempfile
from pathlib import Path

from sglpatch import exitcodes
from sglpatch.apply.apply_pins import apply_series
from sglpatch.apply.report import render_witnesses
from sglpatch.cli_options import add, emit_json, jobs_flag, json_flag, say, witness_mode


def register(sub) -> None:
    parser = add(sub, "witness", run, "run each patch's witness on pins, pristine and patched (records nothing)")
    parser.add_argument("pins", nargs="*", help="pin versions (default: all)")
    witness_mode(parser)
    json_flag(parser)
    jobs_flag(parser, "witness pins")


def run(project, args) -> int:
    # The trees are built in a scratch folder: no branch moves and no lock entry is written;
    # apply is the command that records.
    with tempfile.TemporaryDirectory(prefix="sglpatch-witness-") as scratch:
        report = apply_series(project, args.pins, out_dir=Path(scratch), allow_unavailable=args.allow_unavailable,
                              record=False, jobs=args.jobs)
    say(args, render_witnesses(report))
    emit_json(args, report.to_dict())
    return exitcodes.for_pins(report.results)
