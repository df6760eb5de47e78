"""``sglpatch check``: lint the series, its patches, trailers and renditions; then judge each
patch's regression tests on the release its fix was written for (``--no-witnesses``: lint only)."""

from __future__ import annotations

from sglpatch import exitcodes
from sglpatch.apply.where_written import judge_where_written
from sglpatch.cli_options import add, emit_json, json_flag, say
from sglpatch.rebase.redundant import reproduced_renditions
from sglpatch.series.check import check_series


def register(sub) -> None:
    parser = add(sub, "check", run, "lint the series, patches, trailers and renditions; judge each patch's tests "
                                    "where its fix was written")
    parser.add_argument(
        "--no-witnesses", action="store_true",
        help="lint only: do not run each patch's regression tests and witness on the release its fix was written "
             "for (there they must find the bug, pass once it is fixed and agree with its witness case by case)",
    )
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
    status = exitcodes.FAILED if problems else exitcodes.OK
    if not problems and not args.no_witnesses:
        status = _judge_where_written(project, args, document)
    if args.redundant_renditions and not problems:
        notes = reproduced_renditions(project)
        for note in notes:
            say(args, f"note: {note.message()}")
        say(args, f"{len(notes)} rendition(s) a neighbour reproduces")
        document["redundant_renditions"] = [vars(note) for note in notes]
    emit_json(args, document)
    return status


def _judge_where_written(project, args, document: dict) -> int:
    judged = judge_where_written(project)
    for line in judged.judged:
        say(args, f"tests where written: {line}")
    for line in judged.refused:
        say(args, f"refused: {line}")
    for line in judged.unavailable:
        say(args, f"unavailable: {line}")
    document["where_written"] = vars(judged)
    if judged.refused:
        return exitcodes.FAILED
    return exitcodes.UNAVAILABLE if judged.unavailable else exitcodes.OK
