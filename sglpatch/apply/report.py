"""Rendering an apply run for people: a table per pin on the terminal."""

from __future__ import annotations

import re

from sglpatch.apply.apply_pins import ApplyReport
from sglpatch.witnesses.results import REPLAY_MARK


def render_apply(report: ApplyReport, report_path: str = "") -> str:
    lines = [f"series v{report.series_version} ({report.series_digest[:12]})", ""]
    for result in report.results:
        state = "ok" if result.ok else "FAILED"
        lines.append(f"sglang {result.version}: {state}  lock: {result.lock or '-'}  witnessed at: {witness_levels(result)}")
        if getattr(result, "replayed", ""):
            lines.append(f"  {REPLAY_MARK} nothing ran now: {result.replayed}")
        if result.unchecked:
            lines.append(f"  the trees and commits are the lock's; not checked without witnesses: {'; '.join(result.unchecked)}")
        if result.patches:
            width = max(len(outcome.name) for outcome in result.patches)
            for outcome in result.patches:
                commit = outcome.commit[:12] if outcome.commit else "-"
                needed = {True: "needed", False: "not needed", None: "needed ?"}[outcome.needed]
                before, after = replay_mark(outcome, "pristine"), replay_mark(outcome, "patched")
                witness = f"witness {outcome.witness_before or '-'}{before} -> {outcome.witness_after or '-'}{after}"
                if getattr(outcome, "tests_before", ""):
                    witness += f"; tests {outcome.tests_before}{before} -> {outcome.tests_after or '-'}{after}"
                status = outcome.status + (" UNPROVEN" if outcome.unproven else "")
                lines.append(f"  {outcome.name:<{width}}  {status:<19}  {commit:<12}  {needed:<10}  {witness}")
                for detail in outcome.detail.splitlines() if outcome.status != "applied" or outcome.unproven else []:
                    lines.append(f"      {detail}")
            replayed = [where for outcome in result.patches for where in (getattr(outcome, "replayed", None) or {}).values()]
            if replayed and not getattr(result, "replayed", ""):
                lines.append(f"  {REPLAY_MARK} {len(replayed)} witness answer(s) given back, not run now: kept "
                             f"{_when(replayed)} (each in the JSON report's \"replayed\")")
        else:
            lines.append("  (no patches in the series)")
        if result.ok:
            lines.append(f"  tree: {result.tree_path}  (branch sglpatch at {result.commit[:12]})")
        if result.error:
            lines.append(f"  error: {result.error}")
        lines.append("")
    for suggestion in report.suggestions:
        lines.append(
            f"suggest for {suggestion.patch}: Upstream-Status: {suggestion.suggested} "
            f"(now {suggestion.current}; {suggestion.evidence})"
        )
    if report_path:
        lines.append(f"report: {report_path}")
    return "\n".join(lines)


def _when(replayed: list[str]) -> str:
    """When the replayed answers were kept, from their marks ("kept <date> <time> UTC ...")."""
    times = sorted({" ".join(where.split()[1:4]) for where in replayed if where.startswith("kept ")})
    return times[0] if len(times) == 1 else f"{times[0]} to {times[-1]}" if times else "earlier"


def replay_mark(outcome, tree: str) -> str:
    """`` (replayed)`` where an answer shown for ``tree`` ("pristine" or "patched") was replayed."""
    replayed = getattr(outcome, "replayed", None) or {}
    return f" {REPLAY_MARK}" if any(key == "every tree" or key.startswith(f"{tree}:") for key in replayed) else ""


def witness_levels(result) -> str:
    """The level each patch's witness ran at on this pin (``[level]`` of its answers), by patch
    number: how strong the proof behind the line is."""
    levels: dict[str, list[str]] = {}
    for outcome in result.patches:
        names = levels.setdefault(outcome.name.split("-", 1)[0], [])
        for answer in (outcome.witness_before, outcome.witness_after):
            found = re.search(r"\[([^\]]+)\]$", answer or "")
            if found and found.group(1) not in names:
                names.append(found.group(1))
    shown = [f"{number} {' / '.join(names)}" for number, names in levels.items() if names]
    if any(name.startswith("include-graph") for names in levels.values() for name in names):
        shown.append(f"nothing compiled; for hip-compile: {TOOLCHAIN_HINT}")
    return ", ".join(shown) or "no witness ran"


# How a run outside nox gets rocm-guard's compile level (nox's witness sessions install it).
TOOLCHAIN_HINT = "bash ci/install-hip-toolchain.sh (nox -s apply installs it)"


def render_witnesses(report: ApplyReport) -> str:
    """One line per (pin, patch): the witness on the pristine tree and on the patched tree."""
    lines = ["pin           patch                                              pristine -> patched   result"]
    replays = []
    for result in report.results:
        for outcome in result.patches:
            before = (outcome.witness_before or "-") + replay_mark(outcome, "pristine")
            after = (outcome.witness_after or ("= pristine" if outcome.status == "not-needed" else "-")) + replay_mark(outcome, "patched")
            unproven = f"  UNPROVEN: {outcome.unproven}" if outcome.unproven else ""
            lines.append(f"{result.version:<13} {outcome.name[:50]:<50} {before} -> {after}   {outcome.status}{unproven}")
            replays += [f"  {result.version} {outcome.name}: {which}: {where}"
                        for which, where in (getattr(outcome, "replayed", None) or {}).items()]
        if result.error:
            lines.append(f"{result.version:<13} error: {result.error}")
    if replays:
        lines += [f"{REPLAY_MARK}: answers given back from where they were kept, not run now:", *replays]
    return "\n".join(lines)
