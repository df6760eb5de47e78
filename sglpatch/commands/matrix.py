"""``sglpatch matrix run|cells|report|plan``: the test matrix's cells, its table and its CI plan."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from sglpatch import exitcodes
from sglpatch.cli_options import add, keep_record, emit_json, jobs_flag, json_flag, options_from, pin_version, rocm_options, say, witness_mode
from sglpatch.plumbing.errors import SglpatchError


def register(sub) -> None:
    from sglpatch.matrix.cells import CHECKS, TIERS

    parser = add(sub, "matrix", None, "the test matrix: run a cell, list cells, render the table, plan CI")
    actions = parser.add_subparsers(required=True, metavar="ACTION")
    run = add(actions, "run", run_cell, "run one cell and write its record under build/matrix/records")
    run.add_argument("check", choices=list(CHECKS))
    run.add_argument("pin")
    run.add_argument("--depth", type=int, help="speculative depth (spec only): d steps, top-k 1, d+1 draft tokens")
    run.add_argument("--tier", choices=TIERS, default="cpu")
    run.add_argument("--record", type=Path, help="also write the record here (nox reads it to report a skip)")
    run.add_argument("--no-cache", action="store_true", help="cpu: run even if the cell's answer is cached")
    witness_mode(run)
    rocm_options(run, "rocm: ")
    every = add(actions, "run-all", run_all, "every CPU cell of pins in one run (the pins of a worker share its processes)")
    every.add_argument("pins", nargs="*", help="pin versions (default: all)")
    jobs_flag(every, "run whole pins")
    every.add_argument("--no-cache", action="store_true", help="run even the cells whose answer is cached")
    witness_mode(every)
    json_flag(every)
    cells = add(actions, "cells", run_cells, "list the matrix's cells")
    cells.add_argument("--tier", choices=TIERS, action="append", help="only this tier (repeatable)")
    json_flag(cells)
    report = add(actions, "report", run_report, "render the matrix table from records")
    report.add_argument("--records", type=Path, help="folder of records (default: build/matrix/records)")
    report.add_argument("--out", type=Path, help="also write the markdown here (default: build/matrix/matrix.md)")
    job = add(actions, "job", run_job,
              "a pin's ROCm CI job: the image built once, one server per launch configuration, the checks in sequence")
    job.add_argument("pin")
    job.add_argument("--event", choices=("pr", "nightly", "weekly"), default="pr",
                     help="which sessions: pr and nightly the matrix and the gate, weekly the bench")
    job.add_argument("--record", type=Path, help="also write the job's outcome here (nox reads it to report a skip)")
    rocm_options(job)
    plan = add(actions, "plan", run_plan, "the ROCm CI jobs for an event and their estimated node-hours")
    plan.add_argument("--event", choices=("pr", "nightly", "weekly"), default="pr")
    plan.add_argument("--base", help="pr: the base ref; the pins whose patch renditions changed since it")
    plan.add_argument("--changed", nargs="*", default=[], help="pr: changed files (instead of --base)")
    plan.add_argument("--records", type=Path, help="records with durations (default: build/matrix/records)")
    plan.add_argument("--write-workflow", type=Path, help="write the GitHub Actions workflow generated from the plan here")
    json_flag(plan)


def run_cell(project, args) -> int:
    from sglpatch.matrix import records as results
    from sglpatch.matrix.cells import Cell
    from sglpatch.matrix.cpu import run_cpu_cell

    cell = Cell(args.tier, args.check, args.pin.removeprefix("v"), args.depth)
    if args.tier == "cpu":
        record = run_cpu_cell(project, cell, use_cache=not args.no_cache)
    else:
        from sglpatch.rocm.job import run_rocm_cell

        record = run_rocm_cell(project, cell, options_from(args))
    say(args, f"{cell.label}: {record.outcome}{cached_mark(record)} in {record.seconds:.1f} s")
    for part in record.parts:
        say(args, f"  {part.outcome:<8} {part.name}: {part.detail}")
    for where in record.figures.get("replayed") or []:
        say(args, f"  replayed, not run now: {where}")
    if record.reason and not record.parts:
        say(args, f"  reason: {record.reason}")
    say(args, f"  record: {project.build_dir / 'matrix' / 'records' / (record.cell_id + '.json')}  log: {record.log}")
    keep_record(record, args.record)
    if record.outcome == results.FAILED:
        return exitcodes.FAILED
    # Every part of a CPU cell can run on a CPU machine with the witnesses' toolchains, so one that
    # could not run fails the cell unless the user says otherwise; a ROCm cell without a GPU skips.
    if args.tier == "cpu" and not args.allow_unavailable and record.outcome in (results.PARTIAL, results.SKIPPED):
        say(args, "  a CPU cell must run every part (--allow-unavailable accepts a partial cell)")
        return exitcodes.UNAVAILABLE
    return exitcodes.OK


def run_all(project, args) -> int:
    from sglpatch.matrix import records as results
    from sglpatch.matrix.cpu import run_cpu_tier

    records = run_cpu_tier(project, args.pins, use_cache=not args.no_cache, jobs=args.jobs)
    for record in records:
        say(args, f"{record.outcome:<8} {record.cell_id}" + cached_mark(record)
            + (f": {record.reason}" if record.reason else ""))
    outcomes = [record.outcome for record in records]
    say(args, f"{len(records)} CPU cells: " + ", ".join(f"{outcomes.count(o)} {o}" for o in results.OUTCOMES if o in outcomes))
    emit_json(args, [asdict(record) for record in records])
    if results.FAILED in outcomes:
        return exitcodes.FAILED
    if not args.allow_unavailable and (results.PARTIAL in outcomes or results.SKIPPED in outcomes):
        say(args, "a CPU cell must run every part (--allow-unavailable accepts partial cells)")
        return exitcodes.UNAVAILABLE
    return exitcodes.OK


def cached_mark(record) -> str:
    """`` (cached)`` for a kept record, `` (cached: N parts replayed)`` for one some of whose parts
    gave back kept answers; nothing for a cell that ran every part now."""
    replayed = (record.figures or {}).get("replayed") or []
    if not record.cached:
        return ""
    return f" (cached: {len(replayed)} answer(s) replayed)" if replayed else " (cached)"


def run_cells(project, args) -> int:
    from sglpatch.matrix.cells import TIERS, cells as matrix_cells

    tiers = tuple(args.tier) if args.tier else TIERS
    cells = matrix_cells([pin.version for pin in project.pins().pins], tiers)
    for cell in cells:
        say(args, f"{cell.tier}\t{cell.check}\t{cell.pin}\t{cell.depth or ''}")
    emit_json(args, [asdict(cell) for cell in cells])
    return exitcodes.OK


def run_report(project, args) -> int:
    from sglpatch.matrix import records as results
    from sglpatch.matrix.table import render_markdown
    from sglpatch.plumbing.cache import write_atomically

    folder = args.records or project.build_dir / "matrix" / "records"
    table = render_markdown(results.read_records(folder))
    destination = args.out or project.build_dir / "matrix" / "matrix.md"
    write_atomically(destination, table)
    say(args, table)
    say(args, f"written to {destination}")
    return exitcodes.OK


def run_job(project, args) -> int:
    import json

    from sglpatch.matrix import records as results
    from sglpatch.matrix.job_plan import items_for
    from sglpatch.plumbing.cache import write_atomically
    from sglpatch.rocm.job import run_job

    version = pin_version(project, args.pin)
    result = run_job(project, version, items_for(args.event), options_from(args), event=args.event)
    say(args, f"{result.job}: {result.outcome}; {len(result.servers)} server start(s)" + (f" ({result.reason})" if result.reason else ""))
    for server in result.servers:
        say(args, f"  server {server['launch']}: {', '.join(server['steps'])}")
    for record in result.records:
        say(args, f"  {record.outcome:<8} {record.cell_id}" + (f": {record.reason}" if record.reason else ""))
    for record in result.bench_records:
        say(args, f"  {record.outcome:<8} bench {record.workload} {record.variant}" + (f": {record.reason}" if record.reason else ""))
    say(args, f"  job record: {result.path}")
    if args.record:
        write_atomically(args.record, json.dumps({"outcome": result.outcome, "reason": result.reason}))
    failed = any(results.failing(r) for r in result.records) or any(r.outcome == results.FAILED for r in result.bench_records)
    return exitcodes.FAILED if failed else exitcodes.OK


def run_plan(project, args) -> int:
    from sglpatch.matrix import plan, workflow
    from sglpatch.plumbing.cache import write_atomically

    if args.write_workflow:
        write_atomically(args.write_workflow, workflow.workflow_yaml())
        say(args, f"workflow written to {args.write_workflow}")
        return exitcodes.OK
    changed = list(args.changed)
    if args.base:
        try:
            changed += plan.git_changed_files(project.root, args.base)
        except ValueError as exc:
            raise SglpatchError(str(exc)) from None
    jobs = plan.plan(project, args.event, changed_files=changed,
                     records_dir=args.records or project.build_dir / "matrix" / "records")
    say(args, plan.render(jobs, args.event))
    emit_json(args, plan.to_json(jobs, args.event))
    return exitcodes.OK
