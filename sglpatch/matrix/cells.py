"""The matrix's cells: which exist, what each check proves, and the launch flags of a depth.

A cell is (tier, check, pin[, depth]). The checks are defined once (``CHECKS``); a tier only
decides where they run: ``cpu`` (``sglpatch.matrix.cpu``) on this machine, ``rocm``
(``sglpatch.matrix.rocm_judge``, run by ``sglpatch.rocm.job``) in a patched ROCm image on AMD GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.serving.profile import Profile

TIERS = ("cpu", "rocm")
DEPTHS = tuple(range(1, 7))
PROFILE = "glm-5.2-mxfp4-mi355x"


@dataclass(frozen=True)
class Check:
    name: str
    description: str  # one line: what passing proves
    per_depth: bool = False


CHECKS = {
    check.name: check
    for check in (
        Check("build", "HIP compile of every JIT kernel the series touches, and an import smoke of the patched pin"),
        Check("load", "the MTP draft layer loads: its quantization resolves per module on the patched pin"),
        Check(
            "spec",
            "the launch profile at EAGLE depth d is accepted and normalised; the depth's kernels build",
            per_depth=True,
        ),
    )
}


@dataclass(frozen=True)
class Cell:
    tier: str
    check: str
    pin: str
    depth: int | None = None

    @property
    def label(self) -> str:
        depth = f", depth {self.depth}" if self.depth is not None else ""
        return f"{self.check} ({self.tier}) on sglang {self.pin}{depth}"


def cells(pins: list[str], tiers: tuple[str, ...] = TIERS) -> list[Cell]:
    """Every cell of the matrix: build and load per pin, spec per pin and depth 1..6, per tier."""
    out = []
    for tier in tiers:
        for pin in pins:
            for check in CHECKS.values():
                for depth in DEPTHS if check.per_depth else (None,):
                    out.append(Cell(tier, check.name, pin, depth))
    return out


def validate_cell(cell: Cell) -> None:
    if cell.tier not in TIERS:
        raise SglpatchError(f"unknown tier {cell.tier!r}; tiers: {', '.join(TIERS)}")
    check = CHECKS.get(cell.check)
    if check is None:
        raise SglpatchError(f"unknown check {cell.check!r}; checks: {', '.join(CHECKS)}")
    if check.per_depth and cell.depth not in DEPTHS:
        raise SglpatchError(f"{cell.check} needs a depth in {DEPTHS[0]}..{DEPTHS[-1]}, got {cell.depth}")
    if not check.per_depth and cell.depth is not None:
        raise SglpatchError(f"{cell.check} takes no depth")


def depth_flags(depth: int) -> list[str]:
    """Depth d: EAGLE, d steps, top-k 1, d + 1 draft tokens."""
    return ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(depth),
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(depth + 1)]


def depth_argv(profile: Profile, depth: int, model: str | None = None) -> list[str]:
    """The ``sglang.launch_server`` arguments of the profile at EAGLE depth d (d steps, top-k 1,
    d + 1 draft tokens)."""
    return profile.with_depth(depth).server_args(model)
