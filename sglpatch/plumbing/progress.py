"""What long work is doing, as it goes: live bars on a terminal, timestamped lines in a CI log.

Downloads (bytes and rate), environment builds (which package), and apply, witness and matrix
work (pin i of n, which witness, how long) report here; the CLI decides how it is shown:

- on a terminal, a live display from ``rich`` (bars, spinners, rates), drawn on stderr;
- elsewhere (CI logs, pipes), one plain line per step start and end, stamped with UTC time;
- with ``-q``, nothing but errors.

stdout stays the command's own report (or its JSON document), so progress never mixes into it.
Library code calls ``step``, ``note`` and ``transfer``; without a configured display, ``lines``
(non-terminal) behaviour is used, so tests and library callers see plain lines on stderr.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator

_MODES = ("auto", "live", "lines", "quiet")
_state = {"mode": "lines", "progress": None, "stream": None}


def configure(mode: str = "auto", stream=None) -> None:
    """``auto``: live on a terminal, lines otherwise; ``quiet``: nothing."""
    if mode not in _MODES:
        raise ValueError(mode)
    if mode == "auto":
        mode = "live" if getattr(stream or sys.stderr, "isatty", lambda: False)() else "lines"
    # Without a stream given, sys.stderr is looked up at each write: a caller (or pytest) may
    # replace it between runs.
    _state.update(mode=mode, stream=stream, progress=None)


def mode() -> str:
    return _state["mode"]


def _stream():
    return _state["stream"] or sys.stderr


def _stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _line(text: str) -> None:
    # One write per line: print() writes the text and its newline apart, and the lines of worker
    # processes sharing the stream would interleave between the two.
    stream = _stream()
    stream.write(f"{_stamp()} {text}\n")
    stream.flush()


def _live():
    """The shared rich Progress of this process, started on first use."""
    if _state["progress"] is None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            ProgressColumn,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TransferSpeedColumn,
        )
        from rich.text import Text

        class OnlyForTransfers(ProgressColumn):
            """Bytes and rate on downloads; nothing on other steps."""

            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def render(self, task):
                return self.inner.render(task) if task.fields.get("transfer") else Text("")

        console = Console(file=_stream(), force_terminal=True, log_path=False)
        progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            OnlyForTransfers(BarColumn(bar_width=24)),
            OnlyForTransfers(DownloadColumn()),
            OnlyForTransfers(TransferSpeedColumn()),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        progress.start()
        _state["progress"] = progress
    return _state["progress"]


def stop() -> None:
    """End the live display (the CLI calls it before printing its report)."""
    progress = _state.get("progress")
    if progress is not None:
        progress.stop()
        _state["progress"] = None


def note(text: str) -> None:
    """One line worth seeing now (a waiting lock, a fallback taken)."""
    if _state["mode"] == "quiet":
        return
    if _state["mode"] == "live":
        _live().console.log(text)
        return
    _line(text)


class Step:
    """A running step; ``update`` says what it is doing now, ``advance`` counts units of it."""

    def __init__(self, label: str, total: float | None, transfer: bool = False):
        self.label, self.total, self.started, self.task = label, total, time.monotonic(), None
        self.done = 0.0
        self.outcome = "done"  # what the end line says; the step's code may set it
        if _state["mode"] == "live":
            self.task = _live().add_task(label, total=total, transfer=transfer)
        elif _state["mode"] == "lines":
            _line(f"{label} ...")

    def update(self, detail: str) -> None:
        if self.task is not None:
            _live().update(self.task, description=f"{self.label}: {detail}")
        elif _state["mode"] == "lines":
            _line(f"{self.label}: {detail}")

    def advance(self, amount: float = 1) -> None:
        self.done += amount
        if self.task is not None:
            _live().update(self.task, advance=amount)

    def finish(self, outcome: str | None = None) -> None:
        outcome = outcome or self.outcome
        seconds = time.monotonic() - self.started
        if self.task is not None:
            # Running work stays live; finished work scrolls up as a log line.
            _live().remove_task(self.task)
            _live().console.log(f"{self.label}: {outcome} ({seconds:.1f} s)")
        elif _state["mode"] == "lines":
            _line(f"{self.label}: {outcome} ({seconds:.1f} s)")


@contextmanager
def step(label: str, total: float | None = None) -> Iterator[Step]:
    """A step from start to end: ``with progress.step("apply 0.5.14 (2/18)") as s: ...``."""
    current = Step(label, total)
    try:
        yield current
    except BaseException as exc:
        current.finish(f"failed: {type(exc).__name__}")
        raise
    current.finish()


@contextmanager
def transfer(label: str, total_bytes: int | None) -> Iterator[Step]:
    """A download: ``advance(n)`` per chunk; lines mode prints the size and rate at the end."""
    current = Step(label, total_bytes, transfer=True)
    try:
        yield current
    except BaseException as exc:
        current.finish(f"failed: {type(exc).__name__}")
        raise
    seconds = max(time.monotonic() - current.started, 1e-6)
    current.finish(f"{current.done / 1e6:.1f} MB at {current.done / 1e6 / seconds:.1f} MB/s")
