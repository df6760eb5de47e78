"""A pull request's body in the sections of sglang's ``.github/pull_request_template.md``
(Motivation, Modifications, Accuracy Tests, Speed Tests and Profiling, Checklist), from the
patch's own message: its ``Problem:`` and ``Cause:`` paragraphs are the motivation, ``Fix:`` the
modifications, ``Testing:`` what was measured where, ``Bench:`` how the speed figures a reviewer
will ask for are produced. The regression test's command and its output before and after the
change are shown short, in code blocks. Words that only mean something in this project are not
used; a body that still holds one is refused.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.witnesses.results import BUG, CLEAN, WitnessResult

LABELS = ("Problem", "Cause", "Fix", "Testing", "Bench")
OUTPUT_WIDTH = 100
OUTPUT_LINES = 12
NOT_ON_MI355X = "Not measured on MI355X."
CODE = "\0code\0"
# Our words for things upstream has other words for (checked on the whole body, case-insensitive).
INTERNAL_WORDS = ("witness", "stand-in", "standin", "rendition", "series.lock", r"\bpins?\b", r"\block\b", "sglpatch",
                  r"\bnox\b")
# How a check's own output says them, in words a reviewer reads.
_PLAIN = ((r"stand-ins?", "test double"), (r"witness(es)?", "check"), (r"\bpins\b", "releases"), (r"\bpin\b", "release"))


@dataclass(frozen=True)
class TestRun:
    """The regression test and what it said without the change and with it."""

    command: str
    before: WitnessResult | None
    after: WitnessResult | None
    scope: str = ""  # a sentence when the run covers more than this pull request


def paragraphs(text: str) -> dict[str, list[str]]:
    """The message's paragraphs by label ("" for unlabelled ones), labels stripped, lines joined."""
    found: dict[str, list[str]] = {}
    label = ""
    for raw in re.split(r"\n\s*\n", text.strip()):
        lines = raw.splitlines()
        if lines and all(line.startswith("    ") for line in lines):
            # An indented block is a command: it stays as written, with the paragraph before it.
            found.setdefault(label, []).append(CODE + "\n".join(line[4:] for line in lines))
            continue
        block = " ".join(line.strip() for line in lines).strip()
        if not block:
            continue
        label = next((name for name in LABELS if block.startswith(f"{name}:")), "")
        if label:
            block = block[len(label) + 1:].strip()
            block = block[:1].upper() + block[1:]
        found.setdefault(label, []).append(block)
    return found


MATRIX_TITLE = "The same check on released sglang versions (without / with the change):"


def render_body(text: str, *, files: list[str], tests: list[str], run: TestRun | None, matrix: list[str],
                hooks_clean: bool, notes: list[str] = (), matrix_title: str = MATRIX_TITLE) -> str:
    """The body for the description ``text`` (Problem/Cause/Fix/Testing/Bench paragraphs); the
    ``matrix`` rows (one per release) under ``matrix_title``."""
    parts = paragraphs(text)
    out = ["## Motivation", ""]
    for paragraph in parts.get("Problem", []) + parts.get("", []) + parts.get("Cause", []):
        out += [_wrap(paragraph), ""]
    out += ["## Modifications", ""]
    for paragraph in parts.get("Fix", []):
        out += [_wrap(paragraph), ""]
    out += ["Files:", ""] + [f"- `{path}`" for path in files]
    if tests:
        out += [f"- `{path}` (new regression test)" for path in tests]
    out += [""]
    out += ["## Accuracy Tests", ""]
    for paragraph in parts.get("Testing", []):
        out += [_wrap(paragraph), ""]
    if run is not None:
        out += _test_run(run)
    if matrix:
        rows = [re.sub(r"\bclean\b", "passes", re.sub(r"\bbug\b", "fails", row)) for row in matrix]
        out += [_wrap(matrix_title), "",
                "| sglang | without | with |", "|---|---|---|", *rows, ""]
    if not any(NOT_ON_MI355X.rstrip(".") in p for p in parts.get("Testing", [])):
        out += [_wrap(f"{NOT_ON_MI355X} Every result above ran on CPU, with the ROCm device emulated where it says gfx950."), ""]
    out += ["## Speed Tests and Profiling", ""]
    bench = parts.get("Bench", [])
    if bench:
        out += [NOT_ON_MI355X + " The figures a reviewer needs come from this bench:", ""]
        for paragraph in bench:
            out += [_wrap(paragraph), ""]
    else:
        out += [_wrap(f"{NOT_ON_MI355X} This change does not alter a kernel; no speed figures are claimed."), ""]
    out += list(notes)
    out += ["## Checklist", "",
            f"- [{'x' if hooks_clean else ' '}] Format your code according to pre-commit (isort, black, codespell,"
            " clang-format at the pinned versions, on the lines this PR changes).",
            f"- [{'x' if tests else ' '}] Add unit tests (`test/registered/unit/`).",
            "- [ ] Update documentation as needed (no user-facing option changes).",
            "- [ ] Provide throughput / latency benchmark results and accuracy evaluation results (not measured on MI355X).",
            ""]
    body = "\n".join(out).rstrip() + "\n"
    refuse_internal_words(body)
    return body


def _test_run(run: TestRun) -> list[str]:
    out = ["Regression test:", "", "```bash", run.command, "```", ""]
    if run.scope:
        out += [_wrap(run.scope), ""]
    for label, result in (("Without the change", run.before), ("With the change", run.after)):
        if result is None:
            continue
        verdict = {BUG: "fails", CLEAN: "passes"}.get(result.state, "could not run")
        out += [f"{label} it {verdict}:", "", "```", *short_output(result.detail), "```", ""]
    return out


# How a CPU run says what it rested on: "[doubles: emulated gfx950 node; stand-ins a, b; called: none]".
_DOUBLES_RE = re.compile(r" ?\[doubles: emulated (?P<gpu>[^;\]]+?) node; stand-ins (?P<doubles>[^;\]]+); called: (?P<called>[^\]]+)\]")


def _doubles(match: re.Match) -> str:
    gpu = "" if match["gpu"] == "?" else f" with {match['gpu']} emulated"
    called = "none of them called" if match["called"] == "none" else f"called: {match['called']}"
    doubles = "" if match["doubles"] == "none" else f" and test doubles for {match['doubles']} ({called})"
    return f"\n(on CPU{gpu}{doubles})"


def short_output(detail: str) -> list[str]:
    """A check's output in at most ``OUTPUT_LINES`` lines of ``OUTPUT_WIDTH`` characters."""
    text = _DOUBLES_RE.sub(_doubles, detail)
    for pattern, plain in _PLAIN:
        text = re.sub(pattern, plain, text, flags=re.I)
    lines = []
    for raw in text.splitlines() or [""]:
        pieces = re.split(r"(?<=;) |(?<=\]) (?=\[)", raw)
        for piece in pieces:
            lines += textwrap.wrap(piece, OUTPUT_WIDTH, break_long_words=True, break_on_hyphens=False) or [""]
    if len(lines) > OUTPUT_LINES:
        lines = lines[:OUTPUT_LINES - 1] + [f"... ({len(lines) - OUTPUT_LINES + 1} more lines)"]
    return lines


def refuse_internal_words(body: str) -> None:
    for word in INTERNAL_WORDS:
        match = re.search(word, body, re.I)
        if match:
            line = body[: match.start()].count("\n") + 1
            raise SglpatchError(f"PR body line {line}: {match.group(0)!r} is this project's word, not upstream's; reword the patch message")


def _wrap(paragraph: str) -> str:
    if paragraph.startswith(CODE):
        return "```bash\n" + paragraph[len(CODE):] + "\n```"
    return "\n".join(textwrap.wrap(paragraph, 100, break_long_words=False, break_on_hyphens=False))
