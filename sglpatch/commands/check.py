"""``sglpatch check``: lint the series, its patches, trailers and renditions."""

from __future__ import annotations

from sglpatch import exitcodes
from sglpatch.check import check_series
from sglpatch.cli_options import add, emit_json, json_flag, say


def register(sub) -> None:
    json_flag(add(sub, "check", run, "lint the series, patches, trailers and renditions"))


def run(project, args) -> int:
    problems = check_series(project.patches_dir, project.pins())
    for problem in problems:
        say(args, str(problem))
    say(args, f"{len(problems)} problem(s) in {project.patches_dir}")
    emit_json(args, {"patches": str(project.patches_dir),
                     "problems": [{"path": str(p.path), "line": p.line, "message": p.message} for p in problems]})
    return exitcodes.FAILED if problems else exitcodes.OK
