"""``sglpatch status --write``: the Upstream-Status suggestions (``sglpatch.upstream.suggest``) written into
every rendition of their patches, the series staged with them, the lock of every pin re-recorded
from a staged apply, and the files moved in for review in git (``sglpatch.apply.staged``).
"""

from __future__ import annotations

from pathlib import Path

from sglpatch.apply.staged import write_staged
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.upstream.suggest import Suggestion, with_trailers


def write_suggestions(project, suggestions: list[Suggestion]) -> list[Path]:
    """Write ``suggestions`` into every rendition of their patches; the lock of every pin is
    re-recorded from a staged apply with witnesses, and nothing is written unless it succeeds.
    Returns the files changed."""
    series = project.series()
    changes: dict[Path, bytes] = {}
    for suggestion in suggestions:
        for rendition in series.get(suggestion.patch).renditions:
            try:
                text = with_trailers(rendition.raw.decode(), suggestion.suggested, suggestion.fixed_upstream_in)
            except SglpatchError as exc:
                raise SglpatchError(f"{rendition.path}: {exc}") from None
            if text.encode() != rendition.raw:
                changes[rendition.path] = text.encode()
    if not changes:
        return []
    write_staged(project, changes, [pin.version for pin in project.pins().pins])
    return sorted(changes)
