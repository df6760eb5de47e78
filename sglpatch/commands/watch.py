"""``sglpatch watch``: the series rebased onto every release newer than the newest pin."""

from __future__ import annotations

from pathlib import Path

from sglpatch import exitcodes
from sglpatch.cli_options import add, say


def register(sub) -> None:
    parser = add(sub, "watch", run, "rebase the series onto every release on the index newer than the newest pin")
    parser.add_argument("--dry-run", action="store_true", help="classify only; write nothing")
    parser.add_argument("--out", type=Path, help="where report.md and report.json go (default: build/watch/)")
    parser.add_argument("--open-pr", action="store_true",
                        help="when every patch is classified: commit on a branch, push, open a PR with gh; "
                             "where one needs a hand port: open an issue with gh")
    parser.add_argument("--base", default="main", help="with --open-pr: the branch the PR goes to (default: main)")
    parser.add_argument("--remote", default="origin", help="with --open-pr: the remote to push the branch to (default: origin)")


def run(project, args) -> int:
    from sglpatch.upstream import watch

    result = watch.watch(project, write=not args.dry_run, out_dir=args.out)
    say(args, result.text())
    if args.open_pr and result.written:
        say(args, watch.open_pull_request(project, result, base=args.base, remote=args.remote))
    if args.open_pr and watch.hand_ports(result):
        say(args, watch.open_hand_port_issue(project, result))
    return exitcodes.OK if result.complete else exitcodes.FAILED
