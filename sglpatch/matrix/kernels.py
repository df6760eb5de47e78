"""JIT kernels in the matrix: their compile witnesses, and where a pin compiles the multi-step one."""

from __future__ import annotations

import re
from pathlib import Path

from sglpatch.apply.pin_under_test import PinUnderTest, checkout
from sglpatch.matrix.records import FAILED, PASSED, SKIPPED, Part
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.witnesses import answer_cache, guard_kernel, rocm_guard
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE

# The HIP compile witness of each JIT kernel source, by file name. A kernel the series touches
# without an entry here fails the build cell: every touched kernel must be compiled for ROCm.
COMPILE_WITNESSES = {Path(guard_kernel.HEADER).name: rocm_guard.RocmGuardWitness}


def compile_witness(tree_hash: str, commit: str, put: PinUnderTest, kernel: str):
    """The kernel's compile witness on one commit of the pin (cached by tree hash); None if the
    kernel has none."""
    witness_class = COMPILE_WITNESSES.get(Path(kernel).name)
    if witness_class is None:
        return None
    witness = witness_class()
    return answer_cache.run_cached(witness, tree_hash, put.pin, lambda: checkout(put, commit))


def kernel_parts(put: PinUnderTest, kernels: list[str], *, pristine_too: bool) -> list[Part]:
    """The HIP build of each kernel on the patched tree (must pass) and, with ``pristine_too``, on
    the pristine tree: it must fail there exactly where the series carries a patch for it."""
    parts = []
    for kernel in kernels:
        name = Path(kernel).name
        patched = compile_witness(put.patched_tree, put.patched_commit, put, kernel)
        if patched is None:
            parts.append(Part(f"HIP build of {name}", FAILED, f"no compile witness knows {kernel}"))
            continue
        parts.append(witness_part(f"{what_ran(patched)} of {name} (patched)", patched, expect=CLEAN))
        if pristine_too:
            pristine = compile_witness(put.pristine_tree, put.pristine_commit, put, kernel)
            needed = [patch for patch, applied in put.kernel_patches.get(kernel, []) if applied]
            part = witness_part(f"{what_ran(pristine)} of {name} (pristine)", pristine, expect=BUG if needed else CLEAN)
            why = f"{', '.join(needed)} was needed here" if needed else "no patch for it was needed here"
            part.detail = f"{part.detail} ({why})"
            parts.append(part)
    return parts


def what_ran(result) -> str:
    """A compile part's name says what ran: without the HIP toolchain nothing was built, only the
    include graph was walked under the ROCm macros."""
    if result.level.startswith("include-graph"):
        return "include graph under -DUSE_ROCM (no HIP compile here)"
    return "HIP build"


def witness_part(name: str, result, *, expect: str) -> Part:
    """A witness answer as a cell part: "unavailable" is a skip with its reason, never a pass."""
    detail = f"{result.shown()} {result.detail}".strip() + (f" (replayed: {result.replayed})" if result.replayed else "")
    if result.state == UNAVAILABLE:
        return Part(name, SKIPPED, result.detail)
    return Part(name, PASSED if result.state == expect else FAILED, f"expected {expect}, got {detail}")


def kernel_sources(tree: Path) -> list[str]:
    """Tree paths of every compile-witnessed kernel the pin ships."""
    found = []
    for name in COMPILE_WITNESSES:
        for root in ("python/sglang/jit_kernel", "python/sglang/kernels/jit"):
            found += [str(p.relative_to(tree)) for p in (tree / root).rglob(name)]
    return sorted(found)


_MULTI_STEP_RE = re.compile(r"if self\.speculative_num_steps\s*(>=|>)\s*(\d+)\s*:")


def multi_step_kernel_threshold(tree: Path) -> tuple[int, str]:
    """The smallest ``speculative_num_steps`` at which the pin's sparse-attention backend compiles
    ``fused_metadata_copy_multi``, read from the pin's own source, with the file as evidence."""
    package = tree / "python" / "sglang" / "srt" / "layers" / "attention"
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(errors="replace")
        if "fused_metadata_copy_multi" not in text:
            continue
        for match in _MULTI_STEP_RE.finditer(text):
            # The condition must guard the multi-step kernel: its import follows within a few lines.
            if "fused_metadata_copy_multi" in text[match.end() : match.end() + 400]:
                op, number = match.group(1), int(match.group(2))
                line = text[: match.start()].count("\n") + 1
                where = f"{path.relative_to(tree)}:{line} ({match.group(0).strip()})"
                return (number + 1 if op == ">" else number), where
    raise SglpatchError(f"{tree}: no sparse-attention backend compiles fused_metadata_copy_multi")
