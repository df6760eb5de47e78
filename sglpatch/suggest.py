"""Upstream-Status suggestions: when a newer pin already has a patch (it reverse-applies) or its
fix (its witness passes on the pristine tree), the patch's status should say so."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from sglpatch.apply import ALREADY_UPSTREAM, NOT_NEEDED, PinResult
from sglpatch.series import Series

UNSETTLED = ("Pending", "Submitted")


@dataclass(frozen=True)
class Suggestion:
    patch: str
    current: str
    suggested: str
    evidence: str


def status_suggestions(series: Series, results: list[PinResult]) -> list[Suggestion]:
    suggestions = []
    for patch in series.patches:
        current = patch.main.trailer("Upstream-Status") or ""
        if not current.startswith(UNSETTLED):
            continue
        evidence = sorted(
            (Version(result.version), result.version, outcome.reverse_applies)
            for result in results
            for outcome in result.patches
            if outcome.name == patch.name and outcome.status in (ALREADY_UPSTREAM, NOT_NEEDED)
        )
        if not evidence:
            continue
        first = evidence[0][1]
        same = [version for _, version, reverse_applies in evidence if reverse_applies]
        if same:
            suggested = f"Accepted [{same[0]}]"
            why = f"the patch reverse-applies on {', '.join(same)}: upstream has this change"
        else:
            suggested = f"Inappropriate [fixed upstream differently in {first}]"
            why = f"its witness passes on the pristine {', '.join(version for _, version, _ in evidence)}"
        suggestions.append(Suggestion(patch.name, current, suggested, why))
    return suggestions
