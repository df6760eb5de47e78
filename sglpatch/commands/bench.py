"""``sglpatch bench run|accuracy|tune-moe|report|compare``: the write-up's workloads on ROCm nodes."""

from __future__ import annotations

import json
from pathlib import Path

from sglpatch import exitcodes
from sglpatch.cli_options import add, keep_record, options_from, rocm_options, say


def register(sub) -> None:
    from sglpatch.bench.workloads import WORKLOADS

    parser = add(sub, "bench", None, "the bench: run a workload, the accuracy gate, MoE tuning, report, compare")
    actions = parser.add_subparsers(required=True, metavar="ACTION")
    run = add(actions, "run", run_bench, "measure a workload on a pin in its patched ROCm image")
    run.add_argument("workload", choices=WORKLOADS)
    run.add_argument("pin")
    run.add_argument("--pristine", action="store_true", help="the released image without the series (for compare)")
    run.add_argument("--record", type=Path, help="also write a summary here (nox reads it to report a skip)")
    rocm_options(run)
    gate = add(actions, "accuracy", run_accuracy, "GSM8K and accept length of the patched image, with sglang's AMD CI floors")
    gate.add_argument("pin")
    gate.add_argument("--record", type=Path, help="also write the record here")
    rocm_options(gate)
    tune = add(actions, "tune-moe", run_tune_moe, "aiter's MoE tuner for the shapes the serving bench found untuned")
    tune.add_argument("pin")
    rocm_options(tune)
    show = add(actions, "report", run_report, "render the bench table (and plots) from records")
    show.add_argument("--records", type=Path, help="folder of records (default: build/bench/records)")
    show.add_argument("--out", type=Path, help="where the markdown and plots go (default: build/bench/)")
    compare = add(actions, "compare", run_compare, "per-figure ratios B / A between two folders of bench records")
    compare.add_argument("a", type=Path, help="records A (e.g. the pristine image's)")
    compare.add_argument("b", type=Path, help="records B (e.g. the patched image's)")


def run_bench(project, args) -> int:
    from sglpatch.bench import on_rocm_node
    from sglpatch.matrix import records as results
    from sglpatch.plumbing.cache import write_atomically

    records = on_rocm_node.run_bench(project, args.pin.removeprefix("v"), args.workload, options_from(args), pristine=args.pristine)
    for record in records:
        say(args, f"bench {record.workload} on sglang {record.pin} ({record.variant}): {record.outcome}")
        for part in record.parts:
            say(args, f"  {part.outcome:<8} {part.name}: {part.detail}")
    say(args, f"  records: {on_rocm_node.bench_dir(project) / 'records'}  table: {on_rocm_node.bench_dir(project) / 'bench.md'}")
    failed = any(r.outcome == results.FAILED for r in records)
    if args.record:
        outcome = "skipped" if all(r.outcome == results.SKIPPED for r in records) else ("failed" if failed else "passed")
        reason = "; ".join(sorted({r.reason for r in records if r.reason}))
        write_atomically(args.record, json.dumps({"outcome": outcome, "reason": reason}))
    return exitcodes.FAILED if failed else exitcodes.OK


def run_accuracy(project, args) -> int:
    from sglpatch.bench import on_rocm_node
    from sglpatch.matrix import records as results

    record = on_rocm_node.run_accuracy(project, args.pin.removeprefix("v"), options_from(args))
    say(args, f"accuracy on sglang {record.pin}: {record.outcome}")
    for part in record.parts:
        say(args, f"  {part.outcome:<8} {part.name}: {part.detail}")
    keep_record(record, args.record)
    return exitcodes.FAILED if results.failing(record) else exitcodes.OK


def run_tune_moe(project, args) -> int:
    from sglpatch.bench import on_rocm_node

    written = on_rocm_node.run_tune_moe(project, args.pin.removeprefix("v"), options_from(args))
    say(args, f"tuned MoE config written to {written}; review and commit it (the profile names it)")
    return exitcodes.OK


def run_report(project, args) -> int:
    from sglpatch.bench import report
    from sglpatch.bench.records import read_bench_records
    from sglpatch.plumbing.cache import write_atomically

    out = args.out or project.build_dir / "bench"
    records = read_bench_records(args.records or project.build_dir / "bench" / "records")
    table = report.render_bench_markdown(records)
    write_atomically(out / "bench.md", table)
    plots = [report.plot_serving(r, out / f"{r.record_id}.png") for r in records
             if r.workload == "serving" and any(run.get("figures") for run in r.runs)]
    say(args, table)
    say(args, f"written to {out / 'bench.md'}" + (f" and {len(plots)} plot(s)" if plots else ""))
    return exitcodes.OK


def run_compare(project, args) -> int:
    from sglpatch.bench import compare
    from sglpatch.bench.records import read_bench_records

    say(args, compare.render(compare.compare(read_bench_records(args.a), read_bench_records(args.b))))
    return exitcodes.OK
