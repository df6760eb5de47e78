"""The download and build cache, kept outside the repository and shared by concurrent runs.

Every entry is written under a unique temporary name and renamed into place only when complete,
and every writer holds a file lock for its entry, so pytest-xdist workers and parallel nox
sessions can share one cache; a reader that finds a half-written or damaged entry rebuilds it.
A run that waits for another's lock says who holds it, and gives up after a stated time.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from sglpatch.plumbing import progress
from sglpatch.plumbing.errors import SglpatchError

CACHE_ENV = "SGLPATCH_CACHE_DIR"
LOCK_TIMEOUT_ENV = "SGLPATCH_LOCK_TIMEOUT"
# Long enough for the slowest thing done under a lock (building the CPU Python on a cold machine);
# a holder still there after it is stuck.
LOCK_TIMEOUT_S = 3600
_FIRST_WAIT_S = 1.0  # wait this long quietly, then say who holds the lock


def cache_root() -> Path:
    """$SGLPATCH_CACHE_DIR, else $XDG_CACHE_HOME/sglpatch, else ~/.cache/sglpatch."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        root = Path(explicit)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = Path(xdg) / "sglpatch"
    root.mkdir(parents=True, exist_ok=True)
    return root


def lock_timeout() -> float:
    value = os.environ.get(LOCK_TIMEOUT_ENV)
    if not value:
        return LOCK_TIMEOUT_S
    try:
        return float(value)
    except ValueError:
        raise SglpatchError(f"{LOCK_TIMEOUT_ENV}={value!r} is not a number of seconds") from None


@contextmanager
def entry_lock(path: Path, timeout: float | None = None, on_wait=None):
    """Hold the lock that guards building ``path`` (it sits beside it, never inside it).

    When another process holds it, ``on_wait`` (default: a line on stderr) is told who, and after
    ``timeout`` seconds (``$SGLPATCH_LOCK_TIMEOUT``, default an hour) the wait ends in an error
    naming the holder. The kernel releases the lock of a process that dies, so no lock is stale."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = Path(str(path) + ".lock")
    owner_path = Path(str(path) + ".lock.owner")
    lock = FileLock(str(lock_path))
    limit = lock_timeout() if timeout is None else timeout
    started = time.monotonic()
    try:
        lock.acquire(timeout=min(_FIRST_WAIT_S, limit))
    except Timeout:
        holder = _holder(owner_path)
        (on_wait or _say_waiting)(f"waiting for {path.name} ({path.parent}): held by {holder}; giving up after {limit:.0f} s")
        try:
            lock.acquire(timeout=max(0.0, limit - (time.monotonic() - started)))
        except Timeout:
            raise SglpatchError(
                f"{lock_path}: still held by {_holder(owner_path)} after {limit:.0f} s; "
                f"stop that run or raise {LOCK_TIMEOUT_ENV}"
            ) from None
    try:
        write_atomically(
            owner_path,
            json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv)[:200],
                        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}),
        )
        yield
    finally:
        owner_path.unlink(missing_ok=True)
        lock.release()


def _holder(owner_path: Path) -> str:
    try:
        owner = json.loads(owner_path.read_text())
        return f"pid {owner['pid']} on {owner['host']} ({owner['command']}) since {owner['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (it has not said which)"


def _say_waiting(message: str) -> None:
    progress.note(message)


def write_atomically(path: Path, text: str | bytes) -> None:
    """Write under a unique temporary name beside ``path`` and rename: readers and parallel
    writers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def staging(final: Path):
    """A temporary folder beside ``final``, renamed onto it only when the block ends without an
    exception (otherwise removed): a half-built entry is never seen under its name."""
    final.parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}-"))
    try:
        yield path
    except BaseException:
        remove(path)
        raise
    os.replace(path, final)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


# -- remembered answers ---------------------------------------------------------------------------

ANSWERS_ENV = "SGLPATCH_ANSWERS_DIR"
# Switches of sglpatch's own that child processes see (``probe_children.PASSED_TO_PROBES``) and that
# change what they answer, but that no answer's key holds: while one is set, no answer is kept and
# none is replayed, so an answer given under it never reaches a run without it.
SWITCHES_OUTSIDE_KEYS = ("SGLPATCH_STANDIN_RECORD",)


def switches_set() -> list[str]:
    """The switches outside the keys that are set now (``SWITCHES_OUTSIDE_KEYS``)."""
    return [name for name in SWITCHES_OUTSIDE_KEYS if os.environ.get(name)]


def answers_root() -> Path:
    """Where remembered answers live: ``$SGLPATCH_ANSWERS_DIR``, else ``answers/`` in the cache.
    Apart from the downloads and environments so that a run can start from no answers while it
    shares what is expensive to build (a test that must compute its answers fresh does)."""
    explicit = os.environ.get(ANSWERS_ENV)
    root = Path(explicit) if explicit else cache_root() / "answers"
    root.mkdir(parents=True, exist_ok=True)
    return root


# The folder of the run in force (``one_run``), once per one_run() entered (the outermost one's).
# In it, a marker per value computed and kept in this run, by this process or by a worker process
# it forked (the CPU tier's workers are one run): under rerun() those are given back, nothing else.
_RUN: list[Path] = []
_RERUN: list[bool] = []
# (kind, key) of the values this process computed and kept.
_MADE_HERE: set[tuple[str, str]] = set()


@contextmanager
def one_run():
    """The processes this one forks within it are one run with it, for ``rerun()``."""
    outermost = not _RUN
    folder = Path(tempfile.mkdtemp(prefix="sglpatch-run-")) if outermost else _RUN[-1]
    _RUN.append(folder)
    try:
        yield
    finally:
        _RUN.pop()
        if outermost:
            shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def rerun():
    """Within it, every remembered answer is computed again: nothing kept by an earlier run is
    given back (what this run computed meanwhile is: ``one_run``); what is computed is still
    kept. The witnesses' answers (``answer_cache``), the matrix's and every ``Memo.remember``
    follow it: a compile pass or a probe run kept by an earlier run would otherwise stand in,
    unmarked, for one said to run now (``matrix run-all --no-cache``)."""
    with one_run():
        _RERUN.append(True)
        try:
            yield
        finally:
            _RERUN.pop()


def rerunning() -> bool:
    """Whether ``rerun()`` is active."""
    return bool(_RERUN)


def _made_in_this_run(kind: str, key: str) -> bool:
    return (kind, key) in _MADE_HERE or (bool(_RUN) and (_RUN[-1] / kind / key).exists())


def _made(kind: str, key: str) -> None:
    _MADE_HERE.add((kind, key))
    if _RUN:
        marker = _RUN[-1] / kind / key
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()


class Memo:
    """One kind of remembered answer: key -> a JSON value, kept in ``answers_root()/<kind>/``.

    The key is the caller's digest of everything the answer read. A value is written atomically
    under the key's lock, so one process computes while the others asking for the same key wait
    and read it; a damaged entry is computed again. ``keep`` decides what is a verdict worth
    keeping: an answer that could not be had (unavailable, a timeout, a killed child) is never
    kept, so the next asker computes it again. Under ``rerun()`` only what this run computed is
    given back."""

    def __init__(self, kind: str):
        self.kind = kind

    def path(self, key: str) -> Path:
        return answers_root() / self.kind / f"{key}.json"

    def get(self, key: str):
        """The value kept under ``key``, or None (never kept, or damaged: then it is removed; or a
        switch outside the keys is set: ``switches_set``)."""
        if switches_set():
            return None
        path = self.path(key)
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            return None

    def put(self, key: str, value) -> None:
        if switches_set():
            return  # answered under a switch no key holds
        write_atomically(self.path(key), json.dumps(value, indent=1, sort_keys=True))

    def lock(self, key: str):
        """The lock that guards computing ``key`` (``entry_lock``), for a caller that holds
        several at once."""
        return entry_lock(self.path(key), on_wait=lambda message: None)

    def remember(self, key: str | None, compute, keep=lambda value: True):
        """``compute()``'s value, kept under ``key`` where ``keep(value)``; given back, not
        computed again, to the next asker of the same key. Without a key it just computes."""
        if key is None:
            return compute()
        with self.lock(key):
            if not _RERUN or _made_in_this_run(self.kind, key):
                value = self.get(key)
                if value is not None:
                    return value
            value = compute()
            if keep(value):
                self.put(key, value)
                _made(self.kind, key)
        return value
