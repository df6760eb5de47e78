"""The bench's door on a ROCm node: the patched (or pristine) image, one container per workload,
the records, the table and the plot. Where the ROCm tier cannot run (no docker engine, no
/dev/kfd) every record says skipped, with the reason.

    bench(rocm, PIN, serving)        TP4 x DP2 profile, the write-up's rate sweep to the knee
    bench(rocm, PIN, single-stream)  TP8 profile as shipped and with the custom all-reduce on
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from sglpatch.apply.pin_under_test import prepare_pin
from sglpatch.bench import accuracy, report
from sglpatch.bench.client import bench_client
from sglpatch.bench.collect import collect, config_hash
from sglpatch.bench.records import BenchRecord, read_bench_records, write_bench_record
from sglpatch.bench.workloads import workload as workload_named
from sglpatch.matrix.records import FAILED, SKIPPED, CellRecord, Part, combine, last_json, matrix_dir, write_record
from sglpatch.plumbing.errors import SglpatchError, Unavailable
from sglpatch.plumbing.project import Project
from sglpatch.rocm import containers
from sglpatch.rocm.constants import CHECKS_INSIDE, HF_INSIDE, LABEL_CELL, OUT_INSIDE, STATE_INSIDE
from sglpatch.rocm.image import build_image, patched_image
from sglpatch.rocm.options import RocmOptions, device_stamp, unavailable_reason
from sglpatch.rocm.profiles import PROFILES, launch_env, variants
from sglpatch.serving.profile import load_profile


def bench_dir(project: Project) -> Path:
    return project.build_dir / "bench"


def run_bench(project: Project, version: str, workload: str, options: RocmOptions | None = None, *,
              pristine: bool = False, on_log=print) -> list[BenchRecord]:
    options = options or RocmOptions()
    plan = workload_named(workload)
    profile = load_profile(PROFILES[workload])
    model = options.model or os.environ.get("SGLPATCH_MODEL") or profile.model
    series = project.series()
    template = BenchRecord(workload=workload, pin=version, variant="as-shipped", series_version=series.version,
                           series_hash=series.digest(), profile=profile.name, profile_version=profile.version,
                           quantization=profile.quantization, pristine=pristine, model=model,
                           model_config_hash=config_hash(Path(model)), device=device_stamp(options))
    out = bench_dir(project)
    reason, client = unavailable_reason(options)
    if reason:
        return [_write_skip(template, name, reason, out) for name in variants(profile)]
    raw = out / "raw" / version / (workload + ("-pristine" if pristine else ""))
    raw.mkdir(parents=True, exist_ok=True)
    records = []
    try:
        put = prepare_pin(project, version)
        spec = patched_image(put, options)
        if pristine:
            spec = dataclasses.replace(spec, patches=())
        on_log(f"# building {spec.tag}{' (pristine)' if pristine else ''} FROM {spec.base_image}")
        digest = build_image(client, spec, on_log)
        template = dataclasses.replace(template, image_digest=digest, base_image=spec.base_image)
        bench = bench_client(put.tree_path)
        env, mounts = launch_env(profile)
        listed, extend = plan.runs(bench, model)
        config = {
            "out": OUT_INSIDE, "timeout": options.server_timeout, "run_timeout": 4 * 3600, "power_interval_s": 1.0,
            "ttft_p95_s": getattr(plan, "ttft_p95_s", 5.0),
            "client": {"prefix": ["python3", "-m"], "module": bench.module},
            "variants": [{"name": name, "argv": profile.variant(name).server_args(model), "env": env}
                         for name in variants(profile)],
            "runs": listed, "extend": extend,
        }
        mounts.update({str(raw): (OUT_INSIDE, "rw"), str(options.hf_cache): (HF_INSIDE, "rw")})
        if Path(model).is_absolute():
            mounts[model] = (model, "ro")
        labels = {LABEL_CELL: f"bench-{workload}-{version}", **spec.labels}
        run = containers.run_check(client, digest, ["python3", f"{CHECKS_INSIDE}/bench_run.py", json.dumps(config)],
                                   labels, containers.RunOptions(gpu=options.gpu, mounts=mounts, network=options.network,
                                                                 timeout=options.cell_timeout), on_log)
        (raw / "container.log").write_text(run.log)
        measured = last_json(run.log)
        if measured is None:
            raise SglpatchError(f"bench_run printed no figures (exit {run.exit_code}, timed out: {run.timed_out}): {run.log.strip()[-400:]}")
        template.environment = measured.get("environment", {})
        for name in variants(profile):
            entry = _to_host(measured["variants"].get(name, {"error": "not measured"}), raw)
            records.append(collect(template, name, entry, ttft_p95_s=config["ttft_p95_s"]))
    except SglpatchError as exc:
        for name in variants(profile):
            record = dataclasses.replace(template, variant=name, parts=[Part(f"bench {workload} in the image", FAILED, str(exc)[:1000])])
            record.settle()
            records.append(record)
    finally:
        containers.remove_ours(client, {LABEL_CELL: f"bench-{workload}-{version}"})
    for record in records:
        write_bench_record(record, out / "records")
    render(project, records)
    return records


def _to_host(entry: dict, raw: Path) -> dict:
    """bench_run's paths are the container's: the same files under ``raw`` here."""
    text = json.dumps(entry).replace(f'"{OUT_INSIDE}/', f'"{raw}/')
    return json.loads(text)


def _write_skip(template: BenchRecord, variant: str, reason: str, out: Path) -> BenchRecord:
    record = dataclasses.replace(template, variant=variant, parts=[Part(f"bench {template.workload} in a patched ROCm container", SKIPPED, reason)])
    record.settle()
    write_bench_record(record, out / "records")
    return record


def render(project: Project, records: list[BenchRecord]) -> list[Path]:
    """The table (build/bench/bench.md, all records so far) and one plot per serving record."""
    out = bench_dir(project)
    table = out / "bench.md"
    table.write_text(report.render_bench_markdown(read_bench_records(out / "records")))
    written = [table]
    for record in records:
        if record.workload == "serving" and any(r.get("figures") for r in record.runs):
            written.append(report.plot_serving(record, out / f"{record.record_id}.png"))
    return written


def run_accuracy(project: Project, version: str, options: RocmOptions | None = None, on_log=print):
    """accuracy(rocm, PIN): the gate's record (a matrix record of check "accuracy")."""
    options = options or RocmOptions()
    profile = load_profile(PROFILES["single-stream"])  # MTP 5/1/6 as sglang's AMD CI runs it
    model = options.model or os.environ.get("SGLPATCH_MODEL") or profile.model
    series = project.series()
    record = CellRecord("rocm", "accuracy", version, None, series.version, series.digest(), SKIPPED,
                        device=device_stamp(options))
    started = time.monotonic()
    out = matrix_dir(project)
    reason, client = unavailable_reason(options)
    if reason:
        record.parts.append(Part("accuracy in a patched ROCm container", SKIPPED, reason))
    else:
        try:
            put = prepare_pin(project, version)
            spec = patched_image(put, options)
            record.image_digest = build_image(client, spec, on_log)
            record.tree = put.patched_tree
            env, mounts = launch_env(profile)
            state = out / "rocm-state" / version
            state.mkdir(parents=True, exist_ok=True)
            mounts.update({str(state): (STATE_INSIDE, "rw"), str(options.hf_cache): (HF_INSIDE, "rw")})
            if Path(model).is_absolute():
                mounts[model] = (model, "ro")
            config = {"argv": profile.server_args(model), "env": env, "timeout": options.server_timeout,
                      "state": STATE_INSIDE, "questions": accuracy.QUESTIONS, "shots": accuracy.SHOTS}
            run = containers.run_check(client, record.image_digest,
                                       ["python3", f"{CHECKS_INSIDE}/accuracy_check.py", json.dumps(config)],
                                       {LABEL_CELL: record.cell_id, **spec.labels},
                                       containers.RunOptions(gpu=options.gpu, mounts=mounts, network=options.network,
                                                             timeout=options.cell_timeout, env=env), on_log)
            figures = last_json(run.log)
            if figures is None:
                record.parts.append(Part("accuracy in the patched image", FAILED, f"exit {run.exit_code}, no figures: {run.log.strip()[-400:]}"))
            else:
                record.figures.update(figures)
                record.parts += accuracy.judge(figures)
        except SglpatchError as exc:
            record.parts.append(Part("accuracy in a patched ROCm container", FAILED, str(exc)[:1000]))
        finally:
            containers.remove_ours(client, {LABEL_CELL: record.cell_id})

    record.outcome, record.reason = combine(record.parts)
    record.seconds = round(time.monotonic() - started, 2)
    write_record(record, out / "records")
    return record


def untuned_rows(project: Project, version: str) -> list[list[str]]:
    """The MoE shapes aiter logged as untuned in this pin's serving records, as rows of aiter's
    untuned CSV (the log's tuple less its first two fields, the GPU and its CU count)."""
    rows = []
    for record in read_bench_records(bench_dir(project) / "records"):
        if record.pin != version or record.workload != "serving":
            continue
        for shape in record.findings.get("untuned_moe_shapes", {}):
            fields = [field.strip().strip("'") for field in shape.split(",")]
            if len(fields) == 14 and fields[2:] not in rows:
                rows.append(fields[2:])
    return rows


def run_tune_moe(project: Project, version: str, options: RocmOptions | None = None, on_log=print) -> Path:
    """tune-moe(rocm, PIN): aiter's tuner for the shapes the serving bench found untuned, in the
    patched image; writes the profile's tuned MoE config file. Refuses without such shapes."""
    options = options or RocmOptions()
    profile = load_profile(PROFILES["serving"])
    rows = untuned_rows(project, version)
    if not rows:
        raise SglpatchError(f"no untuned MoE shape in the serving records of {version}: run bench(rocm, {version}, serving) first")
    reason, client = unavailable_reason(options)
    if reason:
        raise Unavailable(reason)
    target = profile.path.parent / profile.tuned_moe_config
    work = bench_dir(project) / "tune-moe" / version
    work.mkdir(parents=True, exist_ok=True)
    put = prepare_pin(project, version)
    spec = patched_image(put, options)
    digest = build_image(client, spec, on_log)
    config = {"rows": rows, "out": "/sglpatch-tune/tuned_fmoe.csv", "work": "/sglpatch-tune"}
    run = containers.run_check(client, digest, ["python3", f"{CHECKS_INSIDE}/tune_moe.py", json.dumps(config)],
                               {LABEL_CELL: f"tune-moe-{version}", **spec.labels},
                               containers.RunOptions(gpu=options.gpu, mounts={str(work): ("/sglpatch-tune", "rw")},
                                                     network=options.network, timeout=options.cell_timeout), on_log)
    result = last_json(run.log) or {}
    tuned = work / "tuned_fmoe.csv"
    if run.exit_code != 0 or not tuned.is_file():
        raise SglpatchError(f"aiter's tuner did not write {tuned}: {result.get('error') or run.log.strip()[-400:]}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(tuned.read_text())
    return target
