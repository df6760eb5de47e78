"""``sglpatch apply``: the series applied to pinned releases (or ``--into`` a checkout of yours)."""

from __future__ import annotations

from pathlib import Path

from sglpatch import exitcodes
from sglpatch.cli_options import add, emit_json, jobs_flag, json_flag, say, witness_mode
from sglpatch.errors import SglpatchError
from sglpatch.apply_pins import apply_series
from sglpatch.report import render_apply


def register(sub) -> None:
    parser = add(sub, "apply", run, "apply the series to pinned sglang releases")
    parser.add_argument("pins", nargs="*", help="pin versions (default: all)")
    parser.add_argument("--update-lock", action="store_true", help="accept results that differ from series.lock")
    parser.add_argument("--out", type=Path, help="where trees and the report go (default: build/)")
    parser.add_argument("--git-url", help="take pristine trees from this git remote or mirror, not the index")
    parser.add_argument("--report", type=Path, help="write the JSON report here (default: build/apply-report.json)")
    json_flag(parser)
    jobs_flag(parser, "apply pins")
    parser.add_argument(
        "--no-witnesses",
        action="store_true",
        help="classify by text alone (apply/reverse-apply), without running the patches' witnesses",
    )
    witness_mode(parser)
    parser.add_argument(
        "--into",
        type=Path,
        metavar="CHECKOUT",
        help="apply to your own sglang checkout (e.g. /sgl-workspace/sglang in the ROCm image) instead of build/trees: "
        "the pin's series exactly as series.lock pins it, no witness run (the pin: the checkout's own version, "
        "or name it after the checkout)",
    )
    parser.add_argument(
        "--witness",
        action="store_true",
        help="with --into: prove the series here with its witnesses first (builds their environments), "
        "instead of applying it as locked; also takes a series that differs from the lock",
    )
    parser.add_argument(
        "--discard-local",
        action="store_true",
        help="drop commits and untracked files of yours in build/trees/<pin> that the applied tree replaces",
    )


def run(project, args) -> int:
    if args.into is not None:
        return _into(project, args)
    if args.witness:
        raise SglpatchError("--witness goes with --into (apply runs the witnesses of every pin by default)")
    report = apply_series(
        project,
        args.pins,
        update_lock=args.update_lock,
        out_dir=args.out,
        git_url=args.git_url,
        report_path=args.report,
        run_witnesses=not args.no_witnesses,
        allow_unavailable=args.allow_unavailable,
        discard_local=args.discard_local,
        jobs=args.jobs,
    )
    where = args.report or (args.out or project.build_dir) / "apply-report.json"
    say(args, render_apply(report, str(where)))
    emit_json(args, report.to_dict())
    return exitcodes.for_pins(report.results)


def _into(project, args) -> int:
    from sglpatch.into import apply_into

    if len(args.pins) > 1:
        raise SglpatchError("--into takes at most one pin (default: the checkout's own sglang version)")
    if args.allow_unavailable and not args.witness:
        raise SglpatchError("--allow-unavailable with --into goes with --witness (as locked, no witness runs)")
    done = apply_into(project, args.into, args.pins[0] if args.pins else None, witness=args.witness,
                      allow_unavailable=args.allow_unavailable)
    say(args, f"{done.checkout}: the series for sglang {done.version} applied as {done.how}, {done.proof}")
    for line in [*done.commits, *done.files]:
        say(args, f"  {line[:12] if line in done.commits else line}")
    emit_json(args, {"checkout": str(done.checkout), "version": done.version, "how": done.how,
                     "proof": done.proof, "commits": done.commits, "files": done.files})
    return exitcodes.OK
