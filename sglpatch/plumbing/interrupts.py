"""Ctrl-C: what a command had changed when it stopped, and the steps it must not stop halfway.

The CLI's handler answers an interrupt with one line: "interrupted: nothing was changed", or what
``changed`` recorded in this process before it stopped. A step that must finish once it has begun
(a branch and its work tree moved together, a lock entry and the tree it records) runs inside
``whole``: an interrupt or a termination that comes meanwhile waits until the step is done and is
then delivered; the git it runs holds them off too, so a Ctrl-C at the terminal, which reaches
every process of the command, cannot stop git halfway through either.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_HELD = (signal.SIGINT, signal.SIGTERM)
_changed: list[str] = []
_unknown: list[str] = []


def changed(what: str) -> None:
    """Note a change that is done, for the line an interrupt prints."""
    _changed.append(what)


def may_have_changed(what: str) -> None:
    """Note work another process was doing when it stopped, which this one cannot see: ``what``
    says what it can have changed, and how (its steps being whole)."""
    _unknown.append(what)


def said() -> str:
    """What an interrupted command changed, in words."""
    parts = [f"changed before it stopped: {'; '.join(_changed)}"] if _changed else []
    parts += [f"stopped in a worker process: {'; '.join(_unknown)}"] if _unknown else []
    return "; ".join(parts) + "; nothing else was changed" if parts else "nothing was changed"


def forget() -> None:
    """A new command in this process (the CLI called twice, as tests do): nothing changed yet."""
    _changed.clear()
    _unknown.clear()


@contextmanager
def whole(what: str) -> Iterator[None]:
    """Run the block to its end even if SIGINT or SIGTERM comes; ``what`` is noted as changed when
    it is done, and a signal that came meanwhile is delivered then.

    Blocked, the signals are also held off the children the block starts (git inherits the mask),
    and the Python handlers catch one the kernel gives another thread of ours. Outside the main
    thread (where no handler can be set) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        changed(what)  # an error in the block is said by itself; no interrupt stops this thread
        return
    pending: list[int] = []
    previous = {number: signal.signal(number, lambda number, frame: pending.append(number)) for number in _HELD}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    except BaseException:
        changed(f"{what}: begun and not finished (check it)")
        raise
    else:
        changed(what)
    finally:
        # The handlers first: a signal the mask held arrives when it is lifted, to the usual handler.
        for number, handler in previous.items():
            signal.signal(number, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for number in dict.fromkeys(pending):
            signal.raise_signal(number)  # as it would have come: KeyboardInterrupt, or the end of the process
