"""Figures of one benchmark run, from the client's per-request output. Standard library only.

sglang's client (``bench_serving``) writes one JSON line per run; with ``--output-details`` it holds
per request ``input_lens``, ``output_lens``, ``ttfts``, ``itls`` and ``errors`` on every release, and
``cached_tokens`` where ``--cache-report`` exists (0.5.14 on). p95 TTFT is not in the client's
summary before 0.5.14, so every percentile here is computed from the per-request lists, the same
way on every pin (linear interpolation between order statistics, as numpy's default).

Used inside the ROCm image (the sweep decides when the knee is passed) and on the host (records,
tables); it imports nothing outside the standard library.
"""

from __future__ import annotations

import json
import math
import re

# The write-up's knee: the highest sustained rate whose TTFT p95 stays within this and where
# every request succeeds. Sustained is the achieved rate (requests completed per second of the
# measured duration), not the Poisson rate the client was asked for: past saturation the server
# completes fewer than were asked for.
KNEE_TTFT_P95_S = 5.0


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation between order statistics."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def read_runs(path) -> list[dict]:
    """Every JSON line of a client output file (the client appends one per run)."""
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def succeeded(run: dict) -> list[int]:
    """Indexes of the requests that succeeded (no error text, a first token seen)."""
    errors = run.get("errors") or [""] * len(run.get("ttfts") or [])
    return [i for i, error in enumerate(errors) if not error]


def run_figures(run: dict) -> dict:
    """The figures of one run: throughput, TTFT p50/p95, success, achieved prefix-cache hit rate."""
    if "ttfts" not in run:
        raise ValueError("the client's output has no per-request data: run it with --output-details")
    ok = succeeded(run)
    total = len(run["ttfts"])
    duration = float(run["duration"])
    ttfts = [run["ttfts"][i] for i in ok]
    output_tokens = sum(run["output_lens"][i] for i in ok)
    input_tokens = sum(run["input_lens"][i] for i in ok)
    figures = {
        "requested_rps": run.get("request_rate"),  # the client's Poisson arrival rate (inf: all at once)
        "requests": total,
        "completed": len(ok),
        "success": len(ok) / total if total else 0.0,
        "duration_s": duration,
        "achieved_rps": len(ok) / duration if duration else None,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / duration if duration else None,
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
        "ttft_p99_s": percentile(ttfts, 99),
        # The client's own summary, kept beside ours as a cross-check (p95 only from 0.5.14).
        "client_median_ttft_ms": run.get("median_ttft_ms"),
        "client_p95_ttft_ms": run.get("p95_ttft_ms"),
        "accept_length": run.get("accept_length"),
    }
    if "cached_tokens" in run:
        cached = sum(run["cached_tokens"][i] or 0 for i in ok)
        figures["cache_hit_rate"] = cached / input_tokens if input_tokens else None
        figures["cache_hit_source"] = "client --cache-report (per-request cached tokens)"
    return figures


def decode_figures(run: dict) -> dict:
    """Single stream: output tok/s counted after the first token (the public leaderboard's output
    speed) and end to end, per request; the medians are the figures."""
    after_first, end_to_end = [], []
    for i in succeeded(run):
        tokens, itls, ttft = run["output_lens"][i], run["itls"][i], run["ttfts"][i]
        decode_s = sum(itls)
        if tokens > 1 and decode_s > 0:
            after_first.append((tokens - 1) / decode_s)
        if ttft + decode_s > 0:
            end_to_end.append(tokens / (ttft + decode_s))
    figures = run_figures(run)
    figures.update(
        output_tok_s_after_first=percentile(after_first, 50),
        output_tok_s_end_to_end=percentile(end_to_end, 50),
        decode_samples=len(after_first),
    )
    return figures


def meets_knee_rule(figures: dict, ttft_p95_s: float = KNEE_TTFT_P95_S) -> bool:
    p95 = figures.get("ttft_p95_s")
    return figures.get("success") == 1.0 and p95 is not None and p95 <= ttft_p95_s


def knee(runs: list[dict], ttft_p95_s: float = KNEE_TTFT_P95_S) -> dict | None:
    """The figures of the run with the highest achieved rate among those that kept TTFT p95 within
    the limit with every request successful; None where no run did."""
    passing = [r for r in runs if meets_knee_rule(r, ttft_p95_s) and r.get("achieved_rps") is not None]
    return max(passing, key=lambda r: r["achieved_rps"]) if passing else None


_PREFILL = re.compile(r"Prefill batch.*?#new-token: (\d+), #cached-token: (\d+)")
_FLUSHED = "Cache flushed successfully"


def log_cache_hit_rate(log_text: str) -> tuple[float | None, int]:
    """The prefix-cache hit rate sglang's scheduler logged ("Prefill batch ... #new-token: N,
    #cached-token: M") after the last cache flush in ``log_text``, with the number of batches; for
    pins whose client has no --cache-report."""
    start = log_text.rfind(_FLUSHED)
    new = cached = batches = 0
    for match in _PREFILL.finditer(log_text, start if start >= 0 else 0):
        new += int(match.group(1))
        cached += int(match.group(2))
        batches += 1
    return (cached / (new + cached) if new + cached else None), batches
