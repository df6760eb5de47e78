"""The ``sglpatch`` command: a thin door onto the library; every command is one library call."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglpatch import sources
from sglpatch.check import check_series
from sglpatch.errors import SglpatchError
from sglpatch.project import Project, apply_series
from sglpatch.report import render_apply, render_witnesses


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        project = Project.find(args.root)
        return args.func(project, args)
    except SglpatchError as exc:
        print(f"sglpatch: error: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglpatch", description=__doc__)
    parser.add_argument("--root", type=Path, default=None, help="the project folder (default: found from here)")
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    apply = sub.add_parser("apply", help="apply the series to pinned sglang releases")
    apply.add_argument("pins", nargs="*", help="pin versions (default: all)")
    apply.add_argument("--update-lock", action="store_true", help="accept results that differ from series.lock")
    apply.add_argument("--out", type=Path, help="where trees and the report go (default: build/)")
    apply.add_argument("--git-url", help="take pristine trees from this git remote or mirror, not the index")
    apply.add_argument("--json", type=Path, help="also write the JSON report here")
    apply.add_argument(
        "--no-witnesses",
        action="store_true",
        help="classify by text alone (apply/reverse-apply), without running the patches' witnesses",
    )
    apply.set_defaults(func=_apply)

    witness = sub.add_parser("witness", help="run each patch's witness on pins, pristine and patched")
    witness.add_argument("pins", nargs="*", help="pin versions (default: all)")
    witness.add_argument("--out", type=Path, help="where trees and the report go (default: build/)")
    witness.set_defaults(func=_witness)

    check = sub.add_parser("check", help="lint the series, patches, trailers and renditions")
    check.set_defaults(func=_check)

    pins = sub.add_parser("pins", help="list the pinned releases")
    pins.set_defaults(func=_pins)

    fetch = sub.add_parser("fetch", help="build (or reuse) the pristine commit of pins")
    fetch.add_argument("pins", nargs="*", help="pin versions (default: all)")
    fetch.add_argument("--git-url", help="fetch from this git remote or mirror and check the SHA")
    fetch.set_defaults(func=_fetch)
    return parser


def _apply(project: Project, args: argparse.Namespace) -> int:
    report = apply_series(
        project,
        args.pins,
        update_lock=args.update_lock,
        out_dir=args.out,
        git_url=args.git_url,
        report_path=args.json,
        run_witnesses=not args.no_witnesses,
    )
    where = args.json or (args.out or project.build_dir) / "apply-report.json"
    print(render_apply(report, str(where)))
    return 0 if report.ok else 1


def _witness(project: Project, args: argparse.Namespace) -> int:
    report = apply_series(project, args.pins, out_dir=args.out)
    print(render_witnesses(report))
    return 0 if report.ok else 1


def _check(project: Project, args: argparse.Namespace) -> int:
    problems = check_series(project.patches_dir, project.pins())
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s) in {project.patches_dir}")
    return 1 if problems else 0


def _pins(project: Project, args: argparse.Namespace) -> int:
    for pin in project.pins().pins:
        commit = pin.commit[:12] if pin.commit else "(unknown)"
        verified = "verified" if pin.commit_verified else "unverified"
        print(f"{pin.version:<14} {pin.tag:<15} {commit:<12} {verified:<10} {pin.artifact}  {pin.rocm_image}")
    return 0


def _fetch(project: Project, args: argparse.Namespace) -> int:
    pins = project.pins()
    for pin in pins.select(args.pins):
        if args.git_url:
            pristine = sources.pristine_from_git(pin, args.git_url)
        else:
            pristine = sources.pristine_from_index(pin, sources.index_url(pins.index_url))
        print(f"{pin.version}: {pristine.commit} ({pristine.source}) in {pristine.repo}")
    return 0
