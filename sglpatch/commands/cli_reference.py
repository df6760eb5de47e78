"""The command reference of the manual, written from sglpatch's own argparse definitions when the
manual is built (``docs/hooks/cli_reference.py``), so it says exactly what ``--help`` says."""

from __future__ import annotations

import argparse
import functools

from sglpatch import cli

WIDTH = 100  # the help text's line width, fixed so the page is the same on every terminal

INTRO = """\
# Command reference

Generated from the command line's own definitions each time the manual is built, so it is
exactly what `sglpatch COMMAND --help` prints. `nox -l` lists the nox sessions, thin doors onto
the same commands (`nox -s apply -- ARGS` is `sglpatch apply ARGS`).

{json_verbs} take `--json` and then print one JSON document on stdout, their text going to stderr.
A patch is named by its file name, its stem or its number (`0002`). `sglpatch` alone lists the
commands; a mistyped one is told the nearest.
"""


def reference_markdown() -> str:
    """The whole page: sglpatch's own options and exit statuses, then every command and action."""
    top = cli.parser()
    json_verbs = [f"`{name}`" for name, parser in _every_command(top, "") if "--json" in parser._option_string_actions]
    parts = [INTRO.format(json_verbs=", ".join(json_verbs[:-1]) + " and " + json_verbs[-1]), "## sglpatch", "", _fenced(top)]
    for name, parser in _subcommands(top):
        parts += _section(f"sglpatch {name}", parser, level=2)
    return "\n".join(parts)


def _every_command(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    found = []
    for name, sub in _subcommands(parser):
        found += [(f"{path}{name}", sub), *_every_command(sub, f"{path}{name} ")]
    return found


def _section(title: str, parser: argparse.ArgumentParser, level: int) -> list[str]:
    lines = ["#" * level + f" {title}", "", _fenced(parser)]
    for name, action in _subcommands(parser):
        lines += _section(f"{title} {name}", action, level + 1)
    return lines


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _fenced(parser: argparse.ArgumentParser) -> str:
    return f"```text\n{_help(parser).rstrip()}\n```\n"


def _help(parser: argparse.ArgumentParser) -> str:
    kind = parser.formatter_class
    parser.formatter_class = functools.partial(kind, width=WIDTH)
    try:
        return parser.format_help()
    finally:
        parser.formatter_class = kind
