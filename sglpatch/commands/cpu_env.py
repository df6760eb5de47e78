"""``sglpatch cpu-env``: build (or reuse) the CPU Python the witnesses' probes run in."""

from __future__ import annotations

import argparse
import json

from sglpatch import exitcodes
from sglpatch.cli_options import add, jobs_flag, say
from sglpatch.apply.where_written import written_for
from sglpatch.commands import apply, check, rebase, upstream, witness
from sglpatch.witnesses import probe_runs

WITNESSING_VERBS = {"apply": apply, "check": check, "witness": witness, "rebase": rebase, "upstream": upstream}


def register(sub) -> None:
    parser = add(sub, "cpu-env", run, "build (or reuse) the CPU Python the witnesses' probes run in")
    parser.add_argument("pins", nargs="*", help="pin versions (default: all)")
    jobs_flag(parser, "build distinct environments")
    parser.add_argument(
        "--for", dest="for_run", nargs=argparse.REMAINDER, metavar="COMMAND",
        help="the environments a run of `sglpatch COMMAND ...` will use (apply, check, witness, rebase, upstream), "
        "read with that command's own arguments; nothing when that run runs no witness",
    )
    parser.add_argument("--needs", action="store_true",
                        help="with --for: print what that run needs, as JSON {witnesses, pins}, and build nothing")


def run(project, args) -> int:
    versions = args.pins
    if args.for_run is not None:
        needs = witness_needs(args.for_run, project)
        if args.needs:
            print(json.dumps(needs))
            return exitcodes.OK
        if not needs["witnesses"]:
            say(args, f"sglpatch {' '.join(args.for_run)} runs no witness: no CPU Python to build")
            return exitcodes.OK
        versions = needs["pins"]
    pins = project.pins().select(versions)
    for pin, python in zip(pins, probe_runs.cpu_pythons(pins, args.jobs)):
        overlay = " ".join(f"{name}{spec}" for name, spec in python.overlay.items()) or "(the base alone)"
        say(args, f"{pin.version}: {python.python}  {overlay}")
    return exitcodes.OK


def witness_needs(argv: list[str], project=None) -> dict:
    """Whether ``sglpatch ARGV`` runs witnesses, and for which pins (empty: all), read with the
    verb's own parser, so nox and CI never re-parse sglpatch's arguments."""
    if not argv or argv[0] not in WITNESSING_VERBS:
        return {"witnesses": False, "pins": []}
    top = argparse.ArgumentParser(prog="sglpatch")
    sub = top.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    for verb in WITNESSING_VERBS.values():
        verb.register(sub)
    args = top.parse_args(argv)
    if args.verb == "apply":
        runs = not args.no_witnesses and (args.into is None or args.witness)
        return {"witnesses": runs, "pins": list(args.pins) if runs else []}
    if args.verb == "check":
        # check judges each patch's tests on the release its fix was written for, and only there
        pins = sorted(set(written_for(project).values())) if project is not None and not args.no_witnesses else []
        return {"witnesses": bool(pins), "pins": pins}
    if args.verb == "witness":
        return {"witnesses": True, "pins": list(args.pins)}
    return {"witnesses": True, "pins": []}  # rebase and upstream witness the series on every pin
