"""``sglpatch series bump|diff``: series versions."""

from __future__ import annotations

from sglpatch import exitcodes
from sglpatch.cli_options import add, say
from sglpatch.series import versions


def register(sub) -> None:
    parser = add(sub, "series", None, "series versions: bump, diff")
    actions = parser.add_subparsers(required=True, metavar="ACTION")
    bump = add(actions, "bump", run_bump, "record a new series version in patches/CHANGELOG.md")
    bump.add_argument("-m", "--message", required=True, help="the changelog entry")
    diff = add(actions, "diff", run_diff, "range-diff between two series versions")
    diff.add_argument("old", help="vN")
    diff.add_argument("new", help="vM")
    diff.add_argument("--pin", help="the pin to apply both to (default: the oldest)")


def run_bump(project, args) -> int:
    version = versions.bump(project.patches_dir, args.message)
    say(args, f"series v{version} recorded in {project.patches_dir / 'CHANGELOG.md'}")
    return exitcodes.OK


def run_diff(project, args) -> int:
    say(args, versions.range_diff(project, args.old.removeprefix("v"), args.new.removeprefix("v"), args.pin))
    return exitcodes.OK
