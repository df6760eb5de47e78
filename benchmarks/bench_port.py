"""Leave-one-out port figures for `sglpatch rebase` (a benchmark, not a test: it prints, it does not assert).

For every pinned release V (or those given): a copy of the project as if V had never been seen (its pin
and lock entry removed, every rendition made for V alone deleted, every rendition covering V and other
pins made again for the nearest of them from its locked commit; ``sglpatch.leave_one_out``), then ``sglpatch rebase V`` in the copy -- the cascade of merge tools
and the judge -- and, unless ``--dry-run``, the staged witnessed apply that writes the pin and lock.
Per release and patch: the verdict, the cascade step that ported it or what stopped it, whether the
release's tree equals the committed lock's, its CPU matrix cells on the staged series, and the time. Totals: k/N ported by themselves, j/N
identical to the committed tree.

    python benchmarks/bench_port.py [VERSION ...] [--dry-run] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sglpatch.leave_one_out import rebase_left_out  # noqa: E402
from sglpatch.pins import load_pins  # noqa: E402


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
    with tempfile.TemporaryDirectory(prefix="sglpatch-bench-port-") as work:
        for version in versions:
            row = rebase_left_out(ROOT, version, Path(work), write=not args.dry_run)
            rows.append(row)
            cells = row["cells"]
            passed = f"{sum(c.endswith(' passed') for c in cells)}/{len(cells)}" if cells else "-"
            stopped = f"; not written: {row['error'][:200]}" if row["error"] and row["patches"] else ""
            print(f"| {version} | {'yes' if row['ported'] else 'no'} | {'yes' if row['identical'] else 'no'} | {passed} | "
                  f"{row['seconds']:.0f} s | {'; '.join(_cell(p) for p in row['patches']) or row['error'][:200]}{stopped} |",
                  flush=True)
    total = time.perf_counter() - started
    k = sum(row["ported"] for row in rows)
    j = sum(row["identical"] for row in rows)
    print(f"ported by themselves: {k}/{len(rows)}; identical to the committed tree: {j}/{len(rows)}; "
          f"{'dry run' if args.dry_run else 'with the staged witnessed apply'}; {total:.0f} s in all "
          f"(median {sorted(r['seconds'] for r in rows)[len(rows) // 2]:.0f} s a release)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
