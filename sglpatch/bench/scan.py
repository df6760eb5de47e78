"""Silent slow paths, named: what a server log says about a kernel or fusion that quietly fell back.

- aiter's fused MoE logs ``[fused_moe] using 2stage default for (...)`` for every shape it has no
  tuned entry for: the fp4 MoE of the write-up ran that heuristic until it was tuned (1944 -> 2626
  tok/s/node). Each distinct shape is reported.
- ``--enable-aiter-allreduce-fusion has no effect: <reasons>`` (patch 0003's warning): the fusion was
  asked for and cannot engage; each distinct reason is reported. Without the patch sglang says
  nothing, so a pristine pin's log cannot show it.
"""

from __future__ import annotations

import re

UNTUNED_MOE = re.compile(r"\[fused_moe\] using 2stage default for \(([^)]*)\)")
INERT_FUSION = re.compile(r"--enable-aiter-allreduce-fusion has no effect: (.*?)\. The all-reduce and the RMSNorm run unfused")
SCANNERS = {"untuned_moe_shapes": UNTUNED_MOE, "inert_fusion": INERT_FUSION}


def scan(log_text: str) -> dict[str, dict[str, int]]:
    """Per finding, each distinct match (the MoE shape, the fusion's reasons) and how often it was seen."""
    found: dict[str, dict[str, int]] = {}
    for name, pattern in SCANNERS.items():
        counts: dict[str, int] = {}
        for match in pattern.finditer(log_text):
            key = " ".join(match.group(1).split())
            counts[key] = counts.get(key, 0) + 1
        found[name] = counts
    return found


def describe(findings: dict[str, dict[str, int]]) -> list[str]:
    """One line per finding, for records and tables."""
    lines = []
    for shape, count in findings.get("untuned_moe_shapes", {}).items():
        lines.append(f"untuned aiter MoE shape ({shape}): heuristic 2-stage kernel, logged {count}x")
    for reason, count in findings.get("inert_fusion", {}).items():
        lines.append(f"aiter all-reduce fusion inert: {reason} (logged {count}x)")
    return lines
