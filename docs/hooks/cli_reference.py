"""MkDocs hook: the manual's command reference (reference.md), generated at build time from
sglpatch's own argparse definitions (``sglpatch.commands.cli_reference``), so it cannot drift from them."""

from __future__ import annotations

from mkdocs.structure.files import File

from sglpatch.commands.cli_reference import reference_markdown

PAGE = "reference.md"


def on_files(files, config):
    files.append(File.generated(config, PAGE, content=reference_markdown()))
    return files
