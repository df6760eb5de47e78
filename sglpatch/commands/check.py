"""``sglpatch check``: lint the series, its patches, trailers and renditions."""

from __future__ import annotations

from sglpatch import exitcodes
from sglpatch.cli_options import add, emit_json, json_flag, say
from sglpatch.rebase.redundant import reproduced_renditions
from sglpatch.series.check import check_series


def register(sub) -> None:
    parser = add(sub, "check", run, "lint the series, patches, trailers and renditions")
    parser.add_argument(
        "--redundant-renditions", action="store_true",
        help="also note each rendition that its neighbour rendition reproduces (the same tree by an exact or three-way "
             "apply on every pin it covers); a note, not a problem. Slower: it needs every pin's pristine tree",
    )
    json_flag(parser)


def run(project, args) -> int:
    problems = check_series(project.patches_dir, project.pins())
    for problem in problems:
        say(args, str(problem))
    say(args, f"{len(problems)} problem(s) in {project.patches_dir}")
    document = {"patches": str(project.patches_dir),
                "problems": [{"path": str(p.path), "line": p.line, "message": p.message} for p in problems]}
    if args.redundant_renditions and not problems:
        notes = reproduced_renditions(project)
        for note in notes:
            say(args, f"note: {note.message()}")
        say(args, f"{len(notes)} rendition(s) a neighbour reproduces")
        document["redundant_renditions"] = [vars(note) for note in notes]
    emit_json(args, document)
    return exitcodes.FAILED if problems else exitcodes.OK
