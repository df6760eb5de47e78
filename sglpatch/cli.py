"""The ``sglpatch`` command: a thin door onto the library; every command is one library call."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sglpatch import forward, pyenv, sources, upstream_pr, versions
from sglpatch.check import check_series
from sglpatch.errors import SglpatchError
from sglpatch.profile import load_profile
from sglpatch.quark_config import add_mtp_aliases
from sglpatch.project import Project, apply_series
from sglpatch.report import render_apply, render_witnesses


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        needs_project = args.func not in (_quark_mtp_exclude, _profile)
        project = Project.find(args.root) if needs_project else None
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

    profile = sub.add_parser("profile", help="print a launch profile as a command line")
    profile.add_argument("name", nargs="?", default="glm-5.2-mxfp4-mi355x")
    profile.add_argument("--depth", type=int, help="speculative depth d: d steps, top-k 1, d+1 draft tokens")
    profile.add_argument("--model", help="model folder (default: the profile's, or $SGLPATCH_MODEL)")
    profile.set_defaults(func=_profile)

    quark = sub.add_parser(
        "quark-mtp-exclude",
        help="copy a Quark checkpoint's MTP exclude entries under sglang's decoder names (config.json only)",
    )
    quark.add_argument("checkpoint", type=Path, help="the checkpoint folder (or its config.json)")
    quark.set_defaults(func=_quark_mtp_exclude)

    rebase = sub.add_parser("rebase", help="forward-port the series to a new sglang release")
    rebase.add_argument("version", help="the new sglang version, e.g. 0.5.24")
    rebase.add_argument("--dry-run", action="store_true", help="classify only; write nothing")
    rebase.set_defaults(func=_rebase)

    series = sub.add_parser("series", help="series versions: bump, diff")
    series_sub = series.add_subparsers(required=True, metavar="ACTION")
    bump = series_sub.add_parser("bump", help="record a new series version in patches/CHANGELOG.md")
    bump.add_argument("-m", "--message", required=True, help="the changelog entry")
    bump.set_defaults(func=_series_bump)
    sdiff = series_sub.add_parser("diff", help="range-diff between two series versions")
    sdiff.add_argument("old", help="vN")
    sdiff.add_argument("new", help="vM")
    sdiff.add_argument("--pin", help="the pin to apply both to (default: the oldest)")
    sdiff.set_defaults(func=_series_diff)

    upstream = sub.add_parser("upstream", help="prepare one patch as an upstream pull request")
    upstream.add_argument("patch", help="the patch (file name or its stem)")
    upstream.add_argument("--base", help="a pin (default: the newest) or, with --base-repo, a git ref")
    upstream.add_argument("--base-repo", type=Path, help="your sglang clone to branch in (default: the pin's tree)")
    upstream.add_argument("--out", type=Path, help="where the mbox and PR.md go (default: build/upstream/)")
    upstream.add_argument("--range-diff", metavar="vN:vM", help="include the series range-diff vN..vM in the PR body")
    upstream.add_argument("--open-pr", action="store_true", help="open the PR with the gh CLI (push the branch first)")
    upstream.add_argument("--head", help="with --open-pr: the pushed branch as gh should name it (owner:branch)")
    upstream.set_defaults(func=_upstream)

    check = sub.add_parser("check", help="lint the series, patches, trailers and renditions")
    check.set_defaults(func=_check)

    pins = sub.add_parser("pins", help="list the pinned releases")
    pins.set_defaults(func=_pins)

    fetch = sub.add_parser("fetch", help="build (or reuse) the pristine commit of pins")
    fetch.add_argument("pins", nargs="*", help="pin versions (default: all)")
    fetch.add_argument("--git-url", help="fetch from this git remote or mirror and check the SHA")
    fetch.set_defaults(func=_fetch)

    cpu_env = sub.add_parser("cpu-env", help="build (or reuse) the CPU Python the witnesses' probes run in")
    cpu_env.add_argument("pins", nargs="*", help="pin versions (default: all)")
    cpu_env.set_defaults(func=_cpu_env)

    _matrix_parser(sub)
    return parser


def _matrix_parser(sub) -> None:
    """``sglpatch matrix``: the test matrix's cells (run, list) and its table (report)."""
    from sglpatch import matrix

    parser = sub.add_parser("matrix", help="the test matrix: run a cell, list cells, render the table")
    actions = parser.add_subparsers(required=True, metavar="ACTION")
    run = actions.add_parser("run", help="run one cell and write its record under build/matrix/records")
    run.add_argument("check", choices=list(matrix.CHECKS))
    run.add_argument("pin")
    run.add_argument("--depth", type=int, help="speculative depth (spec only): d steps, top-k 1, d+1 draft tokens")
    run.add_argument("--tier", choices=matrix.TIERS, default="cpu")
    run.add_argument("--record", type=Path, help="also write the record here (nox reads it to report a skip)")
    run.add_argument("--no-cache", action="store_true", help="cpu: run even if the cell's answer is cached")
    run.add_argument("--image", help="rocm: base image for the pin ({version} is replaced; default: the pin's rocm_image)")
    run.add_argument("--model", help="rocm: the model folder (default: the profile's, or $SGLPATCH_MODEL)")
    run.add_argument("--hf-cache", type=Path, help="rocm: the Hugging Face cache to mount (default: $HF_HOME or ~/.cache/huggingface)")
    run.add_argument("--server-timeout", type=int, default=2400, help="rocm: seconds for a server to become healthy")
    run.set_defaults(func=_matrix_run)
    cells = actions.add_parser("cells", help="list the matrix's cells")
    cells.add_argument("--tier", choices=matrix.TIERS, action="append", help="only this tier (repeatable)")
    cells.set_defaults(func=_matrix_cells)
    report = actions.add_parser("report", help="render the matrix table from records")
    report.add_argument("--records", type=Path, help="folder of records (default: build/matrix/records)")
    report.add_argument("--out", type=Path, help="also write the markdown here (default: build/matrix/matrix.md)")
    report.set_defaults(func=_matrix_report)


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


def _profile(project: Project, args: argparse.Namespace) -> int:
    profile = load_profile(args.name)
    if args.depth is not None:
        profile = profile.with_depth(args.depth)
    print(f"# {profile.name} v{profile.version}: {profile.description}")
    print(profile.command(args.model))
    return 0


def _quark_mtp_exclude(project: Project | None, args: argparse.Namespace) -> int:
    rewrite = add_mtp_aliases(args.checkpoint)
    if not rewrite.added:
        print(f"{rewrite.path}: nothing to add; the MTP exclude entries already have decoder names")
    else:
        for alias in rewrite.added:
            print(f"added {alias}")
        print(f"{rewrite.path}: {len(rewrite.added)} entries added; original kept in {rewrite.backup}")
    for limit in rewrite.limits:
        print(f"note: {limit}")
    return 0


def _series_bump(project: Project, args: argparse.Namespace) -> int:
    version = versions.bump(project.patches_dir, args.message)
    print(f"series v{version} recorded in {project.patches_dir / 'CHANGELOG.md'}")
    return 0


def _series_diff(project: Project, args: argparse.Namespace) -> int:
    print(versions.range_diff(project, args.old.removeprefix("v"), args.new.removeprefix("v"), args.pin))
    return 0


def _upstream(project: Project, args: argparse.Namespace) -> int:
    changes = ""
    if args.range_diff:
        old, _, new = args.range_diff.partition(":")
        changes = versions.range_diff(project, old.removeprefix("v"), new.removeprefix("v"))
    result = upstream_pr.export(project, args.patch, args.base, args.base_repo, args.out, changes)
    print(f"branch {result.branch} at {result.commit[:12]} in {result.repo}")
    print(f"mbox: {result.mbox}")
    print(f"PR title: {result.title}")
    print(f"PR body: {result.body}")
    if args.open_pr:
        print(upstream_pr.open_pull_request(result, args.head))
    else:
        print("Push the branch to your fork and open the pull request with that title and body.")
    return 0


def _rebase(project: Project, args: argparse.Namespace) -> int:
    report = forward.forward_port(project, args.version.removeprefix("v"), write=not args.dry_run)
    print(f"sglang {report.version} ({report.artifact})")
    for outcome in report.outcomes:
        print(f"  {outcome.name}  {outcome.verdict}  {outcome.rendition}")
        for line in outcome.detail.splitlines():
            print(f"      {line}")
    if report.written:
        print("pinned in upstream/pins.toml, renditions written, lock recorded; review and commit them")
    elif not report.complete:
        print("not written: a patch needs a person (conflict); the series and pins are unchanged")
    return 0 if report.complete else 1


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


def _matrix_run(project: Project, args: argparse.Namespace) -> int:
    from sglpatch import matrix, results

    cell = matrix.Cell(args.tier, args.check, args.pin.removeprefix("v"), args.depth)
    if args.tier == "cpu":
        record = matrix.run_cpu_cell(project, cell, use_cache=not args.no_cache)
    else:
        from sglpatch import rocm_tier

        options = rocm_tier.RocmOptions(base_image=args.image, model=args.model, server_timeout=args.server_timeout)
        if args.hf_cache:
            options.hf_cache = args.hf_cache
        record = rocm_tier.run_rocm_cell(project, cell, options)
    cached = " (cached)" if record.cached else ""
    print(f"{cell.label}: {record.outcome}{cached} in {record.seconds:.1f} s")
    for part in record.parts:
        print(f"  {part.outcome:<8} {part.name}: {part.detail}")
    if record.reason and not record.parts:
        print(f"  reason: {record.reason}")
    print(f"  record: {project.build_dir / 'matrix' / 'records' / (record.cell_id + '.json')}  log: {record.log}")
    if args.record:
        results.write_record(record, args.record.parent)
        written = args.record.parent / f"{record.cell_id}.json"
        if written != args.record:
            written.replace(args.record)
    # CI sets SGLPATCH_REQUIRE_WITNESSES: there a CPU cell that could not run all its parts fails.
    strict = args.tier == "cpu" and os.environ.get("SGLPATCH_REQUIRE_WITNESSES") == "1"
    if strict and record.outcome in (results.PARTIAL, results.SKIPPED):
        print("  SGLPATCH_REQUIRE_WITNESSES=1: a CPU cell must run every part here")
    return 1 if results.failing(record, strict=strict) else 0


def _matrix_cells(project: Project, args: argparse.Namespace) -> int:
    from sglpatch import matrix

    tiers = tuple(args.tier) if args.tier else matrix.TIERS
    for cell in matrix.cells([pin.version for pin in project.pins().pins], tiers):
        print(f"{cell.tier}\t{cell.check}\t{cell.pin}\t{cell.depth or ''}")
    return 0


def _matrix_report(project: Project, args: argparse.Namespace) -> int:
    from sglpatch import results

    folder = args.records or project.build_dir / "matrix" / "records"
    table = results.render_markdown(results.read_records(folder))
    destination = args.out or project.build_dir / "matrix" / "matrix.md"
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(table)
    print(table)
    print(f"written to {destination}")
    return 0


def _fetch(project: Project, args: argparse.Namespace) -> int:
    pins = project.pins()
    for pin in pins.select(args.pins):
        if args.git_url:
            pristine = sources.pristine_from_git(pin, args.git_url)
        else:
            pristine = sources.pristine_from_index(pin)
        print(f"{pin.version}: {pristine.commit} ({pristine.source}) in {pristine.repo}")
    return 0


def _cpu_env(project: Project, args: argparse.Namespace) -> int:
    pins = project.pins()
    for pin in pins.select(args.pins):
        python = pyenv.cpu_python(pin)
        overlay = " ".join(f"{name}{spec}" for name, spec in python.overlay.items()) or "(the base alone)"
        print(f"{pin.version}: {python.python}  {overlay}")
    return 0
