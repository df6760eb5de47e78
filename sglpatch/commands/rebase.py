"""``sglpatch rebase``: the series rebased onto a release that is not pinned."""

from __future__ import annotations

from sglpatch import exitcodes
from sglpatch.cli_options import add, emit_json, json_flag, say
from sglpatch.rebase.onto import rebase_onto


def register(sub) -> None:
    parser = add(sub, "rebase", run, "rebase the series onto a new sglang release")
    parser.add_argument("version", help="the new sglang version, e.g. 0.5.24")
    parser.add_argument("--dry-run", action="store_true", help="classify only; write nothing")
    json_flag(parser)


def run(project, args) -> int:
    report = rebase_onto(project, args.version.removeprefix("v"), write=not args.dry_run)
    say(args, report.text())
    if report.written:
        say(args, "written: " + ", ".join(report.files) + "; review and commit them")
    elif not report.complete:
        say(args, "not written: not every patch is classified; the series, pins and lock are unchanged")
    else:
        say(args, "dry run: nothing written; would write " + ", ".join(report.files))
    emit_json(args, report.to_dict())
    return exitcodes.OK if report.complete else exitcodes.FAILED
