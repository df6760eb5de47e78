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
from sglpatch.matrix.records import PARTIAL, PASSED
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.rocm.checks import bench_metrics, bench_run, power

# aiter's own format (aiter/fused_moe.py): the tuple of the shape it has no tuned entry for.
UNTUNED = ("[aiter] [fused_moe] using 2stage default for ('gfx950', 256, 32, 6144, 512, 257, 9, 'ActivationType.Silu',"
           " 'torch.bfloat16', 'torch.float4_e2m1fn_x2', 'torch.float4_e2m1fn_x2', 'QuantType.per_1x32', True, False)")
# Patch 0003's warning, as ServerArgs logs it through sglang's logger.
INERT = ("[2026-12-01 10:00:00] WARNING server_args.py:1234: --enable-aiter-allreduce-fusion has no effect: "
         "--disable-custom-all-reduce is set. The all-reduce and the RMSNorm run unfused.")


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
    assert bench_metrics.knee([ok, failed, slow], ttft_p95_s=5.0) is ok
    assert bench_metrics.knee([slow], ttft_p95_s=5.0) is None


def test_sustained_rps_is_the_achieved_rate_completed_over_measured_seconds_with_the_requested_beside_it():
    # 20 requests asked for at 2.0/s; 2 failed; the measured duration (arrivals, then the queue
    # draining) was 12 s: 18 completed / 12 s = 1.5/s achieved.
    run = {**_run(2.0, [0.5] * 20, errors=[""] * 18 + ["timeout", "timeout"]), "duration": 12.0}
    figures = bench_metrics.run_figures(run)
    assert figures["requested_rps"] == 2.0
    assert figures["achieved_rps"] == pytest.approx(18 / 12)


def test_the_knee_is_the_highest_achieved_rate_that_meets_the_rule_not_the_highest_requested():
    def figures(requested, achieved, p95):
        return {"requested_rps": requested, "achieved_rps": achieved, "ttft_p95_s": p95, "success": 1.0}

    # Asked for 2.65/s the server completed only 2.05/s within the limit; asked for 2.4/s it
    # completed 2.1/s: the knee is 2.1 achieved (asked 2.4), though 2.65 also met the rule.
    runs = [figures(2.0, 1.9, 1.0), figures(2.4, 2.1, 2.2), figures(2.65, 2.05, 4.9), figures(2.9, 2.2, 6.5)]
    knee = bench_metrics.knee(runs, ttft_p95_s=5.0)
    assert (knee["achieved_rps"], knee["requested_rps"]) == (2.1, 2.4)
    record = collect(_template(), "as-shipped", {"healthy_s": 1.0, "runs": [
        {"rate": f["requested_rps"], "exit": 0, "figures": {**f, "output_tok_s": 1000.0, "ttft_p50_s": 0.5, "completed": 10,
                                                             "requests": 10}, "power": {}} for f in runs]})
    assert (record.knee_achieved_rps, record.knee_requested_rps) == (2.1, 2.4)


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
    assert summary["gpu_sockets_w_mean"] == pytest.approx(5600.0)
    assert "node_w_mean" not in summary and "not measured" in summary["node_error"]


def test_power_counts_only_the_samples_inside_the_measured_window_as_a_hand_computation():
    # Two GPUs sampled once a second over the whole client process: dataset generation and
    # warm-up (t 100-102), the measured window (t 103-106), the metrics and the exit (t 107).
    trace = [(100.0, [90.0, 110.0]), (101.0, [400.0, 400.0]), (102.0, [95.0, 105.0]),
             (103.0, [700.0, 700.0]), (104.0, [710.0, 690.0]), (105.0, [720.0, 700.0]), (106.0, [690.0, 690.0]),
             (107.0, [100.0, 100.0])]
    node = [(100.5, 3000.0), (103.5, 5000.0), (105.5, 5200.0), (107.5, 3100.0)]
    summary = power.summarize(trace, node, (103.0, 106.0), source="stand-in", node_source="ipmitool dcmi power reading")
    # inside: 1400, 1400, 1420, 1380 W of GPU sockets; outside (200, 800, 200, 200) must not count
    assert summary["samples"] == 4 and summary["samples_taken"] == 8
    assert summary["gpu_sockets_w_mean"] == pytest.approx((1400 + 1400 + 1420 + 1380) / 4)
    assert summary["gpu_sockets_w_max"] == 1420 and summary["gpu_w_mean"] == pytest.approx(1400 / 2)
    assert summary["node_w_mean"] == pytest.approx((5000 + 5200) / 2) and summary["node_samples"] == 2
    assert summary["window"] == {"start": 103.0, "end": 106.0, "seconds": 3.0}
    # The whole process's mean, what was measured before, is not what is reported.
    assert summary["gpu_sockets_w_mean"] != pytest.approx(sum(sum(w) for _, w in trace) / len(trace))
    empty = power.summarize(trace, [], (200.0, 210.0))
    assert "gpu_sockets_w_mean" not in empty and "no sample inside the measured window (8 taken outside it)" in empty["error"]
    assert "not measured" in empty["node_error"]


def test_the_measured_window_starts_after_the_clients_warm_up_pause_else_ends_at_its_output():
    # The client said its warm-up was done at t=50; it pauses 1 s, then runs for its 120 s
    # duration; it wrote its output at t=171.4 (after computing its metrics).
    assert bench_run.measured_window(120.0, 171.4, 50.0)[:2] == (51.0, 171.0)
    # No warm-up line seen: the window ends when the output was written.
    assert bench_run.measured_window(120.0, 171.4, None)[:2] == (pytest.approx(51.4), 171.4)
    # A warm-up anchor that would end after the output was written cannot be right.
    assert bench_run.measured_window(120.0, 171.4, 60.0)[:2] == (pytest.approx(51.4), 171.4)


FAKE_CLIENT = """
import json, sys, time
from pathlib import Path
# A stand-in for sglang's benchmark client (a test double): low power while it "generates the
# dataset", high power from its warm-up line to 1 s after its measured duration, low again while it
# computes its metrics; it prints the real client's warm-up line and pauses 1 s as the real one
# does. The high phase has a second of margin on each side of the measured window, so a sampler or
# a line reader late by up to a second on a loaded machine still reads the window at high power.
watts, out = Path(sys.argv[1]), sys.argv[sys.argv.index("--output-file") + 1]
def draw(w):
    watts.write_text(str(w))
draw(100.0); time.sleep(0.8)
draw(700.0)
print("Warmup completed with 1 sequences. Starting main benchmark run...")
time.sleep(1.0)
begun = time.perf_counter(); time.sleep(2.0)
duration = time.perf_counter() - begun
time.sleep(1.0); draw(100.0); time.sleep(0.8)
with open(out, "a") as f:
    f.write(json.dumps({"request_rate": 1.0, "duration": duration, "ttfts": [0.1], "itls": [[0.01]], "input_lens": [10],
                        "output_lens": [2], "errors": [""]}) + "\\n")
"""


def test_a_runs_power_is_the_benchmarks_measured_window_not_the_whole_client_process(tmp_path, monkeypatch):
    watts = tmp_path / "watts"
    watts.write_text("100.0")
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "amd-smi"
    script.write_text(f'#!/bin/sh\n# stand-in for amd-smi (test double): one GPU, its power from a file\n'
                      f'echo "GPU: 0"\necho "        SOCKET_POWER: $(cat {watts}) W"\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    client = tmp_path / "client.py"
    client.write_text(FAKE_CLIENT)
    result = bench_run.run_client({"prefix": [sys.executable], "module": str(client)}, [str(watts)], tmp_path / "run.jsonl",
                                  power_interval_s=0.05)
    summary = result["power"]
    assert result["exit"] == 0, result
    assert summary["window"]["found"].startswith("from the client's warm-up line")
    assert summary["window"]["seconds"] == pytest.approx(result["figures"]["duration_s"], abs=1e-3)
    # Over the whole process (about 5.6 s, 1.6 s of it at 100 W) the mean would be near 530 W;
    # over the window it is 700 W.
    assert summary["samples_taken"] > summary["samples"] >= 2
    assert summary["gpu_sockets_w_mean"] == pytest.approx(700.0)


def test_the_whole_nodes_power_is_read_where_the_host_exposes_it_and_divides_tok_s_beside_the_gpu_sockets(tmp_path, monkeypatch):
    folder = stand_in_amd_smi(tmp_path / "bin", [700.0] * 8)
    ipmitool = folder / "ipmitool"
    ipmitool.write_text('#!/bin/sh\n# stand-in for ipmitool (test double)\n[ "$1 $2 $3" = "dcmi power reading" ] || exit 2\n'
                        'echo "    Instantaneous power reading:                  9000 Watts"\n')
    ipmitool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    with power.PowerSampler(interval_s=0.05) as sampler:
        import time

        time.sleep(0.2)
    summary = sampler.summary()
    assert summary["gpu_sockets_w_mean"] == pytest.approx(5600.0) and summary["node_w_mean"] == pytest.approx(9000.0)
    assert summary["node_source"].endswith("ipmitool dcmi power reading")
    measured = _measured(tmp_path, [(2.4, 2626, 2.22)])
    measured["runs"][0]["power"] = summary
    record = collect(_template(), "as-shipped", measured)
    figures = record.runs[0]["figures"]
    assert figures["tok_s_per_w_gpu_sockets"] == pytest.approx(2626 / 5600)
    assert figures["tok_s_per_w_node"] == pytest.approx(2626 / 9000)
    table = report.render_bench_markdown([record])
    assert "| W, GPU sockets | tok/s/W, GPU sockets | W, whole node | tok/s/W, whole node |" in table
    assert "| 5600 | 0.469 | 9000 | 0.292 |" in table


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
        figures = {"requested_rps": rate, "achieved_rps": rate * 0.9, "output_tok_s": tok_s, "ttft_p50_s": p95 / 2, "ttft_p95_s": p95,
                   "success": 1.0, "completed": 10, "requests": 10, "cache_hit_rate": 0.56,
                   "cache_hit_source": "client --cache-report (per-request cached tokens)"}
        runs.append({"rate": rate, "command": f"python3 -m sglang.benchmark.serving --request-rate {rate}",
                     "output_file": str(tmp_path / f"rate-{rate}.jsonl"), "exit": 0, "figures": figures,
                     "power": {"source": "amd-smi metric --power", "gpu_sockets_w_mean": watts, "gpus": 8, "samples": 30,
                               "node_error": "the whole node's power was not measured: ipmitool is not installed",
                               "window": {"found": "from the client's warm-up line + 1 s, its duration long"}}})
    return {"argv": ["--tp-size", "4", "--dp-size", "2"], "env": {"SGLANG_USE_AITER": "1"}, "healthy_s": 300.0,
            "server_log": str(log), "runs": runs}


def test_a_record_holds_the_receipt_the_knee_power_per_token_and_the_findings(tmp_path):
    measured = _measured(tmp_path, [(0.5, 449, 0.6), (2.0, 1944, 1.05), (2.4, 2626, 2.22), (2.65, 2700, 6.5)])
    record = collect(_template(), "as-shipped", measured)
    assert record.outcome == PASSED, record.reason
    assert (record.knee_achieved_rps, record.knee_requested_rps) == (pytest.approx(2.4 * 0.9), 2.4)
    assert record.runs[2]["figures"]["tok_s_per_w_gpu_sockets"] == pytest.approx(2626 / 5600)
    assert "tok_s_per_w_node" not in record.runs[2]["figures"]  # no node power was measured
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
    assert "tok_s_per_w_gpu_sockets" not in record.runs[0]["figures"]


def test_the_table_has_the_write_ups_shape_with_power_and_the_plot_is_a_png(tmp_path):
    record = collect(_template(), "as-shipped", _measured(tmp_path, [(0.5, 449, 0.6), (2.4, 2626, 2.22), (2.65, 2700, 6.5)]))
    table = report.render_bench_markdown([record])
    assert ("| sustained RPS (achieved) | requested RPS | tok/s/node | TTFT p50 / p95 | success | cache hit"
            " | W, GPU sockets | tok/s/W, GPU sockets |") in table
    assert "| 2.16 (knee) | 2.4 | 2626 | 1.11 s / 2.22 s | 100% | 56% | 5600 | 0.469 |" in table
    assert "**2.16 RPS achieved** (asked for 2.4)" in table
    assert "sum of 8 GPUs' socket power (amd-smi socket_power), not the node's" in table
    assert "whole node" not in table.split("\n")[2] and "ipmitool is not installed" in table
    assert "glm-5.2-mxfp4-mi355x-tp4dp2 v1" in table and "MXFP4".lower() in table.lower() and "sglang 0.5.23" in table
    assert "untuned aiter MoE shape" in table and "fusion inert" in table
    # the plot's x-axis is the achieved rate, not the requested one
    assert [point[0] for point in report.plot_points(record)] == [pytest.approx(r * 0.9) for r in (0.5, 2.4, 2.65)]
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
    assert by[("knee", "knee_achieved_rps")]["a"] == pytest.approx(1.8) and by[("knee", "knee_achieved_rps")]["b"] == pytest.approx(2.16)
    assert ("2.4", "tok_s_per_w_node") not in by  # neither side measured the whole node
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
