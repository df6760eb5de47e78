"""The sglpatch command line: one verb per file in sglpatch/commands/, each a door onto the library."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglpatch import __version__, exitcodes, progress
from sglpatch.commands import (
    apply,
    bench,
    check,
    cpu_env,
    export,
    fetch,
    image,
    matrix,
    patch,
    pins,
    profile,
    quark_mtp_exclude,
    rebase,
    rehearse,
    series,
    status,
    upstream,
    watch,
    witness,
)
from sglpatch.errors import SglpatchError, Unavailable
from sglpatch.project import Project

VERBS = (apply, witness, check, pins, fetch, cpu_env, patch, export, image, upstream, rebase, status,
         watch, series, profile, quark_mtp_exclude, matrix, bench, rehearse)  # in the order --help lists them

DESCRIPTION = """\
Reproducible fixes for sglang on AMD ROCm: a versioned patch series applied to
pinned sglang releases, each patch proven by a witness, with a test matrix and
upstream pull requests. `sglpatch COMMAND --help` tells more of each command."""


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    progress.configure("quiet" if args.quiet else "auto")
    try:
        project = Project.find(args.root) if args.needs_project else None
        return args.run(project, args)
    except Unavailable as exc:
        progress.stop()
        print(f"sglpatch: cannot run here: {exc}", file=sys.stderr)
        return exitcodes.UNAVAILABLE
    except SglpatchError as exc:
        progress.stop()
        print(f"sglpatch: error: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    finally:
        progress.stop()


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="sglpatch",
        description=DESCRIPTION,
        epilog=exitcodes.TABLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"sglpatch {__version__}")
    top.add_argument("--root", type=Path, default=None, help="the project folder (default: found from here)")
    top.add_argument("-q", "--quiet", action="store_true", help="no progress display; only results and errors")
    sub = top.add_subparsers(required=True, metavar="COMMAND")
    for module in VERBS:
        module.register(sub)
    return top
