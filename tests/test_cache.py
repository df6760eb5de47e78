"""The shared cache: atomic writes under unique names, and locks that say who holds them."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from sglpatch.plumbing import cache
from sglpatch.plumbing.errors import SglpatchError

HOLD = """
import sys, time
sys.argv = ["sglpatch", "apply", "0.5.14"]
from pathlib import Path
from sglpatch.plumbing import cache
with cache.entry_lock(Path({path!r})):
    print("held", flush=True)
    time.sleep({seconds})
"""


def _hold(path, seconds):
    process = subprocess.Popen([sys.executable, "-c", HOLD.format(path=str(path), seconds=seconds)],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_waiting_lock_says_who_holds_it_and_gives_up_after_the_stated_time(tmp_path):
    entry = tmp_path / "entry"
    holder = _hold(entry, 30)
    said = []
    started = time.monotonic()
    try:
        with pytest.raises(SglpatchError) as error:
            with cache.entry_lock(entry, timeout=2, on_wait=said.append):
                pytest.fail("got a lock another process holds")
    finally:
        holder.kill()
        holder.wait()
    assert time.monotonic() - started < 10
    assert said and f"pid {holder.pid}" in said[0] and "sglpatch apply 0.5.14" in said[0] and "2 s" in said[0]
    assert f"still held by pid {holder.pid}" in str(error.value) and "SGLPATCH_LOCK_TIMEOUT" in str(error.value)


def test_a_lock_whose_holder_died_is_free_at_once(tmp_path):
    entry = tmp_path / "entry"
    holder = _hold(entry, 30)
    holder.kill()
    holder.wait()
    said = []
    with cache.entry_lock(entry, timeout=2, on_wait=said.append):
        pass
    assert said == []


def test_the_lock_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("SGLPATCH_LOCK_TIMEOUT", "12.5")
    assert cache.lock_timeout() == 12.5
    monkeypatch.setenv("SGLPATCH_LOCK_TIMEOUT", "soon")
    with pytest.raises(SglpatchError, match="SGLPATCH_LOCK_TIMEOUT='soon' is not a number"):
        cache.lock_timeout()


def test_concurrent_writers_never_leave_half_a_file_or_a_shared_temporary(tmp_path):
    target = tmp_path / "answer.json"
    texts = [str(n) * 200_000 for n in range(8)]
    seen = set()

    def write(text):
        for _ in range(5):
            cache.write_atomically(target, text)
            seen.add(target.read_text())

    threads = [threading.Thread(target=write, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen <= set(texts) and target.read_text() in texts
    assert [p.name for p in tmp_path.iterdir()] == ["answer.json"]
