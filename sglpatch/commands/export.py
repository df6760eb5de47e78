"""``sglpatch export``: a pin's applied series for plain quilt or git am."""

from __future__ import annotations

from pathlib import Path

from sglpatch import exitcodes
from sglpatch.cli_options import add, pin_version, say
from sglpatch.series import export


def register(sub) -> None:
    parser = add(sub, "export", run, "a pin's applied series as a quilt folder or an mbox for git am")
    parser.add_argument("pin")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--quilt", type=Path, metavar="DIR", help="a quilt patches folder with its series file")
    where.add_argument("--mbox", type=Path, metavar="FILE", help="one mbox, in order, for git am")


def run(project, args) -> int:
    version = pin_version(project, args.pin)
    if args.quilt:
        folder = export.export_quilt(project, version, args.quilt)
        say(args, f"{folder}: quilt series for sglang {version} (QUILT_PATCHES={folder} quilt push -a on the pristine tree)")
    else:
        mbox = export.export_mbox(project, version, args.mbox)
        say(args, f"{mbox}: mbox for sglang {version} (git am {mbox} on the pristine tree)")
    return exitcodes.OK
