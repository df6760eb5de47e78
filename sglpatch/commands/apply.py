"""``sglpatch apply``: the series applied to pinned releases (or ``--into`` a checkout of yours)."""

from __future__ import annotations

from pathlib import Path

from sglpatch import exitcodes
from sglpatch.apply.apply_pins import apply_series
from sglpatch.apply.report import render_apply
from sglpatch.cli_options import add, emit_json, jobs_flag, json_flag, say, witness_mode
from sglpatch.plumbing.errors import SglpatchError


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
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="with --into: the proof in full (what the lock records of each patch's witness)")


# The flags that act on build/, the report or the lock: with --into (the user's checkout, the lock
# only read) they would mean nothing, so they are refused rather than ignored.
NOT_WITH_INTO = (("update_lock", "--update-lock"), ("jobs", "-j/--jobs"), ("no_witnesses", "--no-witnesses"),
                 ("discard_local", "--discard-local"), ("out", "--out"), ("report", "--report"),
                 ("git_url", "--git-url"))


def run(project, args) -> int:
    if args.into is not None:
        return _into(project, args)
    if args.witness:
        raise SglpatchError("--witness goes with --into (apply runs the witnesses of every pin by default)")
    if args.verbose:
        raise SglpatchError("-v goes with --into (apply prints every patch of every pin already)")
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
    from sglpatch.apply.into import apply_into

    if len(args.pins) > 1:
        raise SglpatchError("--into takes at most one pin (default: the checkout's own sglang version)")
    given = [flag for name, flag in NOT_WITH_INTO
             if getattr(args, name) not in (None, False) and (name != "jobs" or "jobs" in getattr(args, "given", ()))]
    if given:
        raise SglpatchError(f"{given[0]} means nothing with --into (it changes your checkout only; "
                            f"build/, the report and series.lock are left alone): drop {' '.join(given)}")
    if args.allow_unavailable and not args.witness:
        raise SglpatchError("--allow-unavailable with --into goes with --witness (as locked, no witness runs)")
    done = apply_into(project, args.into, args.pins[0] if args.pins else None, witness=args.witness,
                      allow_unavailable=args.allow_unavailable)
    for line in into_lines(done, verbose=args.verbose):
        say(args, line)
    emit_json(args, {"checkout": str(done.checkout), "version": done.version, "how": done.how,
                     "branch": done.branch, "head_before": done.head_before, "proof": done.proof,
                     "proof_by_patch": done.details,
                     "commits": done.commits, "subjects": done.subjects, "files": done.files,
                     "patches": [{"name": name, "status": status} for name, status in done.outcomes]})
    return exitcodes.OK


# What a patch's status means for a person reading what --into did (the others are their own words).
_SAID = {"not-needed": "not needed: fixed in this release", "already-upstream": "not needed: the release has it"}


def patch_outcomes(outcomes: list[tuple[str, str]]) -> str:
    """Every patch of the series for the pin, and what became of it, on one line: a patch that
    needs no commit here is named too (0001 on 0.5.23: the release has upstream's guard)."""
    return "patches: " + "; ".join(f"{name.split('-', 1)[0]} {_SAID.get(status, status)}" for name, status in outcomes)


def into_lines(done, *, verbose: bool = False) -> list[str]:
    """What ``apply --into`` tells a person: what changed, one line of what proved it, what next."""
    where, series = done.checkout, f"the series for sglang {done.version}"
    every = f"  {patch_outcomes(done.outcomes)}" if done.outcomes else None
    if done.how == "already applied":
        return [f"already applied: {series} {done.mode} is in {where}; nothing was changed", *filter(None, [every])]
    if done.how == "git commits":
        count = f"{len(done.commits)} commit{'s' if len(done.commits) != 1 else ''}"
        on = f"on branch {done.branch}" if done.branch else "on a detached HEAD"
        lines = [f"{where}: {count} added {on}, {series}:"]
        # Cut as git log's %<(N,trunc) does, so a line fits a terminal; the JSON keeps the whole subject.
        lines += [f"  {commit[:12]} {_cut(subject, SUBJECT_WIDTH)}" for commit, subject in zip(done.commits, done.subjects)]
    else:
        count = f"{len(done.files)} file{'s' if len(done.files) != 1 else ''}"
        lines = [f"{where}: {count} rewritten in place (not a git checkout), {series}:"]
        lines += [f"  {path}" for path in done.files]
    if every:
        lines.append(every)
    lines.append(f"proof: {done.summary}" + ("" if verbose else " (-v: more)"))
    if verbose:
        lines += [f"  {line}" for line in done.details]
    if done.how == "git commits":
        if not done.branch:
            lines.append("detached HEAD: the commits are on no branch; `git switch -c NAME` keeps them")
        lines.append(f"check: git -C {where} log --oneline -{len(done.commits) + 1}")
        lines.append(f"undo:  git -C {where} reset --keep {done.head_before[:12]}")
    else:
        lines.append(f"check: the files above; undo: put them back from sglang {done.version} as released")
    lines.append("next:  restart the sglang server: it loads the patched code when it starts")
    return lines


SUBJECT_WIDTH = 84  # with the indent and the 12-digit commit, a line of at most 99 characters


def _cut(subject: str, width: int) -> str:
    return subject if len(subject) <= width else subject[:width - 2] + ".."
