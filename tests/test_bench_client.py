"""The bench harness with the pins' own client: sglang's bench_serving of one pin before 0.5.14 and
of the newest, run by the pin's CPU Python against the stand-in server (tests/standin_sglang_server.py,
a test double of sglang's server, loopback only), with a word-level tokenizer built here and the
generated-shared-prefix dataset (no download). What a ROCm node runs, less the GPU and the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import REAL_PINS, pristine_subtree, skip_unless_required
from standin_sglang_server import StandinServer, Timing
from test_bench import stand_in_amd_smi
from sglpatch.bench import cpu_client, report
from sglpatch.bench.client import bench_client
from sglpatch.bench.collect import collect
from sglpatch.bench.records import BenchRecord
from sglpatch.bench.workloads import Serving
from sglpatch.matrix.records import PASSED
from sglpatch.rocm.checks import bench_metrics, bench_run
from sglpatch.witnesses import cpu_envs, probe_children, probe_runs

pytestmark = pytest.mark.network  # the pins' trees and CPU Pythons come from the package index

TOKENIZER = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"[UNK]": 0, **{f"w{i}": i + 1 for i in range(2000)}}
words = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=words, unk_token="[UNK]").save_pretrained(sys.argv[1])
"""
# Small enough to run in seconds: 60 shared + 40 own tokens, 5 prompts per group (hit 0.6 x 4/5).
WORKLOAD = Serving(system_prompt_len=60, question_len=40, output_len=8, prompts_per_group=5, seconds_per_rate=0,
                   min_requests=20, rates=(8.0,), extend_step=56.0, extend_max=2, ttft_p95_s=0.25)
# One request at a time takes 40 ms of prefill: up to 25 requests/s the queue stays short.
TIMING = Timing(prefill_s=0.04, itl_s=0.004)


def _python(version: str):
    try:
        return probe_runs.cpu_python(REAL_PINS.select([version])[0])
    except cpu_envs.EnvUnavailable as exc:
        skip_unless_required(f"no CPU Python for {version}: {exc}")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    script = folder / "make.py"
    script.write_text(TOKENIZER)
    done = _python("0.5.23").run([str(script), str(folder)], tree=folder, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return folder


def _sweep(version: str, tree: Path, tokenizer: Path, work: Path, workload: Serving):
    client = bench_client(tree)
    python = _python(version)
    listed, extend = workload.runs(client, str(tokenizer))
    log = work / "server.log"
    with StandinServer(str(tokenizer), log, TIMING) as server:
        host = ["--host", "127.0.0.1", "--port", str(server.port)]
        runs = bench_run.sweep(
            {"prefix": [str(python.python), str(Path(cpu_client.__file__))], "module": client.module},
            [{**r, "args": r["args"] + host} for r in listed], [{**r, "args": r["args"] + host} for r in extend],
            work, ttft_p95_s=workload.ttft_p95_s, env=cpu_client.cpu_python_env(tree, probe_children.PROBES, work),
            timeout=300, power_interval_s=0.2, server_log=log)
        prefills = list(server.state.prefills)
    return client, runs, prefills, log


def _hand_percentiles(ttfts: list[float]) -> tuple[float, float]:
    s = sorted(ttfts)
    assert len(s) == 20
    # positions 19 x 0.5 = 9.5 and 19 x 0.95 = 18.05
    return (s[9] + s[10]) / 2, s[18] + 0.05 * (s[19] - s[18])


def test_the_newest_pins_client_sweeps_to_the_knee_with_cache_hits_and_power(tokenizer, tmp_path, monkeypatch):
    """The pin's real client against the stand-in server (tests/standin_sglang_server.py), with a stand-in amd-smi: the sweep up to the knee, which the real server on CPU (docs/rehearsal.md) is too slow to push."""
    tree = pristine_subtree("0.5.23", tmp_path / "tree")
    monkeypatch.setenv("PATH", f"{stand_in_amd_smi(tmp_path / 'bin', [700.0] * 8)}:{__import__('os').environ['PATH']}")
    client, runs, prefills, log = _sweep("0.5.23", tree, tokenizer, tmp_path / "work", WORKLOAD)
    assert client.module == "sglang.benchmark.serving" and client.cache_report
    # 8/s keeps TTFT p95 far under 0.25 s; 64/s (the first step up) queues past it, so the sweep stops there.
    assert [r["rate"] for r in runs] == [8.0, 64.0], [r.get("error") for r in runs]
    low, high = (r["figures"] for r in runs)
    assert bench_metrics.meets_knee_rule(low, 0.25) and not bench_metrics.meets_knee_rule(high, 0.25)
    raw = bench_metrics.read_runs(runs[0]["output_file"])[-1]
    p50, p95 = _hand_percentiles(raw["ttfts"])
    assert low["ttft_p50_s"] == pytest.approx(p50) and low["ttft_p95_s"] == pytest.approx(p95)
    assert low["client_p95_ttft_ms"] == pytest.approx(p95 * 1000) and low["client_median_ttft_ms"] == pytest.approx(p50 * 1000)
    # The hit rate the client reports is what the server counted: every prompt after the first of
    # its group finds the 60 shared tokens (the warm-up's entry is flushed before the run).
    assert "--cache-report" in low["cache_hit_source"]
    run_prefills = prefills[1:21]  # the first prefill is the client's warm-up request
    assert low["cache_hit_rate"] == pytest.approx(sum(p["cached"] for p in run_prefills) / sum(p["tokens"] for p in run_prefills))
    assert low["cache_hit_rate"] == pytest.approx(0.6 * 4 / 5, abs=0.02)
    assert runs[0]["power"]["gpu_sockets_w_mean"] == pytest.approx(5600.0)
    # The pin's own client printed its warm-up line: the power window is its measured duration.
    window = runs[0]["power"]["window"]
    assert window["found"].startswith("from the client's warm-up line")
    assert window["seconds"] == pytest.approx(low["duration_s"], abs=1e-3)

    template = BenchRecord(workload="serving", pin="0.5.23", variant="as-shipped", series_version="3", series_hash="ab" * 32,
                           profile="glm-5.2-mxfp4-mi355x-tp4dp2", profile_version=1, quantization="mxfp4 (AMD Quark)")
    record = collect(template, "as-shipped", {"healthy_s": 0.0, "server_log": str(log), "runs": runs}, ttft_p95_s=0.25)
    assert record.outcome == PASSED, record.reason
    assert record.knee_requested_rps == 8.0 and record.knee_achieved_rps == pytest.approx(low["achieved_rps"])
    assert low["achieved_rps"] == pytest.approx(20 / low["duration_s"])
    assert record.runs[0]["figures"]["tok_s_per_w_gpu_sockets"] == pytest.approx(low["output_tok_s"] / 5600.0)
    assert "--output-details" in record.runs[0]["command"] and Path(record.runs[0]["output_file"]).is_file()
    table = report.render_bench_markdown([record])
    assert f"| {low['achieved_rps']:.2f} (knee) | 8.0 |" in table and "(asked for 8.0)" in table
    assert report.plot_serving(record, tmp_path / "sweep.png").stat().st_size > 10000


def test_a_client_without_cache_report_still_gets_percentiles_and_the_hit_rate_from_the_server_log(tokenizer, tmp_path):
    """The real pre-0.5.14 client against the stand-in server (tests/standin_sglang_server.py): the hit rate read from the server log's prefill lines."""
    old = next(p.version for p in REAL_PINS.pins if Version(p.version) < Version("0.5.14"))
    tree = pristine_subtree(old, tmp_path / "tree")
    workload = Serving(**{**WORKLOAD.__dict__, "extend_max": 0})
    client, runs, prefills, _ = _sweep(old, tree, tokenizer, tmp_path / "work", workload)
    assert client.module == "sglang.bench_serving" and not client.cache_report
    figures = runs[0]["figures"]
    raw = bench_metrics.read_runs(runs[0]["output_file"])[-1]
    assert "p95_ttft_ms" not in raw and "cached_tokens" not in raw  # what this client cannot tell
    p50, p95 = _hand_percentiles(raw["ttfts"])
    assert figures["ttft_p50_s"] == pytest.approx(p50) and figures["ttft_p95_s"] == pytest.approx(p95)
    assert figures["client_median_ttft_ms"] == pytest.approx(p50 * 1000)
    assert figures["cache_hit_source"].startswith("server log")
    run_prefills = prefills[1:21]
    assert figures["cache_hit_rate"] == pytest.approx(sum(p["cached"] for p in run_prefills) / sum(p["tokens"] for p in run_prefills))
    assert json.loads(Path(runs[0]["output_file"]).read_text().splitlines()[-1])["completed"] == 20
