"""The witnesses sglpatch knows, by the name a patch's ``Witness`` trailer gives them, and which
of them judge a rendition (``witnesses_for``): its own witness, and the patch's regression tests
(``upstream-test``) where it is the rendition that goes upstream."""

from __future__ import annotations

from pathlib import Path

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.series.patches import RENDITIONS_DIR, regression_tests
from sglpatch.witnesses.mtp_exclude import MtpQuarkExcludeWitness
from sglpatch.witnesses.results import Witness
from sglpatch.witnesses.rocm_flags import RocmFlagsWitness
from sglpatch.witnesses.rocm_guard import RocmGuardWitness
from sglpatch.witnesses.upstream_test import NAME as UPSTREAM_TEST
from sglpatch.witnesses.upstream_test import UpstreamTestWitness


def registry() -> dict[str, Witness]:
    """Every witness a ``Witness`` trailer can name. ``upstream-test`` here is bound to no patch:
    ``witnesses_for`` gives the one bound to a patch's tests."""
    witnesses: list[Witness] = [RocmGuardWitness(), MtpQuarkExcludeWitness(), RocmFlagsWitness(), UpstreamTestWitness()]
    return {witness.name: witness for witness in witnesses}


def witness_for(trailer: str | None, where: str) -> Witness | None:
    """The witness a patch's ``Witness`` trailer names (its first word), or None without one;
    ``upstream-test`` bound to the tests beside the patch file ``where`` names."""
    if not trailer:
        return None
    name = trailer.split()[0]
    known = registry()
    if name not in known:
        raise SglpatchError(f"{where}: unknown witness {name!r}; known: {', '.join(sorted(known))}")
    if name == UPSTREAM_TEST:
        return _tests_beside(Path(where))
    return known[name]


def _tests_beside(patch_file: Path) -> UpstreamTestWitness:
    """``upstream-test`` bound to the tests of the patch whose file (main or rendition) this is:
    ``patches/<stem>.patch`` or ``patches/renditions/<stem>/<version>.patch``."""
    if patch_file.parent.parent.name == RENDITIONS_DIR:
        patches_dir, stem = patch_file.parent.parent.parent, patch_file.parent.name
    else:
        patches_dir, stem = patch_file.parent, patch_file.name.removesuffix(".patch")
    return UpstreamTestWitness(stem, regression_tests(patches_dir, stem))


def witnesses_for(patch, rendition) -> list[Witness]:
    """The witnesses that judge ``rendition`` of ``patch`` (a ``series.SeriesPatch``), the one its
    ``Witness`` trailer names first: that one, and the patch's regression tests where
    ``rendition`` is its main file (the tests are written against the code that goes upstream).
    A patch whose trailer names ``upstream-test`` has its tests as its witness, on every
    rendition."""
    named = witness_for(rendition.trailer("Witness"), str(rendition.path))
    if isinstance(named, UpstreamTestWitness):
        if not patch.tests:
            raise SglpatchError(f"{rendition.path}: Witness upstream-test, but patches/tests/{patch.stem}/ holds no test")
        return [UpstreamTestWitness(patch.stem, patch.tests)]
    tests = UpstreamTestWitness(patch.stem, patch.tests) if patch.tests and rendition.path == patch.main.path else None
    return [w for w in (named, tests) if w is not None]
