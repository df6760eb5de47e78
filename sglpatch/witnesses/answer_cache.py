"""Witnesses' answers, cached: ``run_cached`` and ``run_cached_many`` run a witness only when no
answer is kept for the tree under what the answer depends on (``fingerprint``), and keep what
it answered; the package's overview (``sglpatch.witnesses``) says what is reused when.

A kept answer records the tree it ran on (its git tree hash) and when; it is given back only for
that tree, and marked as a replay (``WitnessResult.replayed``: when and where it was kept) unless
this process answered it itself. ``rerun()`` runs every witness again, whatever is kept.
Witnesses run on the tree as ``materialize`` made it: a witness (or a patch's regression test)
that changes it makes every answer of that run ``unavailable`` (``probes/tree_state.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from sglpatch.plumbing import cache
from sglpatch.plumbing.errors import Unavailable
from sglpatch.sources.pins import Pin
from sglpatch.witnesses import probing
from sglpatch.witnesses.probes.tree_state import changed_files, file_states
from sglpatch.witnesses.results import UNAVAILABLE, Witness, WitnessResult, is_probe_witness

CACHE_LAYOUT = "4"  # bump when the entry's format or key changes (4: the tree it ran on, when it was kept)


# -- what an answer depends on --------------------------------------------------------------


def fingerprint(witness: Witness, pin: Pin) -> str:
    """The witness's own ``fingerprint(pin)``; for a witness without one, a digest of the file
    that defines its class and its ``version`` (a change to either re-runs it)."""
    own = getattr(witness, "fingerprint", None)
    if callable(own):
        return str(own(pin))
    digest = hashlib.sha256(f"{witness.name}\0{getattr(witness, 'version', '')}\0".encode())
    try:
        digest.update(Path(inspect.getfile(type(witness))).read_bytes())
    except (OSError, TypeError):
        digest.update(type(witness).__qualname__.encode())
    return digest.hexdigest()


def _level_rank(witness: Witness, level: str) -> int | None:
    levels = getattr(witness, "levels", None)
    if not levels:
        return None
    for rank, name in enumerate(levels):
        if level == name or level.startswith(name + " "):
            return rank
    return None


def _weaker_than_available(witness: Witness, level: str, pin: Pin) -> bool:
    available = getattr(witness, "available_level", None)
    if not callable(available):
        return False
    now = available(pin)
    if now is None:
        return False
    cached_rank, now_rank = _level_rank(witness, level), _level_rank(witness, now)
    if now_rank is None:
        return False
    return cached_rank is None or cached_rank > now_rank


ANSWERS = cache.Memo("witness")


def _entry(witness: Witness, tree_hash: str, pin: Pin, print_: str) -> Path:
    """Where the answer for this tree under this fingerprint is kept. The pin's version is not
    part of the key: what the pin decides beyond its tree (its CPU environment, its tvm-ffi) is in
    the fingerprint, so a release relabelled, or a rebase's trial of a tree already witnessed,
    reuses the answer the same tree and environment gave."""
    return ANSWERS.path(_key(witness, tree_hash, print_))


def _key(witness: Witness, tree_hash: str, print_: str) -> str:
    key = hashlib.sha256(f"{CACHE_LAYOUT}\0{witness.name}\0{print_}\0{tree_hash}".encode()).hexdigest()
    return f"{witness.name}/{tree_hash}-{key[:16]}"


# Keys this process answered itself: read back, they are no replay. With ``rerun()`` active, only
# these are taken from the store.
_ANSWERED_HERE: set[str] = set()
_REPLAYS_SEEN: list[list[str]] = []
# Within rerun(), every witness runs again (``cache.rerun``: the remembered compiles and probe
# runs under the witnesses too); the matrix's kept answers follow it as well.
rerun = cache.rerun
rerunning = cache.rerunning


@contextlib.contextmanager
def replays_seen():
    """A list that collects, within it, where each replayed answer came from."""
    seen: list[str] = []
    _REPLAYS_SEEN.append(seen)
    try:
        yield seen
    finally:
        _REPLAYS_SEEN.remove(seen)


def note_replay(where: str) -> None:
    """Say to every ``replays_seen`` that an answer was given back from ``where`` (another kept
    answer than a witness's, such as the matrix's probe runs)."""
    for seen in _REPLAYS_SEEN:
        seen.append(where)


def _load(key: str, witness: Witness, pin: Pin, tree_hash: str) -> WitnessResult | None:
    here = key in _ANSWERED_HERE
    if rerunning() and not here:
        return None
    stored = ANSWERS.get(key)
    try:
        result = WitnessResult(**stored["result"])
        ran_on = stored["tree"]
    except (TypeError, KeyError):
        return None  # never kept, or damaged: run again and overwrite
    if ran_on != tree_hash or result.state == UNAVAILABLE or _weaker_than_available(witness, result.level, pin):
        return None
    if here:
        return result
    where = f"kept {stored.get('stored', '?')} for tree {ran_on[:12]} (answer cache {ANSWERS.kind}/{key})"
    note_replay(f"{witness.name}: {where}")
    return dataclasses.replace(result, replayed=where)


def _store(key: str, result: WitnessResult, print_: str, tree_hash: str) -> None:
    if result.state == UNAVAILABLE:
        return  # the next run may be able to check
    kept = dataclasses.replace(result, replayed="")
    ANSWERS.put(key, {"result": asdict(kept), "level": result.level, "fingerprint": print_, "tree": tree_hash,
                      "stored": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())})
    _ANSWERED_HERE.add(key)


# -- running ------------------------------------------------------------------------------------


def run_cached(witness: Witness, tree_hash: str, pin: Pin, materialize: Callable[[], Path]) -> WitnessResult:
    """The witness's answer for the tree with git hash ``tree_hash``; runs it only when not cached.

    ``materialize`` is called to get the tree on disk only when the witness must really run."""
    return run_cached_many([witness], tree_hash, pin, materialize)[witness.name]


def run_cached_many(
    witnesses: list[Witness], tree_hash: str, pin: Pin, materialize: Callable[[], Path]
) -> dict[str, WitnessResult]:
    """Every witness's answer for one tree, by name, in the order given; cached ones are reused,
    the CPU-probe witnesses among the rest run together in one child process (one sglang
    import), the others beside it, each in a thread of its own. ``materialize`` is called at most once."""
    results: dict[str, WitnessResult] = {}
    asked = []
    for witness in {witness.name: witness for witness in witnesses}.values():  # each asked once
        print_ = fingerprint(witness, pin)
        asked.append((witness, _key(witness, tree_hash, print_), print_))
    pending = _take_cached(asked, pin, results, tree_hash)
    if pending:
        # One run per answer: a second process asking for the same entries waits for the first
        # (locks taken in one order, so two never wait on each other) and reads what it wrote.
        with contextlib.ExitStack() as held:
            for _, key, _ in sorted(pending, key=lambda item: item[1]):
                held.enter_context(ANSWERS.lock(key))
            still = _take_cached(pending, pin, results, tree_hash)  # what another process answered meanwhile
            if still:
                tree = materialize()
                before = file_states(tree)
                probe_witnesses = [w for w, _, _ in still if is_probe_witness(w)]
                others = [w for w, _, _ in still if not is_probe_witness(w)]
                # The others (compilers) run beside the probe child: each is a process of its own.
                with ThreadPoolExecutor(max_workers=max(1, len(others))) as pool:
                    running = {w.name: pool.submit(_run_one, w, tree, pin) for w in others}
                    fresh = probing.run_probe_witnesses(probe_witnesses, tree, pin) if probe_witnesses else {}
                    fresh.update({name: future.result() for name, future in running.items()})
                changed = changed_files(tree, before)
                for witness, key, print_ in still:
                    result = fresh[witness.name]
                    if changed:
                        result = _tree_changed(result, changed)
                    # What the answer read is known once it ran (the CPU environment it was
                    # built for, the installed versions): kept under that key.
                    after = fingerprint(witness, pin)
                    _store(_key(witness, tree_hash, after), result, after, tree_hash)
                    results[witness.name] = result
    return {witness.name: results[witness.name] for witness in witnesses}


def _tree_changed(result: WitnessResult, changed: list[str]) -> WitnessResult:
    """No answer of a run in which the tree changed counts: it judged another tree than the one
    asked about. (A regression test that writes to the tree says so in its own answer too.) An
    answer that could not tell already stays as it is."""
    if result.state == UNAVAILABLE:
        return result
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    return WitnessResult(result.witness, UNAVAILABLE, result.level,
                         f"the tree changed while its witnesses ran on it ({shown}): no answer of that run counts; "
                         f"this one said {result.state}: {result.detail}"[:1500])


def _take_cached(asked: list[tuple[Witness, str, str]], pin: Pin, results: dict[str, WitnessResult],
                 tree_hash: str) -> list:
    """Put the cached answers among ``asked`` into ``results``; the rest, still to run."""
    missing = []
    for witness, key, print_ in asked:
        cached = _load(key, witness, pin, tree_hash)
        if cached is not None:
            results[witness.name] = cached
        else:
            missing.append((witness, key, print_))
    return missing


def _run_one(witness: Witness, tree: Path, pin: Pin) -> WitnessResult:
    """``witness.run``, with a refusal of the environment turned into its answer."""
    try:
        return witness.run(tree, pin)
    except Unavailable as exc:
        return WitnessResult(witness.name, UNAVAILABLE, detail=str(exc)[:1000])
