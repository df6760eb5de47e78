"""``sglpatch upstream``: one patch prepared as upstream pull requests (one per ``PR-Split`` part)."""

from __future__ import annotations

from pathlib import Path

from sglpatch import exitcodes
from sglpatch.cli_options import add, say
from sglpatch.series import versions
from sglpatch.upstream import upstream_commit, upstream_pr


def register(sub) -> None:
    parser = add(sub, "upstream", run, "prepare one patch as upstream pull requests")
    parser.add_argument("patch", nargs="?", help="the patch: its file name, its stem or its number (0002); "
                        "without it, the series' patches are listed")
    parser.add_argument("part", nargs="?", help="of a patch with PR-Split trailers, the one part to prepare (default: every part)")
    parser.add_argument("--base-repo", type=Path, help="your sglang clone: the branch is made there, on --base")
    parser.add_argument("--base", help="with --base-repo, the ref to build on (e.g. main); without it, a pin (default: the newest)")
    parser.add_argument("--out", type=Path, help="where the mbox and PR.md go (default: build/upstream/)")
    parser.add_argument("--range-diff", metavar="vN:vM", help="include the series range-diff vN..vM in the PR body")
    parser.add_argument("--open-pr", action="store_true", help="open the PR with the gh CLI (push the branch first)")
    parser.add_argument("--head", help="with --open-pr: the pushed branch as gh should name it (owner:branch)")
    parser.add_argument("--gh-repo", default=upstream_commit.UPSTREAM_REPO, help="with --open-pr: the repository (default: %(default)s)")
    parser.add_argument("--gh-base", help="with --open-pr: the branch to merge into (default: --base with --base-repo, else main)")
    parser.add_argument("-s", "--signoff", action="store_true", help="add your Signed-off-by (from your git config)")


def run(project, args) -> int:
    if args.patch is None:
        say(args, "The series' patches (sglpatch upstream PATCH prepares one):")
        for patch in project.series().patches:
            say(args, f"  {patch.name}")
        return exitcodes.OK
    changes = ""
    if args.range_diff:
        old, _, new = args.range_diff.partition(":")
        changes = versions.range_diff(project, old.removeprefix("v"), new.removeprefix("v"))
    try:
        results = upstream_pr.export(project, args.patch, args.base, args.base_repo, args.out, changes,
                                     signoff=args.signoff, part=args.part)
    except upstream_pr.NothingToSend as exc:
        say(args, str(exc))
        return exitcodes.OK
    for result in results:
        name = f" ({result.part})" if result.part else ""
        say(args, f"pull request{name}: {result.title}")
        say(args, f"  branch {result.branch} at {result.commit[:12]} in {result.repo}, on {result.base_commit[:12]}")
        say(args, f"  mbox: {result.mbox}")
        say(args, f"  body: {result.body}")
        say(args, f"  tests added: {', '.join(result.tests) or 'none'}; pre-commit hooks: {result.hooks}")
        for note in result.notes:
            say(args, f"  note: {note}")
    if args.base_repo is None:
        say(args, "The branch sits on the release's files, which have no upstream history: apply the mbox to your "
                  "sglang clone (git -C ~/sglang am MBOX on main), or rerun with --base-repo ~/sglang --base main.")
    if args.open_pr and args.head and len(results) > 1:
        say(args, "--head names one pushed branch, but this patch leaves as several pull requests: open one part at a time")
        return exitcodes.FAILED
    if args.open_pr:
        gh_base = args.gh_base or (args.base if args.base_repo is not None and args.base else upstream_commit.UPSTREAM_BASE)
        for result in results:
            say(args, upstream_commit.open_pull_request(result, args.head, repo=args.gh_repo, base=gh_base))
    else:
        say(args, "Push each branch to your fork and open its pull request with that title and body.")
    return exitcodes.OK
