"""Sharing pins out among worker processes (``sglpatch.plumbing.workers``): each worker keeps to one CPU
environment while it can, and every item is done once, in order of the results."""

from __future__ import annotations

import functools
import os
import time

from pathlib import Path

import pytest

from sglpatch.plumbing import workers


def test_a_worker_keeps_to_its_group_then_starts_the_biggest_untouched_one():
    pending = {"a": [0, 1], "b": [2], "c": [3, 4, 5]}
    busy = {"a": 1}
    assert workers.next_item(pending, "a", busy) == ("a", 0)  # its own group, from the front
    assert workers.next_item(pending, None, busy) == ("c", 3)  # the biggest nobody has begun
    busy["c"] = 1
    assert workers.next_item(pending, "b", busy) == ("b", 2)


def test_with_every_group_begun_a_free_worker_takes_the_last_pin_of_the_longest():
    pending = {"a": [0], "b": [1, 2, 3], "done": []}
    busy = {"a": 1, "b": 1}
    assert workers.next_item(pending, "done", busy) == ("b", 3)  # its owner goes on with 1, 2
    assert pending == {"a": [0], "b": [1, 2], "done": []}


def _pid_and_square(item):
    return os.getpid(), item * item


def test_every_item_is_done_once_and_the_results_come_in_the_items_order():
    seen = []
    items = list(range(7))
    results = workers.share_out(items, lambda item: item % 2, _pid_and_square, 2, on_done=lambda i, r: seen.append(i))
    assert [square for _, square in results] == [i * i for i in items]
    assert sorted(seen) == items
    assert len({pid for pid, _ in results} - {os.getpid()}) == 2  # in two workers, not here


def _fails_on_three(item):
    if item == 3:
        raise ValueError(f"item {item} is bad")
    return item


def test_an_exception_in_a_worker_is_raised_here_and_the_workers_end():
    with pytest.raises(ValueError, match="item 3 is bad"):
        workers.share_out(list(range(6)), lambda item: 0, _fails_on_three, 2)


def _pid(item):
    return os.getpid()


def _pid_once_1_is_done(marker, item):
    # Item 3 holds its worker until item 1 has run: a worker that ends its own group while the
    # other still runs its first item may rightly take that group's next, so without this hold
    # a slow-starting process on a loaded machine would make the order a race.
    if item == 1:
        Path(marker).write_text("1")
    if item == 3:
        deadline = time.monotonic() + 60
        while not Path(marker).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    return os.getpid()


def test_pins_of_one_environment_stay_with_one_worker_while_there_are_others_to_begin(tmp_path):
    groups = {0: "x", 1: "x", 2: "y", 3: "y"}
    work = functools.partial(_pid_once_1_is_done, str(tmp_path / "item-1-done"))
    pids = workers.share_out([0, 1, 2, 3], groups.get, work, 2)
    # Each worker begins a group of its own and goes on with it; the last pin of y may be taken
    # by whichever worker is free first, once x is done.
    assert pids[0] != pids[2] and pids[0] == pids[1]
