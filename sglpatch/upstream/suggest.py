"""Upstream-Status suggestions: when a newer pin already has a patch (it reverse-applies) or its
fix (its witness passes on the pristine tree), the patch's status should say so.

"Fixed upstream differently" is said only where the witness found the bug on an older release of
the same run and passes on a newer one that is not the release the fix was written for (there, a
witness that passes is refused, not read as a fix upstream: ``witnesses.agreement``).

``apply`` reports them; ``sglpatch status --write`` writes them into every rendition of the patch
(``Upstream-Status`` and ``Fixed-Upstream-In`` with the evidence; ``sglpatch.upstream.suggest_write``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from sglpatch.apply.one_pin import PinResult
from sglpatch.apply.outcomes import Outcome
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.series.patches import Series, message_trailers, set_trailers
from sglpatch.witnesses.upstream_test import release_written_for

UNSETTLED = ("Pending", "Submitted")


@dataclass(frozen=True)
class Suggestion:
    patch: str
    current: str
    suggested: str
    evidence: str
    fixed_in: str = ""  # the first pin where upstream has the change or the fix
    fixed_evidence: str = ""  # the Fixed-Upstream-In trailer's value

    @property
    def fixed_upstream_in(self) -> str:
        return f"{self.fixed_in} ({self.fixed_evidence})" if self.fixed_in else ""


def status_suggestions(series: Series, results: list[PinResult], pins: tuple = ()) -> list[Suggestion]:
    """The suggestions the run's ``results`` support; ``pins``: every pin (where the fix was
    written for is the newest its rendition covers)."""
    suggestions = []
    for patch in series.patches:
        current = patch.main.trailer("Upstream-Status") or ""
        if not current.startswith(UNSETTLED):
            continue
        outcomes = sorted(
            ((Version(result.version), result.version, outcome) for result in results for outcome in result.patches if outcome.name == patch.name),
            key=lambda item: item[0],
        )
        evidence = [(version, outcome) for _, version, outcome in outcomes
                    if outcome.reverse_applies or (outcome.status == Outcome.NOT_NEEDED
                                                   and _fixed_after_needed(patch, version, outcomes, pins))]
        if not evidence:
            continue
        first, first_outcome = evidence[0]
        same = [version for version, outcome in evidence if outcome.reverse_applies]
        witnessed = [version for version, outcome in evidence if outcome.status == Outcome.NOT_NEEDED]
        needed_before = [version for parsed, version, outcome in outcomes if outcome.needed and parsed < Version(first)]
        witness = (patch.main.trailer("Witness") or "").split(" ")[0]
        if same:
            suggested = f"Accepted [{same[0]}]"
            why = f"the patch reverse-applies on {', '.join(same)}: upstream has this change"
        else:
            suggested = f"Inappropriate [fixed upstream differently in {first}]"
            why = f"its witness passes on the pristine {', '.join(witnessed)}"
        parts = [
            "the patch reverse-applies" if first_outcome.reverse_applies else "upstream fixed it its own way",
        ]
        if first_outcome.status == Outcome.NOT_NEEDED and witness:
            parts.append(f"{witness} passes on the pristine {first}")
        if needed_before:
            parts.append(f"fails on {needed_before[-1]}" if witness else f"needed on {needed_before[-1]}")
        suggestions.append(Suggestion(patch.name, current, suggested, why, first, ", ".join(parts)))
    return suggestions


def _fixed_after_needed(patch, version: str, outcomes: list, pins: tuple) -> bool:
    """Whether a witness passing on ``version`` can say upstream fixed the bug: the witness found it
    on an older release of the run, and ``version`` is not the release the fix was written for."""
    rendition = patch.for_version(version)
    if rendition is not None and pins and release_written_for(rendition, pins) == version:
        return False
    return any(outcome.needed and parsed < Version(version) for parsed, _, outcome in outcomes)


def read_suggestions(report_path: Path, series: Series) -> list[Suggestion]:
    """The suggestions of an apply report, refused when the report is of another series."""
    try:
        data = json.loads(report_path.read_text())
    except FileNotFoundError:
        raise SglpatchError(f"{report_path}: no apply report; run `sglpatch apply` first") from None
    except ValueError as exc:
        raise SglpatchError(f"{report_path}: not a JSON apply report: {exc}") from None
    digest = (data.get("series") or {}).get("digest") if isinstance(data, dict) else None
    if digest != series.digest():
        raise SglpatchError(
            f"{report_path}: the report is of another state of the series (digest {str(digest)[:12]}, now "
            f"{series.digest()[:12]}); run `sglpatch apply` again first"
        )
    fields = Suggestion.__dataclass_fields__
    return [Suggestion(**{k: v for k, v in item.items() if k in fields}) for item in data.get("status_suggestions", [])]


def with_trailers(text: str, status: str, fixed_upstream_in: str) -> str:
    """A format-patch file's text with its Upstream-Status replaced and Fixed-Upstream-In set
    (replaced, or added before Applies-To, the last trailer), inside the commit message only."""
    if re.search(r"^---$", text, re.MULTILINE) is None:
        raise SglpatchError("not a format-patch file: no '---' line after the commit message")
    present = dict(message_trailers(text))
    if "Upstream-Status" not in present:
        raise SglpatchError("no Upstream-Status trailer to replace")
    text = set_trailers(text, {"Upstream-Status": status})
    if fixed_upstream_in and "Fixed-Upstream-In" in present:
        text = set_trailers(text, {"Fixed-Upstream-In": fixed_upstream_in})
    elif fixed_upstream_in:
        if "Applies-To" not in present:
            raise SglpatchError("no Applies-To trailer to put Fixed-Upstream-In before")
        text = set_trailers(text, {"Fixed-Upstream-In": fixed_upstream_in, "Applies-To": present["Applies-To"]}, where="end")
    return text
