"""A pull request's body in the sections of sglang's ``.github/pull_request_template.md``
(Motivation, Modifications, Accuracy Tests, Speed Tests and Profiling, Checklist), with a section
of its own for the related upstream work, from the patch's own message: its ``Problem:`` and
``Cause:`` paragraphs are the motivation, ``Fix:`` the modifications, ``Related:`` the upstream
pull requests and issues it builds on or overlaps (``#NNNNN``, as sglang's readers link them),
``Testing:`` what was measured where, ``Bench:`` how the speed figures a reviewer will ask for are
produced. The message's words are kept as written (never re-cased). Under the regression test's
command is what that command printed, trimmed and said so; the in-process run on the emulated
box, which the export's judgement rests on, is a line of its own that says so. A result that was
not run again for this body (a stored one) is marked. Words that only mean something in this
project are not used; a body that still holds one is refused.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.upstream.upstream_plain_run import PlainRun
from sglpatch.witnesses.results import BUG, CLEAN, WitnessResult

LABELS = ("Problem", "Cause", "Fix", "Testing", "Related", "Bench")
RELATED = "Related"
OUTPUT_WIDTH = 100
OUTPUT_LINES = 12
PLAIN_LINES = 8  # what a command printed: its last lines (a traceback's end, unittest's summary)
NOT_ON_MI355X = "Not measured on MI355X."
CODE = "\0code\0"
# Our words for things upstream has other words for (checked on the whole body, case-insensitive).
INTERNAL_WORDS = ("witness", "stand-in", "standin", "rendition", "series.lock", r"\bpins?\b", r"\block\b", "sglpatch",
                  r"\bnox\b")
# How a check's own output says them, in words a reviewer reads.
_PLAIN = ((r"stand-ins?", "test double"), (r"witness(es)?", "check"), (r"\bpins\b", "releases"), (r"\bpin\b", "release"))
# sglang's own pull requests and issues, written as its readers link them: #NNNNN.
_UPSTREAM_LINK_RE = re.compile(r"https?://github\.com/sgl-project/sglang/(?:pull|issues)/(\d+)(?:/[\w/]*)?(?:#[\w-]+)?"
                               r"|\bsgl-project/sglang#(\d+)")
_WHEN_RE = re.compile(r"\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2})?(?:Z| UTC)?)?")


@dataclass(frozen=True)
class TestRun:
    """The regression test: its command, what that command printed without the change and with
    it (``plain_*``, one per test file; empty where none ran), and the in-process run the export
    judged by (``before``/``after``: the test on the emulated box, or the change's own check)."""

    command: str
    before: WitnessResult | None
    after: WitnessResult | None
    scope: str = ""  # a sentence when the run covers more than this pull request
    plain_before: tuple[PlainRun, ...] = ()
    plain_after: tuple[PlainRun, ...] = ()


@dataclass(frozen=True)
class HooksSaid:
    """What the pre-commit hooks were, for the body: ``said`` (which ran, on what) and whether
    every hook that applies to the PR's files ran (only then is the checklist's box ticked)."""

    said: str
    complete: bool


def paragraphs(text: str) -> dict[str, list[str]]:
    """The message's paragraphs by label ("" for unlabelled ones), labels stripped, lines joined,
    every word as written."""
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
        found.setdefault(label, []).append(block)
    return found


def require_related(patch: str, text: str) -> None:
    """A pull request names the upstream work it builds on or overlaps: refuse a message without."""
    if not paragraphs(text).get(RELATED):
        raise SglpatchError(f"{patch}: its message has no '{RELATED}:' paragraph (the upstream pull requests and issues "
                            "the change builds on or overlaps, and what differs); add one after 'Testing:'")


def upstream_links(text: str) -> str:
    """sglang's pull requests and issues as ``#NNNNN``, the way its readers link them."""
    return _UPSTREAM_LINK_RE.sub(lambda m: f"#{m[1] or m[2]}", text)


MATRIX_TITLE = "The same check on released sglang versions (without / with the change):"


def render_body(text: str, *, files: list[str], tests: list[str], run: TestRun | None, matrix: list[str],
                hooks: HooksSaid | None, notes: list[str] = (), matrix_title: str = MATRIX_TITLE) -> str:
    """The body for the description ``text`` (Problem/Cause/Fix/Testing/Related/Bench
    paragraphs); the ``matrix`` rows (one per release) under ``matrix_title``."""
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
    if parts.get(RELATED):
        out += ["## Related upstream work", ""]
        for paragraph in parts[RELATED]:
            out += [_wrap(upstream_links(paragraph)), ""]
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
    ticked = hooks is not None and hooks.complete
    said = hooks.said if hooks is not None else "not run"
    hooks_item = textwrap.wrap(f"- [{'x' if ticked else ' '}] Format your code according to pre-commit ({said}).",
                               OUTPUT_WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    out += ["## Checklist", "",
            *hooks_item,
            f"- [{'x' if tests else ' '}] Add unit tests (`test/registered/unit/`).",
            "- [ ] Update documentation as needed (no user-facing option changes).",
            "- [ ] Provide throughput / latency benchmark results and accuracy evaluation results (not measured on MI355X).",
            ""]
    body = "\n".join(out).rstrip() + "\n"
    # What a command printed is shown as printed: only the words around it are held to upstream's.
    printed = [] if run is None else ["\n".join(_block(r)) for r in (*run.plain_before, *run.plain_after)]
    checked = body
    for block in printed:
        checked = checked.replace(block, "```\n```")
    refuse_internal_words(checked)
    return body


def _test_run(run: TestRun) -> list[str]:
    out = ["Regression test:", "", "```bash", run.command, "```", ""]
    if run.scope:
        out += [_wrap(run.scope), ""]
    for before, after in zip(run.plain_before, run.plain_after):
        out += _plain_runs(before, after, several=len(run.plain_before) > 1)
    if run.plain_before:
        out += _in_process(run)
        return out
    for label, result in (("Without the change", run.before), ("With the change", run.after)):
        if result is None:
            continue
        verdict = {BUG: "fails", CLEAN: "passes"}.get(result.state, "could not run")
        out += [f"{label} it {verdict}{replay_note(result.replayed)}:", "", "```", *short_output(result.detail), "```", ""]
    return out


def _plain_runs(before: PlainRun, after: PlainRun, several: bool) -> list[str]:
    """What the command printed without and with the change: once where both said the same."""
    where = (f"Run as shown from the repository root on a CPU-only machine ({before.interpreter}; `python/` on "
             "`PYTHONPATH` in place of `pip install -e python`)") + (f", `{before.command}`" if several else "")
    if before.output == after.output and before.returncode == after.returncode:
        return [_wrap(f"{where}, it printed the same without and with the change{_trim_note(before)}"
                      f"{replay_note(before.replayed or after.replayed)}:"), "", *_block(before), ""]
    return [_wrap(f"{where}, without the change it printed{_trim_note(before)}{replay_note(before.replayed)}:"), "",
            *_block(before), "", _wrap(f"With the change it printed{_trim_note(after)}{replay_note(after.replayed)}:"),
            "", *_block(after), ""]


PLAIN_WIDTH = 2 * OUTPUT_WIDTH  # a longer printed line is cut, and the body says so


def _shown(run: PlainRun) -> tuple[list[str], str]:
    """The lines of what a command printed that the body shows, and how they were picked: all of
    a short output; of a long one that ran tests and failed, unittest's line for each failed test
    and its assertion, then the last lines (its summary); else its last lines."""
    tail, total = run.last_lines(PLAIN_LINES)
    if len(tail) == total:
        return tail, f"all {total} lines" if total != 1 else "its one line"
    failures = run.failures()
    if run.ran_tests and failures:
        shown = failures[:2 * PLAIN_LINES]
        tests = sum(1 for line in failures if not line.startswith("AssertionError"))
        named = sum(1 for line in shown if not line.startswith("AssertionError"))
        which = ("each failed test's line and its assertion" if named == tests
                 else f"the first {named} of {tests} failed tests' lines and their assertions")
        summary = tail[-TAIL_AFTER_FAILURES:]
        return shown + summary, f"excerpt of its {total} lines: {which}, then the last {len(summary)}"
    return tail, f"trimmed: the last {len(tail)} of its {total} lines"


TAIL_AFTER_FAILURES = 3  # "Ran N tests in ...", a blank line, "FAILED (...)"


def _trim_note(run: PlainRun) -> str:
    shown, said = _shown(run)
    if any(len(line) > PLAIN_WIDTH for line in shown):
        said += f"; long lines cut at {PLAIN_WIDTH} characters"
    return f" ({said})"


def _block(run: PlainRun) -> list[str]:
    shown, _ = _shown(run)
    return ["```", *(line if len(line) <= PLAIN_WIDTH else line[:PLAIN_WIDTH - 4] + " ..." for line in shown), "```"]


def _in_process(run: TestRun) -> list[str]:
    """The run the export judged by, labelled as what it is and what it rests on."""
    if run.before is None and run.after is None:
        return []
    detail = " ".join(r.detail for r in (run.before, run.after) if r is not None)
    match = _DOUBLES_RE.search(detail)
    rests = _rests_on(match) if match else "on CPU"
    if all(r.ran_tests for r in (*run.plain_before, *run.plain_after)):
        label = f"The verdicts here rest on the same tests run in-process, {rests}:"
    else:
        label = (f"The command stopped before running the tests here, so the verdicts rest on the same test file run "
                 f"in-process, {rests}:")
    lines = []
    for name, result in (("without the change", run.before), ("with the change", run.after)):
        if result is None:
            continue
        verdict = {BUG: "fails", CLEAN: "passes"}.get(result.state, "could not run")
        said = _plain_words(_DOUBLES_RE.sub("", result.detail).strip())
        wrapped = textwrap.wrap(f"{name}{replay_note(result.replayed)}: {verdict}: {said}", OUTPUT_WIDTH,
                                break_long_words=True, break_on_hyphens=False, subsequent_indent="    ")
        if len(wrapped) > OUTPUT_LINES // 2:
            wrapped = wrapped[:OUTPUT_LINES // 2 - 1] + [f"    ... (trimmed: {len(wrapped) - OUTPUT_LINES // 2 + 1} more lines)"]
        lines += wrapped
    return [_wrap(label), "", "```", *lines, "```", ""]


def replay_note(replayed: str) -> str:
    """How a body says a result was not run again for it: a stored one (and when, where known)."""
    if not replayed:
        return ""
    when = _WHEN_RE.search(replayed)
    return f" (replayed: a stored result{' of ' + when.group(0) if when else ''}, not run again)"


# How a CPU run says what it rested on: "[doubles: emulated gfx950 node; stand-ins a, b; called: none]".
_DOUBLES_RE = re.compile(r" ?\[doubles: emulated (?P<gpu>[^;\]]+?) node; stand-ins (?P<doubles>[^;\]]+); called: (?P<called>[^\]]+)\]")


def _rests_on(match: re.Match) -> str:
    gpu = "" if match["gpu"] == "?" else f" with {match['gpu']} emulated"
    called = "none of them called" if match["called"] == "none" else f"called: {match['called']}"
    doubles = "" if match["doubles"] == "none" else f" and test doubles for {match['doubles']} ({called})"
    return f"on CPU{gpu}{doubles}"


def _plain_words(text: str) -> str:
    for pattern, plain in _PLAIN:
        text = re.sub(pattern, plain, text, flags=re.I)
    return text


def short_output(detail: str) -> list[str]:
    """A check's output in at most ``OUTPUT_LINES`` lines of ``OUTPUT_WIDTH`` characters."""
    text = _plain_words(_DOUBLES_RE.sub(lambda m: f"\n({_rests_on(m)})", detail))
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
