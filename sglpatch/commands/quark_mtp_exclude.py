"""``sglpatch quark-mtp-exclude``: the hand fix for a Quark checkpoint's MTP exclude list."""

from __future__ import annotations

from pathlib import Path

from sglpatch import exitcodes
from sglpatch.cli_options import add, say
from sglpatch.serving.quark_config import add_mtp_aliases


def register(sub) -> None:
    parser = add(sub, "quark-mtp-exclude", run,
                 "copy a Quark checkpoint's MTP exclude entries under sglang's decoder names (config.json only)",
                 needs_project=False)
    parser.add_argument("checkpoint", type=Path, help="the checkpoint folder (or its config.json)")


def run(project, args) -> int:
    rewrite = add_mtp_aliases(args.checkpoint)
    if not rewrite.added:
        say(args, f"{rewrite.path}: nothing to add; the MTP exclude entries already have decoder names")
    else:
        for alias in rewrite.added:
            say(args, f"added {alias}")
        say(args, f"{rewrite.path}: {len(rewrite.added)} entries added; original kept in {rewrite.backup}")
    for limit in rewrite.limits:
        say(args, f"note: {limit}")
    return exitcodes.OK
