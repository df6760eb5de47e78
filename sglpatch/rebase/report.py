"""What ``rebase`` found, patch by patch: every try (the tool, what it changed, the judge's verdict
and findings), as text for the terminal, Markdown for the watch's pull request, and JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sglpatch.apply.outcomes import CLASSIFIED, Outcome


@dataclass
class Attempt:
    """One try of one rendition on the release."""

    rendition: str  # relative to the project
    made_for: str  # the pin whose tree it was made for ("" when no pin has it)
    how: str  # "exact", "three-way" or "reverse"
    result: str  # "applies", "applies-with-offset", "reverse-applies", "does not apply", ...
    witness_after: str = ""
    detail: str = ""
    judge: str = ""  # the judge's verdict on the tree it made ("" when it made none)
    findings: list[str] = field(default_factory=list)


@dataclass
class RebaseOutcome:
    """One patch on the release: its verdict (an ``Outcome``) and how it was reached."""

    name: str
    verdict: str
    detail: str = ""
    rendition: str = ""  # the rendition the release gets (relative to the project), if any
    witness: str = ""
    witness_before: str = ""
    witness_after: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    step: str = ""  # the cascade step that ported it ("exact" for carries-over)
    conflict: tuple = ()  # (rendition, step, tree with zdiff3 markers) of the nearest conflicted merge
    prepared: str = ""  # where the tree left for a person is (build/port/V/)


@dataclass
class RebaseReport:
    """Every patch of the series on one release, and what was (or would be) written."""

    version: str
    artifact: str
    sha256: str = ""
    released: str = ""
    patches_in_series: int = 0
    outcomes: list[RebaseOutcome] = field(default_factory=list)
    written: bool = False
    files: list[str] = field(default_factory=list)  # what was (or would be) written, relative
    relocked: list[str] = field(default_factory=list)  # the pins whose lock entries were re-recorded
    error: str = ""
    tree: str = ""  # the release's tree with every accepted port (the lock's tree when complete)
    prepared: str = ""  # build/port/<version>/, the tree left for a person (relative), if any
    cells: list[str] = field(default_factory=list)  # "<cell> <outcome>" of the release's CPU cells on the staged series
    # The cells among them whose answer was replayed (kept from an earlier run on the same trees and
    # checking code), not computed by this run.
    cells_replayed: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every patch of the series classified (an empty or partial trial is not complete)."""
        return (
            not self.error
            and len(self.outcomes) == self.patches_in_series
            and all(outcome.verdict in CLASSIFIED for outcome in self.outcomes)
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "complete": self.complete}

    def text(self) -> str:
        lines = [f"sglang {self.version} ({self.artifact}, sha256 {self.sha256[:16]}..., uploaded {self.released})"]
        for outcome in self.outcomes:
            via = f" via {outcome.rendition}" if outcome.rendition else ""
            lines.append(f"  {outcome.name}: {outcome.verdict}{via}")
            lines.append(
                f"      witness {outcome.witness or '-'}: pristine {outcome.witness_before or '-'}"
                f" -> ported {outcome.witness_after or '-'}"
            )
            for attempt in outcome.attempts:
                after = f"; witness after: {attempt.witness_after}" if attempt.witness_after else ""
                base = f" from {attempt.made_for}" if attempt.made_for else ""
                lines.append(f"      tried {attempt.rendition} {attempt.how}{base}: {attempt.result}{after}")
                lines.extend(f"          {line}" for line in attempt.detail.splitlines()[:12])
                if attempt.judge:
                    lines.append(f"          judge: {attempt.judge}")
                    lines.extend(f"            {finding}" for finding in attempt.findings[:6])
            lines.extend(f"      {line}" for line in outcome.detail.splitlines())
        if self.prepared:
            lines.append(f"  left for a person: {self.prepared} (the nearest candidate of {self._left()}, zdiff3 markers where it"
                         f" conflicted); edit it, then: sglpatch patch refresh {self.version}")
        if self.cells:
            lines.append(f"  CPU matrix cells on the staged series: {', '.join(self.shown_cells())}")
            if self.cells_replayed:
                lines.append(f"      {len(self.cells_replayed)} of {len(self.cells)} replayed: answers an earlier run gave"
                             " for the same trees and checking code, not computed now")
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)

    def shown_cells(self) -> list[str]:
        """The cells as shown: a replayed one says so."""
        replayed = set(self.cells_replayed)
        return [cell + (" (replayed)" if cell.split(" ", 1)[0] in replayed else "") for cell in self.cells]

    def _left(self) -> str:
        return ", ".join(o.name for o in self.outcomes if o.prepared)

    def markdown(self) -> str:
        state = "every patch classified" if self.complete else "NOT every patch classified"
        lines = [
            f"### sglang {self.version}: {state}",
            "",
            f"Artifact `{self.artifact}` (sha256 `{self.sha256}`), uploaded {self.released}.",
            "",
            "| patch | verdict | rendition | witness | pristine | ported |",
            "|---|---|---|---|---|---|",
        ]
        for o in self.outcomes:
            lines.append(
                f"| `{o.name}` | {o.verdict} | {('`' + o.rendition + '`') if o.rendition else '-'} | "
                f"{o.witness or '-'} | {o.witness_before or '-'} | {o.witness_after or '-'} |"
            )
        for o in self.outcomes:
            lines += ["", f"**{o.name}**: {o.verdict}"]
            for a in o.attempts:
                after = f"; witness after: {a.witness_after}" if a.witness_after else ""
                base = f" from {a.made_for}" if a.made_for else ""
                judged = f"; judge: {a.judge}" if a.judge else ""
                lines.append(f"- tried `{a.rendition}` {a.how}{base}: {a.result}{after}{judged}")
                lines.extend(f"  - {finding}" for finding in a.findings[:6])
            if o.detail:
                lines += ["", "```", o.detail, "```"]
        if self.files:
            lines += ["", "Files: " + ", ".join(f"`{name}`" for name in self.files)]
        if self.relocked:
            lines += ["", "Lock entries re-recorded (applied with witnesses): " + ", ".join(self.relocked)]
        hand = [o for o in self.outcomes if o.verdict == Outcome.NEEDS_HAND_PORT]
        if hand:
            lines += ["", "**Needs a hand port:** " + ", ".join(f"`{o.name}`" for o in hand)]
            for o in hand:
                if o.prepared:
                    lines.append(f"- `{o.name}`: the nearest candidate ({o.conflict[1]} of `{o.conflict[0]}`) is applied in"
                                 f" `{o.prepared}` (zdiff3 conflict markers where it conflicted); edit it there, then"
                                 f" `sglpatch patch refresh {self.version}`")
        made = [o for o in self.outcomes if o.verdict == Outcome.NEW_RENDITION]
        if made:
            lines += ["", "**Made by a merge tool, review before merging:** "
                      + ", ".join(f"`{o.rendition}` ({o.step or 'merged'})" for o in made)]
        if self.error:
            lines += ["", f"Error: {self.error}"]
        return "\n".join(lines) + "\n"
