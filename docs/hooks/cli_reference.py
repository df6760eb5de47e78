"""MkDocs hook: the manual's command reference (reference.md), generated at build time from
sglpatch's own argparse definitions (``sglpatch.commands.cli_reference``), so it cannot drift from them.

The repository keeps a short docs/reference.md in its place, saying so, so that a link to the page
works where the manual is read unbuilt (on GitHub, in a clone); the build puts the generated page
in its stead."""

from __future__ import annotations

from mkdocs.structure.files import File

from sglpatch.commands.cli_reference import reference_markdown

PAGE = "reference.md"


def on_files(files, config):
    kept = files.get_file_from_path(PAGE)
    if kept is not None:
        files.remove(kept)
    files.append(File.generated(config, PAGE, content=reference_markdown()))
    return files
