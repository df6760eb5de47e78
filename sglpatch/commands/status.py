"""``sglpatch status``: the last apply's Upstream-Status suggestions; ``--write`` records them."""

from __future__ import annotations

from pathlib import Path

from sglpatch import exitcodes
from sglpatch.cli_options import add, say
from sglpatch.upstream import suggest, suggest_write


def register(sub) -> None:
    parser = add(sub, "status", run, "the last apply's Upstream-Status suggestions; --write puts them in the patches")
    parser.add_argument("--report", type=Path, help="the apply report (default: build/apply-report.json)")
    parser.add_argument(
        "--write",
        action="store_true",
        help="write them into every rendition's trailers (Upstream-Status, Fixed-Upstream-In) and re-record the lock",
    )


def run(project, args) -> int:
    report = args.report or project.build_dir / "apply-report.json"
    suggestions = suggest.read_suggestions(report, project.series())
    for s in suggestions:
        say(args, f"{s.patch}: Upstream-Status: {s.current} -> {s.suggested} ({s.evidence})")
        if s.fixed_in:
            say(args, f"    Fixed-Upstream-In: {s.fixed_upstream_in}")
    if not suggestions:
        say(args, f"no Upstream-Status suggestions in {report}")
    elif args.write:
        for path in suggest_write.write_suggestions(project, suggestions):
            say(args, f"written: {path.relative_to(project.root)}")
        say(args, "lock re-recorded; review the change with `git diff` and commit it")
    return exitcodes.OK
