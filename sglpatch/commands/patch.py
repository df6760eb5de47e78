"""``sglpatch patch start|refresh|tidy``: write patches on a pin's tree, with quilt and git habits,
and keep the renditions few."""

from __future__ import annotations

from sglpatch import exitcodes
from sglpatch.cli_options import add, pin_version, say
from sglpatch.series import authoring


def register(sub) -> None:
    parser = add(sub, "patch", None, "write patches on a pin's tree: start, refresh (quilt and git habits)")
    actions = parser.add_subparsers(required=True, metavar="ACTION")
    start = add(actions, "start", run_start, "apply the series to a pin's tree, ready for your commits")
    start.add_argument("pin")
    refresh = add(actions, "refresh", run_refresh,
                  "write the commits of a pin's tree back into patches/ (or a hand port prepared by rebase under build/port/)")
    refresh.add_argument("pin")
    refresh.add_argument("--rendition-of", metavar="PATCH",
                         help="new commits are this patch's rendition for the pin (its name or number, e.g. 0002)")
    tidy = add(actions, "tidy", run_tidy,
               "remove each rendition its neighbour reproduces (the same tree by exact or three-way apply) and keep "
               "the newest rendition in the main file; written only when every pin's tree stays the lock's")
    tidy.add_argument("--dry-run", action="store_true", help="say what would change; write nothing")


def run_start(project, args) -> int:
    version = pin_version(project, args.pin)
    tree = authoring.start(project, version)
    say(args, f"{tree}: the series is applied on branch sglpatch")
    say(args, "  commit your change there (git commit); amend or rebase the series' own commits to change them;")
    say(args, f"  then: sglpatch patch refresh {version}")
    return exitcodes.OK


def run_refresh(project, args) -> int:
    from sglpatch.rebase import hand_port

    prepared = project.build_dir / "port" / args.pin.removeprefix("v") / ".git" / hand_port.HAND_PORT_NOTE
    if prepared.is_file() and args.pin.removeprefix("v") not in [pin.version for pin in project.pins().pins]:
        # A tree `sglpatch rebase` left for a hand port of a release that is not pinned yet.
        version = args.pin.removeprefix("v")
        for written in hand_port.refresh_hand_port(project, version):
            say(args, f"rendition      {written.relative_to(project.root)}  (from {prepared.parent.parent.relative_to(project.root)})")
        say(args, f"next: sglpatch check, then sglpatch rebase {version}, and commit what it writes")
        return exitcodes.OK
    version = pin_version(project, args.pin)
    refreshed = authoring.refresh(project, version, args.rendition_of)
    for item in refreshed:
        say(args, f"{item.action:<14} {item.path.relative_to(project.root)}  {item.subject}")
    problems, tests_to_write = authoring.problems_of(project, refreshed)
    for problem in problems:
        say(args, problem)
    for test in tests_to_write:
        say(args, f"next: its regression test: {test.replace('add tests/', 'add patches/tests/', 1)}")
    if any(item.action != "unchanged" for item in refreshed):
        say(args, f"next: sglpatch check, then sglpatch apply {version} --update-lock, and commit patches/ and the lock")
    return exitcodes.FAILED if problems else exitcodes.OK


def run_tidy(project, args) -> int:
    from sglpatch.rebase.tidy import tidy_renditions

    report = tidy_renditions(project, write=not args.dry_run)
    for line in report.removed:
        say(args, f"removed  {line}")
    for line in report.moved:
        say(args, f"main     {line}")
    if not report.changed:
        say(args, "nothing to tidy: no rendition is reproduced by its neighbour, and each main file is the newest")
    elif report.written:
        say(args, f"written; applied to {', '.join(report.pins)}: every tree is the lock's, the commits recorded again")
        say(args, "next: commit patches/ and series.lock")
    else:
        say(args, f"dry run: nothing written (it would apply {', '.join(report.pins)} and keep each tree the lock's)")
    return exitcodes.OK
