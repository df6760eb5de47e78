"""``sglpatch upstream``: one patch prepared as an upstream pull request."""

from __future__ import annotations

from pathlib import Path

from sglpatch import exitcodes, upstream_pr, versions
from sglpatch.cli_options import add, say


def register(sub) -> None:
    parser = add(sub, "upstream", run, "prepare one patch as an upstream pull request")
    parser.add_argument("patch", nargs="?", help="the patch: its file name, its stem or its number (0002); "
                        "without it, the series' patches are listed")
    parser.add_argument("--base", help="a pin (default: the newest) or, with --base-repo, a git ref")
    parser.add_argument("--base-repo", type=Path, help="your sglang clone to branch in (default: the pin's tree)")
    parser.add_argument("--out", type=Path, help="where the mbox and PR.md go (default: build/upstream/)")
    parser.add_argument("--range-diff", metavar="vN:vM", help="include the series range-diff vN..vM in the PR body")
    parser.add_argument("--open-pr", action="store_true", help="open the PR with the gh CLI (push the branch first)")
    parser.add_argument("--head", help="with --open-pr: the pushed branch as gh should name it (owner:branch)")
    parser.add_argument("-s", "--signoff", action="store_true", help="add your Signed-off-by (from your git config)")


def run(project, args) -> int:
    if args.patch is None:
        say(args, "sglpatch upstream PATCH: which patch? The series has:")
        for patch in project.series().patches:
            say(args, f"  {patch.name}")
        return exitcodes.USAGE
    changes = ""
    if args.range_diff:
        old, _, new = args.range_diff.partition(":")
        changes = versions.range_diff(project, old.removeprefix("v"), new.removeprefix("v"))
    result = upstream_pr.export(project, args.patch, args.base, args.base_repo, args.out, changes, signoff=args.signoff)
    say(args, f"branch {result.branch} at {result.commit[:12]} in {result.repo}")
    say(args, f"mbox: {result.mbox}")
    say(args, f"PR title: {result.title}")
    say(args, f"PR body: {result.body}")
    if args.open_pr:
        say(args, upstream_pr.open_pull_request(result, args.head))
    else:
        say(args, "Push the branch to your fork and open the pull request with that title and body.")
    return exitcodes.OK
