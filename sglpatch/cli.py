"""The ``sglpatch`` command: a thin door onto the library; every command is one library call."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sglpatch import forward, progress, pyenv, sources, upstream_pr, versions
from sglpatch.check import check_series
from sglpatch.errors import SglpatchError
from sglpatch.profile import load_profile
from sglpatch.quark_config import add_mtp_aliases
from sglpatch.project import Project, apply_series
from sglpatch.report import render_apply, render_witnesses


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    progress.configure("quiet" if args.quiet else "auto")
    try:
        needs_project = args.func not in (_quark_mtp_exclude, _profile)
        project = Project.find(args.root) if needs_project else None
        return args.func(project, args)
    except SglpatchError as exc:
        progress.stop()
        print(f"sglpatch: error: {exc}", file=sys.stderr)
        return 2
    finally:
        progress.stop()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglpatch", description=__doc__)
    parser.add_argument("--root", type=Path, default=None, help="the project folder (default: found from here)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress display; only results and errors")
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
    _witness_mode_arguments(apply)
    apply.add_argument(
        "--into",
        type=Path,
        metavar="CHECKOUT",
        help="apply to your own sglang checkout (e.g. /sgl-workspace/sglang in the ROCm image) instead of build/trees",
    )
    apply.add_argument(
        "--discard-local",
        action="store_true",
        help="drop commits and untracked files of yours in build/trees/<pin> that the applied tree replaces",
    )
    apply.set_defaults(func=_apply)

    witness = sub.add_parser("witness", help="run each patch's witness on pins, pristine and patched")
    witness.add_argument("pins", nargs="*", help="pin versions (default: all)")
    _witness_mode_arguments(witness)
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
    upstream.add_argument("-s", "--signoff", action="store_true", help="add your Signed-off-by (from your git config)")
    upstream.set_defaults(func=_upstream)

    patch = sub.add_parser("patch", help="write patches on a pin's tree: start, refresh (quilt and git habits)")
    patch_sub = patch.add_subparsers(required=True, metavar="ACTION")
    start = patch_sub.add_parser("start", help="apply the series to a pin's tree, ready for your commits")
    start.add_argument("pin")
    start.set_defaults(func=_patch_start)
    refresh = patch_sub.add_parser("refresh", help="write the commits of a pin's tree back into patches/")
    refresh.add_argument("pin")
    refresh.add_argument("--rendition-of", metavar="PATCH", help="new commits are this patch's rendition for the pin")
    refresh.set_defaults(func=_patch_refresh)

    image = sub.add_parser("image", help="build the pin's patched image FROM its released ROCm image (docker)")
    image.add_argument("pin")
    image.add_argument("--image", help="base image ({version} is replaced; default: the pin's rocm_image or $SGLPATCH_ROCM_IMAGE)")
    image.add_argument("--docker-url", help="the docker engine (default: $DOCKER_HOST or the local socket)")
    image.set_defaults(func=_image)

    export = sub.add_parser("export", help="a pin's applied series as a quilt folder or an mbox for git am")
    export.add_argument("pin")
    where = export.add_mutually_exclusive_group(required=True)
    where.add_argument("--quilt", type=Path, metavar="DIR", help="a quilt patches folder with its series file")
    where.add_argument("--mbox", type=Path, metavar="FILE", help="one mbox, in order, for git am")
    export.set_defaults(func=_export)

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
    _bench_parser(sub)
    return parser


def _witness_mode_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-unavailable",
        action="store_true",
        help="a witness that cannot run here does not fail the pin; every such line says UNPROVEN",
    )


def _rocm_options(parser) -> None:
    parser.add_argument("--image", help="base image for the pin ({version} is replaced; default: the pin's rocm_image)")
    parser.add_argument("--model", help="the model folder (default: the profile's, or $SGLPATCH_MODEL)")
    parser.add_argument("--hf-cache", type=Path, help="the Hugging Face cache to mount (default: $HF_HOME or ~/.cache/huggingface)")
    parser.add_argument("--server-timeout", type=int, default=2400, help="seconds for a server to become healthy")


def _options_from(args):
    from sglpatch.matrix import rocm as rocm_tier

    options = rocm_tier.RocmOptions(base_image=args.image, model=args.model, server_timeout=args.server_timeout)
    if args.hf_cache:
        options.hf_cache = args.hf_cache
    return options


def _bench_parser(sub) -> None:
    """``sglpatch bench``: the write-up's workloads on a ROCm node, the gate, and their reports."""
    from sglpatch.bench.workloads import WORKLOADS

    parser = sub.add_parser("bench", help="the bench: run a workload, the accuracy gate, MoE tuning, report, compare")
    actions = parser.add_subparsers(required=True, metavar="ACTION")
    run = actions.add_parser("run", help="measure a workload on a pin in its patched ROCm image")
    run.add_argument("workload", choices=WORKLOADS)
    run.add_argument("pin")
    run.add_argument("--pristine", action="store_true", help="the released image without the series (for compare)")
    run.add_argument("--record", type=Path, help="also write a summary here (nox reads it to report a skip)")
    _rocm_options(run)
    run.set_defaults(func=_bench_run)
    gate = actions.add_parser("accuracy", help="GSM8K and accept length of the patched image, with sglang's AMD CI floors")
    gate.add_argument("pin")
    gate.add_argument("--record", type=Path, help="also write the record here")
    _rocm_options(gate)
    gate.set_defaults(func=_bench_accuracy)
    tune = actions.add_parser("tune-moe", help="aiter's MoE tuner for the shapes the serving bench found untuned")
    tune.add_argument("pin")
    _rocm_options(tune)
    tune.set_defaults(func=_bench_tune_moe)
    show = actions.add_parser("report", help="render the bench table (and plots) from records")
    show.add_argument("--records", type=Path, help="folder of records (default: build/bench/records)")
    show.add_argument("--out", type=Path, help="where the markdown and plots go (default: build/bench/)")
    show.set_defaults(func=_bench_report)
    compare = actions.add_parser("compare", help="per-figure ratios B / A between two folders of bench records")
    compare.add_argument("a", type=Path, help="records A (e.g. the pristine image's)")
    compare.add_argument("b", type=Path, help="records B (e.g. the patched image's)")
    compare.set_defaults(func=_bench_compare)


def _bench_run(project: Project, args: argparse.Namespace) -> int:
    import json as _json

    from sglpatch.bench import rocm as bench_rocm
    from sglpatch.matrix import records as results

    records = bench_rocm.run_bench(project, args.pin.removeprefix("v"), args.workload, _options_from(args), pristine=args.pristine)
    for record in records:
        print(f"bench {record.workload} on sglang {record.pin} ({record.variant}): {record.outcome}")
        for part in record.parts:
            print(f"  {part.outcome:<8} {part.name}: {part.detail}")
    print(f"  records: {bench_rocm.bench_dir(project) / 'records'}  table: {bench_rocm.bench_dir(project) / 'bench.md'}")
    if args.record:
        outcome = "skipped" if all(r.outcome == results.SKIPPED for r in records) else (
            "failed" if any(r.outcome == results.FAILED for r in records) else "passed")
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(_json.dumps({"outcome": outcome, "reason": "; ".join(sorted({r.reason for r in records if r.reason}))}))
    return 1 if any(r.outcome == results.FAILED for r in records) else 0


def _bench_accuracy(project: Project, args: argparse.Namespace) -> int:
    from sglpatch.bench import rocm as bench_rocm
    from sglpatch.matrix import records as results

    record = bench_rocm.run_accuracy(project, args.pin.removeprefix("v"), _options_from(args))
    print(f"accuracy on sglang {record.pin}: {record.outcome}")
    for part in record.parts:
        print(f"  {part.outcome:<8} {part.name}: {part.detail}")
    if args.record:
        results.write_record(record, args.record.parent)
        written = args.record.parent / f"{record.cell_id}.json"
        if written != args.record:
            written.replace(args.record)
    return 1 if results.failing(record) else 0


def _bench_tune_moe(project: Project, args: argparse.Namespace) -> int:
    from sglpatch.bench import rocm as bench_rocm

    written = bench_rocm.run_tune_moe(project, args.pin.removeprefix("v"), _options_from(args))
    print(f"tuned MoE config written to {written}; review and commit it (the profile names it)")
    return 0


def _bench_report(project: Project, args: argparse.Namespace) -> int:
    from sglpatch.bench import report
    from sglpatch.bench.records import read_bench_records

    out = args.out or project.build_dir / "bench"
    records = read_bench_records(args.records or project.build_dir / "bench" / "records")
    table = report.render_bench_markdown(records)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(table)
    plots = [report.plot_serving(r, out / f"{r.record_id}.png") for r in records
             if r.workload == "serving" and any(run.get("figures") for run in r.runs)]
    print(table)
    print(f"written to {out / 'bench.md'}" + (f" and {len(plots)} plot(s)" if plots else ""))
    return 0


def _bench_compare(project: Project, args: argparse.Namespace) -> int:
    from sglpatch.bench import compare
    from sglpatch.bench.records import read_bench_records

    print(compare.render(compare.compare(read_bench_records(args.a), read_bench_records(args.b))))
    return 0


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
    _witness_mode_arguments(run)
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
    job = actions.add_parser("job", help="a pin's ROCm CI job: the image built once, one server per launch configuration, the checks in sequence")
    job.add_argument("pin")
    job.add_argument("--event", choices=("pr", "nightly", "weekly"), default="pr",
                     help="which sessions: pr and nightly the matrix and the gate, weekly the bench")
    job.add_argument("--record", type=Path, help="also write the job's outcome here (nox reads it to report a skip)")
    _rocm_options(job)
    job.set_defaults(func=_matrix_job)
    plan = actions.add_parser("plan", help="the ROCm CI jobs for an event and their estimated node-hours")
    plan.add_argument("--event", choices=("pr", "nightly", "weekly"), default="pr")
    plan.add_argument("--base", help="pr: the base ref; the pins whose patch renditions changed since it")
    plan.add_argument("--changed", nargs="*", default=[], help="pr: changed files (instead of --base)")
    plan.add_argument("--records", type=Path, help="records with durations (default: build/matrix/records)")
    plan.add_argument("--write-workflow", type=Path, help="write the GitHub Actions workflow generated from the plan here")
    plan.set_defaults(func=_matrix_plan)


def _apply(project: Project, args: argparse.Namespace) -> int:
    if args.into is not None:
        return _apply_into(project, args)
    report = apply_series(
        project,
        args.pins,
        update_lock=args.update_lock,
        out_dir=args.out,
        git_url=args.git_url,
        report_path=args.json,
        run_witnesses=not args.no_witnesses,
        allow_unavailable=args.allow_unavailable,
        discard_local=args.discard_local,
    )
    where = args.json or (args.out or project.build_dir) / "apply-report.json"
    progress.stop()
    print(render_apply(report, str(where)))
    return 0 if report.ok else 1


def _apply_into(project: Project, args: argparse.Namespace) -> int:
    from sglpatch.into import apply_into

    if len(args.pins) > 1:
        raise SglpatchError("--into takes at most one pin (default: the checkout's own sglang version)")
    done = apply_into(project, args.into, args.pins[0] if args.pins else None, allow_unavailable=args.allow_unavailable)
    print(f"{done.checkout}: the series for sglang {done.version} applied as {done.how}")
    for commit in done.commits:
        print(f"  {commit[:12]}")
    for path in done.files:
        print(f"  {path}")
    return 0


def _witness(project: Project, args: argparse.Namespace) -> int:
    import tempfile

    # The witnesses run on trees built in a scratch folder: nothing of the project changes (no
    # branch moves, no lock entry); apply is the command that records.
    with tempfile.TemporaryDirectory(prefix="sglpatch-witness-") as scratch:
        report = apply_series(
            project, args.pins, out_dir=Path(scratch), allow_unavailable=args.allow_unavailable, record=False
        )
    progress.stop()
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
        return 0
    for alias in rewrite.added:
        print(f"added {alias}")
    print(f"{rewrite.path}: {len(rewrite.added)} entries added; original kept in {rewrite.backup}")
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
    result = upstream_pr.export(project, args.patch, args.base, args.base_repo, args.out, changes, signoff=args.signoff)
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


def _patch_start(project: Project, args: argparse.Namespace) -> int:
    from sglpatch import authoring

    version = project.pins().select([args.pin])[0].version
    tree = authoring.start(project, version)
    print(f"{tree}: the series is applied on branch sglpatch")
    print("  commit your change there (git commit); amend or rebase the series' own commits to change them;")
    print(f"  then: sglpatch patch refresh {version}")
    return 0


def _patch_refresh(project: Project, args: argparse.Namespace) -> int:
    from sglpatch import authoring

    version = project.pins().select([args.pin])[0].version
    refreshed = authoring.refresh(project, version, args.rendition_of)
    for item in refreshed:
        print(f"{item.action:<14} {item.path.relative_to(project.root)}  {item.subject}")
    problems = authoring.problems_of(project, refreshed)
    for problem in problems:
        print(problem)
    if any(item.action != "unchanged" for item in refreshed):
        print(f"next: sglpatch check, then sglpatch apply {version} --update-lock, and commit patches/ and the lock")
    return 1 if problems else 0


def _image(project: Project, args: argparse.Namespace) -> int:
    from sglpatch.matrix import containers
    from sglpatch.matrix import rocm as rocm_tier
    from sglpatch.matrix.pin import prepare_pin

    version = project.pins().select([args.pin])[0].version
    client = containers.connect(args.docker_url)
    put = prepare_pin(project, version)
    options = rocm_tier.RocmOptions(base_image=args.image, docker_url=args.docker_url, gpu=False)
    with progress.step(f"image for sglang {version}") as shown:
        spec, image_id = rocm_tier.build_patched_image(client, put, options, shown.update)
    progress.stop()
    print(f"{spec.tag}  {image_id}")
    for key, value in sorted(spec.labels.items()):
        print(f"  {key}={value}")
    print(f"  checkout: {spec.checkout} (the series: {', '.join(name for name, _ in spec.patches) or 'nothing to apply'})")
    return 0


def _export(project: Project, args: argparse.Namespace) -> int:
    from sglpatch import authoring

    version = project.pins().select([args.pin])[0].version
    if args.quilt:
        folder = authoring.export_quilt(project, version, args.quilt)
        print(f"{folder}: quilt series for sglang {version} (QUILT_PATCHES={folder} quilt push -a on the pristine tree)")
    else:
        mbox = authoring.export_mbox(project, version, args.mbox)
        print(f"{mbox}: mbox for sglang {version} (git am {mbox} on the pristine tree)")
    return 0


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
    from sglpatch import matrix
    from sglpatch.matrix import records as results

    cell = matrix.Cell(args.tier, args.check, args.pin.removeprefix("v"), args.depth)
    if args.tier == "cpu":
        record = matrix.run_cpu_cell(project, cell, use_cache=not args.no_cache)
    else:
        from sglpatch.matrix import rocm as rocm_tier

        record = rocm_tier.run_rocm_cell(project, cell, _options_from(args))
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
    # Every part of a CPU cell can run on a CPU machine with the witnesses' toolchains, so one that
    # could not run fails the cell unless the user says otherwise; a ROCm cell without a GPU skips.
    strict = args.tier == "cpu" and not args.allow_unavailable
    if strict and record.outcome in (results.PARTIAL, results.SKIPPED):
        print("  a CPU cell must run every part (--allow-unavailable accepts a partial cell)")
    return 1 if results.failing(record, strict=strict) else 0


def _matrix_cells(project: Project, args: argparse.Namespace) -> int:
    from sglpatch import matrix

    tiers = tuple(args.tier) if args.tier else matrix.TIERS
    for cell in matrix.cells([pin.version for pin in project.pins().pins], tiers):
        print(f"{cell.tier}\t{cell.check}\t{cell.pin}\t{cell.depth or ''}")
    return 0


def _matrix_report(project: Project, args: argparse.Namespace) -> int:
    from sglpatch.matrix import records as results

    folder = args.records or project.build_dir / "matrix" / "records"
    table = results.render_markdown(results.read_records(folder))
    destination = args.out or project.build_dir / "matrix" / "matrix.md"
    destination.parent.mkdir(parents=True, exist_ok=True)
    destination.write_text(table)
    print(table)
    print(f"written to {destination}")
    return 0


def _matrix_job(project: Project, args: argparse.Namespace) -> int:
    import json as _json

    from sglpatch.matrix import records as results
    from sglpatch.matrix import rocm_job

    version = project.pins().select([args.pin.removeprefix("v")])[0].version
    result = rocm_job.run_job(project, version, rocm_job.items_for(args.event), _options_from(args), event=args.event)
    print(f"{result.job}: {result.outcome}; {len(result.servers)} server start(s)" + (f" ({result.reason})" if result.reason else ""))
    for server in result.servers:
        print(f"  server {server['launch']}: {', '.join(server['steps'])}")
    for record in result.records:
        print(f"  {record.outcome:<8} {record.cell_id}" + (f": {record.reason}" if record.reason else ""))
    for record in result.bench_records:
        print(f"  {record.outcome:<8} bench {record.workload} {record.variant}" + (f": {record.reason}" if record.reason else ""))
    print(f"  job record: {result.path}")
    if args.record:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(_json.dumps({"outcome": result.outcome, "reason": result.reason}))
    failed = any(results.failing(r) for r in result.records) or any(r.outcome == results.FAILED for r in result.bench_records)
    return 1 if failed else 0


def _matrix_plan(project: Project, args: argparse.Namespace) -> int:
    from sglpatch.matrix import plan, workflow

    if args.write_workflow:
        args.write_workflow.parent.mkdir(parents=True, exist_ok=True)
        args.write_workflow.write_text(workflow.workflow_yaml())
        print(f"workflow written to {args.write_workflow}")
        return 0
    changed = list(args.changed)
    if args.base:
        try:
            changed += plan.git_changed_files(project.root, args.base)
        except ValueError as exc:
            raise SglpatchError(str(exc)) from None
    jobs = plan.plan(project, args.event, changed_files=changed,
                     records_dir=args.records or project.build_dir / "matrix" / "records")
    print(plan.render(jobs, args.event))
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
