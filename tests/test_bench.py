"""The bench's host side on its own: percentiles, knee, scanners, receipts, table, plot, compare,
the power sampler against a stand-in amd-smi. Fast: no pin, no client (tests/test_bench_client.py
runs the pins' own client)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from sglpatch.bench import compare, report, scan
from sglpatch.bench.client import bench_client
from sglpatch.bench.collect import collect
from sglpatch.bench.records import BenchRecord, read_bench_records, write_bench_record
from sglpatch.bench.workloads import Serving, SingleStream
from sglpatch.errors import SglpatchError
from sglpatch.matrix.records import PARTIAL, PASSED
from sglpatch.rocm_checks import bench_metrics, power

# aiter's own format (aiter/fused_moe.py): the tuple of the shape it has no tuned entry for.
UNTUNED = ("[aiter] [fused_moe] using 2stage default for ('gfx950', 256, 32, 6144, 512, 257, 9, 'ActivationType.Silu',"
           " 'torch.bfloat16', 'torch.float4_e2m1fn_x2', 'torch.float4_e2m1fn_x2', 'QuantType.per_1x32', True, False)")
# Patch 0003's warning, as ServerArgs logs it through sglang's logger.
INERT = ("[2026-12-01 10:00:00] WARNING server_args.py:1234: --enable-aiter-allreduce-fusion has no effect: "
         "--disable-custom-all-reduce is set. The unfused all-reduce is used.")


def stand_in_amd_smi(folder: Path, watts: list[float]) -> Path:
    """A stand-in for the amd-smi CLI (a test double, not AMD's tool): prints one SOCKET_POWER line
    per GPU in amd-smi metric's layout."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "amd-smi"
    lines = "".join(f'echo "GPU: {i}"\necho "    POWER:"\necho "        SOCKET_POWER: {w} W"\n' for i, w in enumerate(watts))
    script.write_text(f'#!/bin/sh\n# stand-in for amd-smi (test double)\n[ "$1 $2" = "metric --power" ] || exit 2\n{lines}')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return folder


def test_percentiles_interpolate_between_order_statistics_as_a_hand_computation():
    values = [0.9, 0.1, 0.5, 0.3, 0.7, 0.2, 0.4, 0.8, 0.6, 1.0]
    s = sorted(values)
    assert bench_metrics.percentile(values, 50) == pytest.approx((s[4] + s[5]) / 2)
    # position (10 - 1) * 0.95 = 8.55: s[8] plus 0.55 of the way to s[9]
    assert bench_metrics.percentile(values, 95) == pytest.approx(s[8] + 0.55 * (s[9] - s[8]))
    assert bench_metrics.percentile([], 95) is None


def _run(rate, ttfts, errors=None, cached=None):
    n = len(ttfts)
    run = {"request_rate": rate, "duration": 10.0, "ttfts": ttfts, "itls": [[0.01] * 9] * n,
           "input_lens": [100] * n, "output_lens": [10] * n, "errors": errors or [""] * n}
    if cached is not None:
        run["cached_tokens"] = cached
    return run


def test_run_figures_count_only_successful_requests_and_the_knee_needs_every_one():
    ok = bench_metrics.run_figures(_run(1.0, [0.1, 0.2, 0.3, 0.4], cached=[0, 60, 60, 60]))
    assert ok["success"] == 1.0 and ok["output_tok_s"] == 4.0 and ok["cache_hit_rate"] == 0.45
    failed = bench_metrics.run_figures(_run(2.0, [0.1, 0.2, 0.0, 0.3], errors=["", "", "timeout", ""]))
    assert failed["completed"] == 3 and failed["success"] == 0.75 and failed["ttft_p50_s"] == 0.2
    slow = bench_metrics.run_figures(_run(3.0, [4.0, 5.0, 6.0, 7.0]))
    assert bench_metrics.knee([ok, failed, slow], ttft_p95_s=5.0) == 1.0
    assert bench_metrics.knee([slow], ttft_p95_s=5.0) is None


def test_single_stream_speed_counts_tokens_after_the_first_and_end_to_end():
    run = {"request_rate": float("inf"), "duration": 3.0, "ttfts": [1.0, 1.0], "itls": [[0.01] * 99, [0.02] * 99],
           "input_lens": [10000, 10000], "output_lens": [100, 100], "errors": ["", ""]}
    figures = bench_metrics.decode_figures(run)
    assert figures["output_tok_s_after_first"] == pytest.approx((99 / 0.99 + 99 / 1.98) / 2)
    assert figures["output_tok_s_end_to_end"] == pytest.approx((100 / 1.99 + 100 / 2.98) / 2)


def test_the_hit_rate_from_a_server_log_counts_only_batches_after_the_last_flush():
    log = "\n".join([
        "Prefill batch, #new-seq: 1, #new-token: 100, #cached-token: 0, token usage: 0.00, ",
        "Cache flushed successfully!",
        "Prefill batch, #new-seq: 1, #new-token: 100, #cached-token: 0, token usage: 0.01, #running-req: 0, ",
        "Prefill batch, #new-seq: 2, #new-token: 80, #cached-token: 120, token usage: 0.02, #running-req: 1, ",
    ])
    assert bench_metrics.log_cache_hit_rate(log) == (120 / 300, 2)


def test_the_scanners_name_untuned_moe_shapes_and_the_inert_fusion_on_real_log_lines():
    log = "\n".join(["[aiter] import [module_moe_ck2stages_fp4x2_fp4x2_preshuffle_on_b16_silu_per_1x32]", UNTUNED,
                     UNTUNED, INERT, "Prefill batch, #new-seq: 1, #new-token: 10, #cached-token: 0, "])
    found = scan.scan(log)
    shape = ("'gfx950', 256, 32, 6144, 512, 257, 9, 'ActivationType.Silu', 'torch.bfloat16', 'torch.float4_e2m1fn_x2',"
             " 'torch.float4_e2m1fn_x2', 'QuantType.per_1x32', True, False")
    assert found == {"untuned_moe_shapes": {shape: 2}, "inert_fusion": {"--disable-custom-all-reduce is set": 1}}
    lines = scan.describe(found)
    assert any("untuned aiter MoE shape" in line and "6144" in line for line in lines)
    assert any("fusion inert: --disable-custom-all-reduce is set" in line for line in lines)
    assert scan.scan("INFO all good") == {"untuned_moe_shapes": {}, "inert_fusion": {}}


def test_the_sampler_reads_every_gpus_socket_power_from_a_stand_in_amd_smi(tmp_path, monkeypatch):
    folder = stand_in_amd_smi(tmp_path / "bin", [700.0, 710.5, 690, 700, 705, 695, 700, 699.5])
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    with power.PowerSampler(interval_s=0.05) as sampler:
        import time

        time.sleep(0.3)
    summary = sampler.summary()
    assert summary["source"] == f"{folder / 'amd-smi'} metric --power"
    assert summary["gpus"] == 8 and summary["samples"] >= 2
    assert summary["node_w_mean"] == pytest.approx(5600.0)


def test_without_amdsmi_or_amd_smi_power_is_unavailable_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with power.PowerSampler(interval_s=0.05) as sampler:
        pass
    summary = sampler.summary()
    assert summary["samples"] == 0 and "amd-smi" in summary["error"] and "amdsmi" in summary["error"]


def _template(**kwargs) -> BenchRecord:
    fields = dict(workload="serving", pin="0.5.23", variant="as-shipped", series_version="3", series_hash="ab" * 32,
                  profile="glm-5.2-mxfp4-mi355x-tp4dp2", profile_version=1,
                  quantization="mxfp4 (AMD Quark; MTP shared expert kept in bf16)",
                  environment={"gpu": "AMD Instinct MI355X", "gpu_count": 8, "rocm_version": "7.2.0"})
    return BenchRecord(**{**fields, **kwargs})


def _measured(tmp_path: Path, rates_tok_s_p95: list[tuple[float, float, float]], watts=5600.0) -> dict:
    log = tmp_path / "server.log"
    log.write_text(UNTUNED + "\n" + INERT + "\n")
    runs = []
    for rate, tok_s, p95 in rates_tok_s_p95:
        figures = {"request_rate": rate, "output_tok_s": tok_s, "ttft_p50_s": p95 / 2, "ttft_p95_s": p95,
                   "success": 1.0, "completed": 10, "requests": 10, "cache_hit_rate": 0.56,
                   "cache_hit_source": "client --cache-report (per-request cached tokens)"}
        runs.append({"rate": rate, "command": f"python3 -m sglang.benchmark.serving --request-rate {rate}",
                     "output_file": str(tmp_path / f"rate-{rate}.jsonl"), "exit": 0, "figures": figures,
                     "power": {"source": "amd-smi metric --power", "node_w_mean": watts, "samples": 30}})
    return {"argv": ["--tp-size", "4", "--dp-size", "2"], "env": {"SGLANG_USE_AITER": "1"}, "healthy_s": 300.0,
            "server_log": str(log), "runs": runs}


def test_a_record_holds_the_receipt_the_knee_power_per_token_and_the_findings(tmp_path):
    measured = _measured(tmp_path, [(0.5, 449, 0.6), (2.0, 1944, 1.05), (2.4, 2626, 2.22), (2.65, 2700, 6.5)])
    record = collect(_template(), "as-shipped", measured)
    assert record.outcome == PASSED, record.reason
    assert record.knee_rps == 2.4
    assert record.runs[2]["figures"]["tok_s_per_w"] == pytest.approx(2626 / 5600)
    assert record.findings["inert_fusion"] == {"--disable-custom-all-reduce is set": 1}
    assert record.launch == ["--tp-size", "4", "--dp-size", "2"]
    path = write_bench_record(record, tmp_path / "records")
    (tmp_path / "records" / "unrelated.json").write_text(json.dumps({"tier": "cpu"}))
    again = read_bench_records(tmp_path)
    assert [r.record_id for r in again] == [record.record_id] and path.name == f"{record.record_id}.json"
    assert again[0].runs[0]["command"].startswith("python3 -m sglang.benchmark.serving")


def test_power_that_could_not_be_sampled_leaves_the_record_partial_never_passed(tmp_path):
    measured = _measured(tmp_path, [(0.5, 449, 0.6)], watts=None)
    measured["runs"][0]["power"] = {"samples": 0, "error": "neither the amdsmi library nor the amd-smi CLI is installed"}
    record = collect(_template(), "as-shipped", measured)
    assert record.outcome == PARTIAL and "amd-smi" in record.reason
    assert "tok_s_per_w" not in record.runs[0]["figures"]


def test_the_table_has_the_write_ups_shape_with_power_and_the_plot_is_a_png(tmp_path):
    record = collect(_template(), "as-shipped", _measured(tmp_path, [(0.5, 449, 0.6), (2.4, 2626, 2.22), (2.65, 2700, 6.5)]))
    table = report.render_bench_markdown([record])
    assert "| sustained RPS | tok/s/node | TTFT p50 / p95 | success | cache hit | W/node | tok/s/W |" in table
    assert "| 2.4 (knee) | 2626 | 1.11 s / 2.22 s | 100% | 56% | 5600 | 0.469 |" in table
    assert "glm-5.2-mxfp4-mi355x-tp4dp2 v1" in table and "MXFP4".lower() in table.lower() and "sglang 0.5.23" in table
    assert "untuned aiter MoE shape" in table and "fusion inert" in table
    png = report.plot_serving(record, tmp_path / "serving.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10000


def test_the_plot_without_matplotlib_installed_is_a_one_line_error_naming_the_extra(tmp_path, monkeypatch):
    record = collect(_template(), "as-shipped", _measured(tmp_path, [(0.5, 449, 0.6)]))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an install without the extra gives
    with pytest.raises(SglpatchError, match=r"serving\.png: the bench plot needs matplotlib: pip install 'sglpatch\[bench\]'"):
        report.plot_serving(record, tmp_path / "serving.png")
    assert not (tmp_path / "serving.png").exists()


def test_compare_prints_per_figure_ratios_between_pristine_and_patched(tmp_path):
    pristine = collect(_template(pristine=True), "as-shipped", _measured(tmp_path, [(2.0, 1000, 4.0), (2.4, 1100, 8.0)]))
    patched = collect(_template(), "as-shipped", _measured(tmp_path, [(2.0, 1944, 1.05), (2.4, 2626, 2.22)]))
    rows = compare.compare([pristine], [patched])
    by = {(str(r["rate"]), r["figure"]): r for r in rows}
    assert by[("2.4", "output_tok_s")]["ratio"] == pytest.approx(2626 / 1100)
    assert by[("2.0", "ttft_p95_s")]["ratio"] == pytest.approx(1.05 / 4.0)
    assert by[("knee", "knee_rps")]["a"] == 2.0 and by[("knee", "knee_rps")]["b"] == 2.4
    assert "| serving | 0.5.23 | as-shipped | 2.4 | output_tok_s | 1100 | 2626 | 2.387 |" in compare.render(rows)


def test_the_workloads_are_the_write_ups_as_the_clients_own_arguments(tmp_path):
    new = tmp_path / "new" / "python" / "sglang" / "benchmark"
    new.mkdir(parents=True)
    (new / "serving.py").write_text('parser.add_argument("--dataset-name")\nparser.add_argument("--cache-report")\n'
                                    'group.add_argument(\n    "--gsp-range-ratio")\n')
    client = bench_client(tmp_path / "new")
    assert client.module == "sglang.benchmark.serving" and client.cache_report
    serving = Serving()
    args = serving.args(client, 2.4)
    pairs = dict(zip(args, args[1:]))
    assert pairs["--gsp-system-prompt-len"] == "12000" and pairs["--gsp-question-len"] == "8000"
    assert pairs["--gsp-output-len"] == "1000" and pairs["--gsp-range-ratio"] == "1.0"
    assert int(pairs["--num-prompts"]) >= 2.4 * serving.seconds_per_rate and int(pairs["--num-prompts"]) % 16 == 0
    assert {"--output-details", "--flush-cache", "--cache-report"} <= set(args)
    assert serving.expected_hit_rate() == pytest.approx(0.6 * 15 / 16)
    listed, extend = serving.runs(client)
    assert [r["rate"] for r in listed] == [0.5, 1.0, 1.5, 2.0, 2.25, 2.4] and extend[0]["rate"] == 2.65
    single = dict(zip(SingleStream().args(client), SingleStream().args(client)[1:]))
    assert single["--dataset-name"] == "random-ids" and single["--max-concurrency"] == "1"
    assert single["--random-input-len"] == "10000" and single["--random-output-len"] == "1500"
