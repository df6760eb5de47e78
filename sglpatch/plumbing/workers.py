"""Sharing pins out among worker processes, each keeping to one CPU environment while it can.

A worker that moves to a pin of another CPU Python starts that environment's fork server
(torch and transformers imported, about 8 s); one that stays imports nothing new. So each worker
takes the next pin of the group it is working on; when its group is done it starts the biggest
group nobody has begun, and only when none is left does it take the last pin of the group with
the most left (its owner goes on from the front). Pins are handed out one at a time as workers
free up, so a slow pin never holds back pins waiting behind it.

``share_out`` is what ``apply --jobs`` and the CPU tier's ``--jobs`` run on.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import traceback
from collections.abc import Callable, Hashable
from multiprocessing.connection import wait
from typing import Any, TypeVar

Item = TypeVar("Item")

MAX_DEFAULT_JOBS = 4  # each worker keeps up to three CPU Pythons with torch imported
INTERRUPT_GRACE_S = 2  # for a worker a terminal's Ctrl-C reached to stop by itself


def default_jobs() -> int:
    """Workers when the user names none: the machine's cores, at most ``MAX_DEFAULT_JOBS``."""
    return max(1, min(MAX_DEFAULT_JOBS, os.cpu_count() or 1))


def next_item(pending: dict[Hashable, list], last: Hashable | None, busy: dict[Hashable, int]) -> tuple[Hashable, Any]:
    """(group, item) for a worker whose last item was of group ``last``; ``busy`` counts the
    workers on each group now. The chosen item is taken out of ``pending``."""
    if pending.get(last):
        return last, pending[last].pop(0)
    untouched = [group for group, items in pending.items() if items and not busy.get(group)]
    if untouched:
        group = max(untouched, key=lambda g: len(pending[g]))  # the first of the biggest, in order
        return group, pending[group].pop(0)
    group = max((g for g, items in pending.items() if items), key=lambda g: len(pending[g]))
    return group, pending[group].pop()


def share_out(
    items: list[Item],
    group_of: Callable[[Item], Hashable],
    work: Callable[[Item], Any],
    jobs: int,
    *,
    initializer: Callable[..., None] | None = None,
    initargs: tuple = (),
    on_done: Callable[[Item, Any], None] | None = None,
    on_start: Callable[[Item], None] | None = None,
) -> list[Any]:
    """``work(item)`` for every item in ``jobs`` worker processes, results in the items' order.
    ``on_start(item)`` and ``on_done(item, result)`` are called in this process as each is handed
    out and as each finishes. An exception in a worker stops the others and is raised here."""
    pending: dict[Hashable, list[int]] = {}
    for index, item in enumerate(items):
        pending.setdefault(group_of(item), []).append(index)
    context = multiprocessing.get_context()
    workers = []
    for _ in range(min(jobs, len(items))):
        mine, theirs = context.Pipe()
        process = context.Process(target=_serve, args=(theirs, items, work, initializer, initargs))
        process.start()
        theirs.close()
        workers.append({"process": process, "pipe": mine, "group": None, "item": None})
    results: dict[int, Any] = {}
    busy: dict[Hashable, int] = {}

    def hand_out(worker: dict) -> None:
        if not any(pending.values()):
            worker["pipe"].send(None)
            worker["item"] = None
            return
        group, index = next_item(pending, worker["group"], busy)
        busy[group] = busy.get(group, 0) + 1
        worker["group"], worker["item"] = group, index
        if on_start is not None:
            on_start(items[index])
        worker["pipe"].send(index)

    interrupted = False
    try:
        for worker in workers:
            hand_out(worker)
        while len(results) < len(items):
            waiting = {worker["pipe"]: worker for worker in workers if worker["item"] is not None}
            for pipe in wait(list(waiting)):
                worker = waiting[pipe]
                try:
                    ok, value = pipe.recv()
                except EOFError:
                    raise RuntimeError(f"a worker died (exit {worker['process'].exitcode}) "
                                       f"while on {items[worker['item']]!r}") from None
                if not ok:
                    raise value
                index = worker["item"]
                busy[worker["group"]] -= 1
                results[index] = value
                if on_done is not None:
                    on_done(items[index], value)
                hand_out(worker)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        for worker in workers:
            if worker["item"] is not None and worker["process"].is_alive():
                if interrupted:
                    # Stopped as Ctrl-C stops this process, so its cleanups run and its whole steps
                    # finish (a kill would leave them halfway): a terminal's Ctrl-C reached it too,
                    # and it stops by itself; one sent to this process alone is passed on.
                    worker["process"].join(timeout=INTERRUPT_GRACE_S)
                    if worker["process"].is_alive():
                        os.kill(worker["process"].pid, signal.SIGINT)
                else:
                    worker["process"].terminate()
            else:
                try:
                    worker["pipe"].send(None)
                except OSError:
                    pass
        for worker in workers:
            worker["process"].join(timeout=60)
            if worker["process"].is_alive():
                worker["process"].kill()
                worker["process"].join()
            worker["pipe"].close()
    return [results[index] for index in range(len(items))]


def _serve(pipe, items, work, initializer, initargs) -> None:
    if initializer is not None:
        initializer(*initargs)
    while True:
        try:
            index = pipe.recv()
        except EOFError:
            return
        if index is None:
            return
        try:
            pipe.send((True, work(items[index])))
        except BaseException as exc:  # noqa: BLE001 - the parent raises it
            try:
                pipe.send((False, exc))
            except Exception:  # noqa: BLE001 - an exception that does not pickle
                pipe.send((False, RuntimeError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")))
            if isinstance(exc, KeyboardInterrupt):
                return
