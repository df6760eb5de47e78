"""What a witness answers, and what a witness is: the vocabulary every witness module and every
caller of one imports.

A ``WitnessResult`` is ``bug`` (the check fails: the bug is there), ``clean`` (the check passes:
the bug is not there) or ``unavailable`` (the check could not run here, with the reason; never
silently a pass), with the level that ran. ``Witness`` and ``ProbeWitness`` are the protocols
the package's overview (``sglpatch.witnesses``) describes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sglpatch.sources.pins import Pin

BUG = "bug"
CLEAN = "clean"
UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class WitnessResult:
    witness: str
    state: str
    level: str = ""
    detail: str = ""
    # Where the witness checks several cases (a witness's scenarios, a regression test's tests):
    # case name -> bug, clean or unavailable, for comparing two witnesses of one patch case by case.
    cases: dict = field(default_factory=dict)
    # Empty when the check ran for this answer; else where the answer was replayed from (a stored
    # answer), which every place that shows the answer says.
    replayed: str = ""

    def summary(self) -> str:
        """The verdict and its level: what the lock records (never the replay mark)."""
        level = f" [{self.level}]" if self.level else ""
        return f"{self.state}{level}"

    def shown(self) -> str:
        """The verdict as every printer shows it: the summary, marked where it was replayed."""
        return self.summary() + (f" {REPLAY_MARK}" if self.replayed else "")


# What every printer of a verdict adds to one that was replayed, not run.
REPLAY_MARK = "(replayed)"


class Witness(Protocol):
    name: str
    version: str  # bump when the check changes, so cached answers are not reused

    def run(self, tree: Path, pin: Pin) -> WitnessResult: ...


class ProbeWitness(Protocol):
    """A witness whose check is a probe in the pin's CPU Python (``sglpatch.witnesses.probe_runs``)."""

    name: str

    def probe_request(self, pin: Pin): ...  # -> probe_runs.ProbeRequest

    def judge_probe(self, answer: dict | None, failure: str | None, pin: Pin) -> WitnessResult: ...


def is_probe_witness(witness: Witness) -> bool:
    return callable(getattr(witness, "probe_request", None)) and callable(getattr(witness, "judge_probe", None))
