"""Witnesses: checks that fail on a tree with the bug and pass on a tree without it.

Each patch names its witness in its ``Witness`` trailer. A witness runs against a checked-out
tree (upstream layout, ``python/sglang/...``) of one pin and answers with a ``WitnessResult``:

- ``bug``: the check fails -- the bug is there;
- ``clean``: the check passes -- the bug is not there;
- ``unavailable``: the check could not run here, with the reason (never silently a pass).

Results are cached by the tree's git hash and the witness's version: the same tree always gets the
same answer, so a warm ``apply`` runs nothing.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from sglpatch import cache
from sglpatch.errors import SglpatchError
from sglpatch.pins import Pin

BUG = "bug"
CLEAN = "clean"
UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class WitnessResult:
    witness: str
    state: str
    level: str = ""
    detail: str = ""

    def summary(self) -> str:
        level = f" [{self.level}]" if self.level else ""
        return f"{self.state}{level}"


class Witness(Protocol):
    name: str
    version: str  # bump when the check changes, so cached answers are not reused

    def run(self, tree: Path, pin: Pin) -> WitnessResult: ...


def registry() -> dict[str, Witness]:
    from sglpatch.witnesses.mtp_exclude import MtpQuarkExcludeWitness
    from sglpatch.witnesses.rocm_flags import RocmFlagsWitness
    from sglpatch.witnesses.rocm_guard import RocmGuardWitness

    witnesses: list[Witness] = [RocmGuardWitness(), MtpQuarkExcludeWitness(), RocmFlagsWitness()]
    return {witness.name: witness for witness in witnesses}


def witness_for(trailer: str | None, where: str) -> Witness | None:
    """The witness a patch's ``Witness`` trailer names (its first word), or None without one."""
    if not trailer:
        return None
    name = trailer.split()[0]
    known = registry()
    if name not in known:
        raise SglpatchError(f"{where}: unknown witness {name!r}; known: {', '.join(sorted(known))}")
    return known[name]


def run_cached(witness: Witness, tree_hash: str, pin: Pin, materialize) -> WitnessResult:
    """The witness's answer for the tree with git hash ``tree_hash``; runs it only when not cached.

    ``materialize`` is called to get the tree on disk only when the witness must really run.
    Unavailable answers are not cached: the next run may have the toolchain.
    """
    entry = cache.cache_root() / "witness" / f"{witness.name}-{witness.version}" / f"{pin.version}-{tree_hash}.json"
    if entry.exists():
        try:
            return WitnessResult(**json.loads(entry.read_text()))
        except (ValueError, TypeError):
            entry.unlink()
    result = witness.run(materialize(), pin)
    if result.state != UNAVAILABLE:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(result)))
        tmp.replace(entry)
    return result
