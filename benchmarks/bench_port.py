"""Leave-one-out port figures for `sglpatch rebase` (a benchmark, not a test: it prints, it does not assert).

For every pinned release V (or those given): a copy of the project as if V had never been seen (its pin
and lock entry removed, every rendition made for V alone deleted, every rendition covering V and other
pins made again for the nearest of them from its locked commit; ``sglpatch.rebase.leave_one_out``), then ``sglpatch rebase V`` in the copy -- the cascade of merge tools
and the judge -- and, unless ``--dry-run``, the staged witnessed apply that writes the pin and lock.
Per release and patch: the verdict, the cascade step that ported it or what stopped it, whether the
release's tree equals the committed lock's, its CPU matrix cells on the staged series, and the time. Totals: k/N ported by themselves, j/N
identical to the committed tree, and how many CPU cells ran and how many were replayed.

A cell, a witness or a probe whose answer an earlier run kept for the same trees and checking code
is replayed, not run again: "8/8 (6 replayed)" says six of the eight passed answers were replayed.
``--fresh`` computes every answer anew (the run gets an empty answer store of its own; the CPU
environments and downloads are still shared), so the figures and times are those of a cold run.

    python benchmarks/bench_port.py [VERSION ...] [--dry-run] [--fresh] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sglpatch.plumbing.cache import ANSWERS_ENV  # noqa: E402
from sglpatch.rebase.leave_one_out import rebase_left_out  # noqa: E402
from sglpatch.sources.pins import load_pins  # noqa: E402


def _cell(patch: dict) -> str:
    short = patch["name"][:4]
    if patch["stopped"]:
        return f"{short} {patch['verdict']}: {patch['stopped'][:90]}"
    step = f" by {patch['step']}" if patch["step"] else ""
    source = f" of {patch['from']}" if patch["step"] and patch["step"] != "exact" else ""
    return f"{short} {patch['verdict']}{step}{source}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="*", help="releases to leave out (default: every pin)")
    parser.add_argument("--dry-run", action="store_true", help="classify only: no staged apply, no lock")
    parser.add_argument("--fresh", action="store_true",
                        help="compute every answer anew (an empty answer store), replay none")
    parser.add_argument("--json", type=Path, help="write the rows here as JSON")
    args = parser.parse_args(argv)
    pinned = [pin.version for pin in load_pins(ROOT / "upstream" / "pins.toml").pins]
    versions = args.versions or pinned
    unknown = [v for v in versions if v not in pinned]
    if unknown:
        print(f"bench_port: not pinned: {', '.join(unknown)}", file=sys.stderr)
        return 2
    rows = []
    started = time.perf_counter()
    print("| release | ported | identical | CPU cells passed | time | per patch: verdict, step or what stopped it |")
    print("|---|---|---|---|---|---|")
    kept_answers = os.environ.get(ANSWERS_ENV)
    with tempfile.TemporaryDirectory(prefix="sglpatch-bench-port-") as work:
        if args.fresh:
            os.environ[ANSWERS_ENV] = str(Path(work) / "fresh-answers")
        try:
            for version in versions:
                rows.append(_port(version, Path(work), args.dry_run))
        finally:
            if args.fresh:
                _restore(ANSWERS_ENV, kept_answers)
    total = time.perf_counter() - started
    k = sum(row["ported"] for row in rows)
    j = sum(row["identical"] for row in rows)
    cells = sum(len(row["cells"]) for row in rows)
    replayed = sum(len(row.get("cells_replayed", [])) for row in rows)
    print(f"ported by themselves: {k}/{len(rows)}; identical to the committed tree: {j}/{len(rows)}; "
          f"{'dry run' if args.dry_run else 'with the staged witnessed apply'}; {total:.0f} s in all "
          f"(median {sorted(r['seconds'] for r in rows)[len(rows) // 2]:.0f} s a release)")
    print(f"CPU cells: {cells - replayed} ran, {replayed} replayed"
          + ("; fresh answers (none kept from an earlier run)" if args.fresh else
             "; replayed answers are those an earlier run kept for the same trees and code (--fresh: none)"))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def _port(version: str, work: Path, dry_run: bool) -> dict:
    row = rebase_left_out(ROOT, version, work, write=not dry_run)
    cells = row["cells"]
    replayed = len(row.get("cells_replayed", []))
    passed = f"{sum(c.endswith(' passed') for c in cells)}/{len(cells)}" if cells else "-"
    if replayed:
        passed += f" ({replayed} replayed)"
    stopped = f"; not written: {row['error'][:200]}" if row["error"] and row["patches"] else ""
    print(f"| {version} | {'yes' if row['ported'] else 'no'} | {'yes' if row['identical'] else 'no'} | {passed} | "
          f"{row['seconds']:.0f} s | {'; '.join(_cell(p) for p in row['patches']) or row['error'][:200]}{stopped} |",
          flush=True)
    return row


if __name__ == "__main__":
    sys.exit(main())
