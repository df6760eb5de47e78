"""The witnesses sglpatch knows, by the name a patch's ``Witness`` trailer gives them."""

from __future__ import annotations

from sglpatch.errors import SglpatchError
from sglpatch.witnesses.mtp_exclude import MtpQuarkExcludeWitness
from sglpatch.witnesses.results import Witness
from sglpatch.witnesses.rocm_flags import RocmFlagsWitness
from sglpatch.witnesses.rocm_guard import RocmGuardWitness


def registry() -> dict[str, Witness]:
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
