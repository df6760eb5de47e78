"""``sglpatch rebase``: the series rebased onto a release that is not pinned."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

from sglpatch import exitcodes
from sglpatch.cli_options import add, emit_json, json_flag, say
from sglpatch.rebase.refusals import BACKWARDS_FLAG, refuse_before_porting


def register(sub) -> None:
    parser = add(sub, "rebase", run, "rebase the series onto a new sglang release")
    parser.add_argument("version", help="the new sglang version, e.g. 0.5.24")
    parser.add_argument("--dry-run", action="store_true", help="classify only; write nothing")
    parser.add_argument(BACKWARDS_FLAG, action="store_true",
                        help="take a release older than every pin (the series ported back from the oldest; "
                             "such a release may hold bugs the series does not fix)")
    json_flag(parser)


def run(project, args) -> int:
    # What cannot be ported is refused before the rebase's machinery is even imported.
    version = refuse_before_porting(project.pins(), args.version, backwards=args.backwards)
    from sglpatch.rebase.onto import rebase_onto

    report = rebase_onto(project, version, write=not args.dry_run, backwards=args.backwards)
    say(args, report.text())
    if report.written:
        say(args, "written: " + ", ".join(report.files) + "; review and commit them")
    elif not report.complete:
        say(args, "not written: not every patch is classified; the series, pins and lock are unchanged")
    else:
        say(args, "dry run: nothing written; would write " + ", ".join(report.files))
    emit_json(args, report.to_dict())
    return exitcodes.OK if report.complete else exitcodes.FAILED


def refusal(root: Path, argv: list[str]) -> str | None:
    """Why ``sglpatch rebase ARGV`` in the project at ``root`` would be refused before it starts,
    or None (also where the arguments do not parse: the command itself says so). What ``nox -s
    rebase`` asks in nox's own Python before it installs anything (``refusals``)."""
    from sglpatch.plumbing.errors import SglpatchError
    from sglpatch.sources.pins import load_pins

    top = argparse.ArgumentParser(prog="sglpatch", add_help=False)
    register(top.add_subparsers(dest="verb"))
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the command itself says what is wrong with them
            args = top.parse_args(["rebase", *argv])
    except SystemExit:
        return None
    try:
        refuse_before_porting(load_pins(root / "upstream" / "pins.toml"), args.version, backwards=args.backwards)
    except SglpatchError as exc:
        return str(exc)
    return None
