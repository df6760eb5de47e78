"""The pin's own benchmark client (``bench_serving``): where it lives and which flags it has.

Read from the pin's source, never assumed from its version: the module moved from
``sglang/bench_serving.py`` to ``sglang/benchmark/serving.py`` in 0.5.15 (the old one became a
shim), and ``--cache-report`` and the client's p95 TTFT exist only from 0.5.14.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sglpatch.plumbing.errors import SglpatchError

MODULES = (("sglang.benchmark.serving", "python/sglang/benchmark/serving.py"),
           ("sglang.bench_serving", "python/sglang/bench_serving.py"))
_FLAG = re.compile(r"""add_argument\(\s*["'](--[a-z0-9-]+)["']""")


@dataclass(frozen=True)
class BenchClient:
    module: str
    path: str  # the module's file in the tree
    flags: frozenset[str]

    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def cache_report(self) -> bool:
        return self.has("--cache-report")


def bench_client(tree: Path) -> BenchClient:
    """The client module of the pin in ``tree`` (upstream's layout) and its command-line flags."""
    for module, path in MODULES:
        source = tree / path
        if source.is_file():
            text = source.read_text(errors="replace")
            flags = frozenset(_FLAG.findall(text))
            if "--dataset-name" in flags:  # the implementation, not the 0.5.15+ shim
                return BenchClient(module, path, flags)
    raise SglpatchError(f"{tree}: no sglang benchmark client ({' or '.join(p for _, p in MODULES)}) with --dataset-name")
