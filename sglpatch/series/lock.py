"""``series.lock``: per pin, the pristine commit, each patch's result and commit, the final commit
and tree. Everyone who applies the same series to the same pins must get exactly these hashes.

A patch is locked only on the pins its ``Applies-To`` covers: where no rendition of it claims a
pin (``not-applicable``) it has no entry there. That outcome is decided by the series' text alone
(the trailers in git), before anything is applied, and it adds no commit, so an entry for it would
lock nothing a run could fail to reproduce; without it, a fix of one release (``Applies-To:
==0.5.23``) touches that release's entry and no other. A pin's entry still proves all it did: its
pristine commit, every patch that claims the pin (applied, not needed, already upstream), each
patch's commit and the final commit and tree; a patch that comes to claim a pin, or stops
claiming it, changes the entry and is a mismatch until ``--update-lock`` accepts it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sglpatch.apply.outcomes import Outcome
from sglpatch.plumbing import interrupts
from sglpatch.plumbing.cache import entry_lock, write_atomically
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.project import LOCK_FILE  # the layout names the file; kept here for its readers

LOCK_FORMAT = 1


@dataclass(frozen=True)
class LockCheck:
    state: str  # "matches", "recorded" (new entry), "updated", or "mismatch"
    difference: str = ""


def read_lock(path: Path) -> dict:
    if not path.exists():
        return {"format": LOCK_FORMAT, "pins": {}}
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise SglpatchError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != LOCK_FORMAT or not isinstance(data.get("pins"), dict):
        raise SglpatchError(f"{path}: not a format-{LOCK_FORMAT} sglpatch lock file (an object with format and pins)")
    bad = [key for key, entry in data["pins"].items() if not isinstance(entry, dict)]
    if bad:
        raise SglpatchError(f"{path}: the entry for {bad[0]} is not an object")
    # Entries are compared patch by patch (``result_of``, ``describe_difference``).
    bad = [key for key, entry in data["pins"].items()
           if not isinstance(entry.get("patches", []), list)
           or not all(isinstance(patch, dict) and isinstance(patch.get("name"), str) for patch in entry.get("patches", []))]
    if bad:
        raise SglpatchError(f"{path}: the entry for {bad[0]} has patches that are not a list of objects with a name")
    return data


WITNESS_RECORD = "witness"  # a patch's record of how its outcome was proved (levels included)
TESTS_RECORD = "tests"  # the same for its regression tests (upstream-test), where they ran beside it
PROOF_RECORDS = (WITNESS_RECORD, TESTS_RECORD)


def locked_form(entry: dict | None) -> dict | None:
    """``entry`` as the lock keeps it: the patches that claim the pin, without those no rendition
    claims (see the module's docstring)."""
    if entry is None:
        return None
    return {**entry, "patches": [patch for patch in entry.get("patches", []) if patch.get("status") != Outcome.NOT_APPLICABLE]}


def result_of(entry: dict | None) -> dict | None:
    """The entry without its witness records: what everyone must reproduce. The level a witness
    could run at depends on the machine (a toolchain installed or not), the result does not."""
    entry = locked_form(entry)
    if entry is None:
        return None
    patches = [{k: v for k, v in patch.items() if k not in PROOF_RECORDS} for patch in entry.get("patches", [])]
    return {**entry, "patches": patches}


def check_entry(path: Path, key: str, entry: dict, update: bool) -> LockCheck:
    """Compare ``entry`` with the lock; record it when new or when ``update`` accepts a change
    (with ``update`` the witness records are written too, even where the result matches)."""
    entry = locked_form(entry)
    with entry_lock(path):
        data = read_lock(path)
        old = data["pins"].get(key)
        if old == entry or (result_of(old) == result_of(entry) and not update):
            return LockCheck("matches")
        if old is not None and not update:
            return LockCheck("mismatch", describe_difference(old, entry))
        state = "recorded" if old is None else "matches" if result_of(old) == result_of(entry) else "updated"
        data["pins"][key] = entry
        data["pins"] = dict(sorted(data["pins"].items()))
        write_atomically(path, json.dumps(data, indent=2, sort_keys=False) + "\n")
        interrupts.changed(f"{path.name}: the entry for {key}")
        return LockCheck(state)


def compare_entry(path: Path, key: str, entry: dict) -> LockCheck:
    """``entry`` against the lock, writing nothing: "matches", "not in the lock" or "mismatch"."""
    old = read_lock(path)["pins"].get(key)
    if result_of(old) == result_of(entry):
        return LockCheck("matches")
    if old is None:
        return LockCheck("not in the lock")
    return LockCheck("mismatch", describe_difference(old, entry))


DECIDED_BY_TEXT = ("artifact_sha256", "pristine", "commit", "tree")


def unchecked_verdicts(path: Path, key: str, entry: dict) -> list[str] | None:
    """For a result classified by text alone (``apply --no-witnesses``): where it decided what
    the lock records -- the artifact, the pristine commit, every patch's commit, the final commit
    and tree -- the lock's verdicts that only a witness gives and that it therefore did not check,
    one line per patch whose status differs (``[]`` where none does); ``None`` where the lock has
    no entry or the result differs from it in what text decides."""
    old, entry = locked_form(read_lock(path)["pins"].get(key)), locked_form(entry)
    if old is None or any(old.get(field) != entry.get(field) for field in DECIDED_BY_TEXT):
        return None
    locked = [(p.get("name"), p.get("commit", "")) for p in old.get("patches", [])]
    if locked != [(p.get("name"), p.get("commit", "")) for p in entry.get("patches", [])]:
        return None
    return [f"{p['name']} {str(o.get('status'))} (text alone: {str(p.get('status'))})"
            for o, p in zip(old.get("patches", []), entry.get("patches", [])) if o.get("status") != p.get("status")]


def describe_difference(old: dict, new: dict) -> str:
    """What differs between a lock entry and a result, in words: each field with both values, each
    patch with its locked outcome and this run's."""
    lines = []
    for field in DECIDED_BY_TEXT:
        if old.get(field) != new.get(field):
            lines.append(f"{field}: locked {old.get(field) or 'none'}, got {new.get(field) or 'none'}")
    old, new = result_of(old), result_of(new)
    old_patches = {p["name"]: p for p in old.get("patches", [])}
    for patch in new.get("patches", []):
        locked = old_patches.pop(patch["name"], None)
        if locked != patch:
            was = f"the lock has it {_outcome(locked)}" if locked else "the lock has no entry for it on this pin"
            lines.append(f"patch {patch['name']}: {was}, this run {_outcome(patch)}")
    lines.extend(f"patch {name}: the lock has it {_outcome(patch)}, this run {Outcome.NOT_APPLICABLE} "
                 "(no rendition claims the pin, or it left the series)" for name, patch in old_patches.items())
    return "; ".join(lines)


def _outcome(patch: dict) -> str:
    """A patch's outcome in words: its status, and its commit where it has one."""
    commit = str(patch.get("commit") or "")
    return str(patch.get("status")) + (f" (commit {commit[:12]})" if commit else "")
