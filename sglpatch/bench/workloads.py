"""The write-up's two workloads as the pin's client arguments, and the write-up's own figures.

- **serving**: ``generated-shared-prefix`` prompts of 20k tokens of which 12k are a system prompt
  shared by every prompt of its group (60%), 1k output tokens, exact lengths; Poisson arrivals at the
  write-up's rates, then upward until the knee is passed. The first prompt of each group misses the
  cache, so the expected hit rate is 0.6 x (P - 1) / P for P prompts per group; the achieved rate
  is measured and reported.
- **single-stream**: one request at a time, 10k in / 1.5k out (``random-ids``: no download), enough
  requests for a stable median; output speed after the first token (the public leaderboard's) and
  end to end.

Every run flushes the server's cache after the client's warm-up request, so each rate starts cold
with the same prompts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglpatch.bench.client import BenchClient

WRITE_UP_RATES = (0.5, 1.0, 1.5, 2.0, 2.25, 2.4)
# The write-up's published sweep (TP4 x DP2 with the tuned fp4 MoE): rate -> (tok/s/node, TTFT
# p50 s, TTFT p95 s, success). Drawn beside ours as a reference, never used as a result.
PUBLISHED_SERVING = {
    0.5: (449, 0.59, 0.60, 1.0),
    1.0: (974, 0.60, 0.81, 1.0),
    1.5: (1913, 0.62, 1.03, 1.0),
    2.0: (1944, 0.62, 1.05, 1.0),
    2.25: (2089, 0.63, 1.23, 1.0),
    2.4: (2626, 0.81, 2.22, 1.0),
}
PUBLISHED_SINGLE_STREAM_TOK_S = 213
WORKLOADS = ("serving", "single-stream")


@dataclass(frozen=True)
class Serving:
    system_prompt_len: int = 12000
    question_len: int = 8000
    output_len: int = 1000
    prompts_per_group: int = 16
    seconds_per_rate: float = 120.0  # sustained: about this long at each rate
    min_requests: int = 32
    rates: tuple[float, ...] = WRITE_UP_RATES
    extend_step: float = 0.25  # after the listed rates, upward by this much ...
    extend_max: int = 12  # ... at most this many more runs
    ttft_p95_s: float = 5.0
    seed: int = 1

    def requests(self, rate: float) -> int:
        wanted = max(self.min_requests, math.ceil(rate * self.seconds_per_rate))
        return math.ceil(wanted / self.prompts_per_group) * self.prompts_per_group

    def expected_hit_rate(self) -> float:
        share = self.system_prompt_len / (self.system_prompt_len + self.question_len)
        return share * (self.prompts_per_group - 1) / self.prompts_per_group

    def args(self, client: BenchClient, rate: float, tokenizer: str | None = None) -> list[str]:
        count = self.requests(rate)
        args = [
            "--backend", "sglang", "--dataset-name", "generated-shared-prefix",
            "--gsp-num-groups", str(count // self.prompts_per_group),
            "--gsp-prompts-per-group", str(self.prompts_per_group),
            "--gsp-system-prompt-len", str(self.system_prompt_len),
            "--gsp-question-len", str(self.question_len),
            "--gsp-output-len", str(self.output_len),
            "--num-prompts", str(count), "--request-rate", str(rate), "--seed", str(self.seed),
        ]
        if client.has("--gsp-range-ratio"):
            args += ["--gsp-range-ratio", "1.0"]  # exact lengths (the default on most pins, said anyway)
        return args + _common(client, tokenizer, flush=True)

    def runs(self, client: BenchClient, tokenizer: str | None = None) -> tuple[list[dict], list[dict]]:
        """(the listed rates, the conditional runs upward) as bench_run takes them."""
        listed = [{"rate": rate, "args": self.args(client, rate, tokenizer)} for rate in self.rates]
        extend = []
        rate = max(self.rates)
        for _ in range(self.extend_max):
            rate = round(rate + self.extend_step, 4)
            extend.append({"rate": rate, "args": self.args(client, rate, tokenizer)})
        return listed, extend


@dataclass(frozen=True)
class SingleStream:
    input_len: int = 10000
    output_len: int = 1500
    requests: int = 16
    seed: int = 1

    def args(self, client: BenchClient, tokenizer: str | None = None) -> list[str]:
        return [
            "--backend", "sglang", "--dataset-name", "random-ids",
            "--random-input-len", str(self.input_len), "--random-output-len", str(self.output_len),
            "--random-range-ratio", "1.0", "--num-prompts", str(self.requests),
            "--max-concurrency", "1", "--seed", str(self.seed),
        ] + _common(client, tokenizer, flush=False)

    def runs(self, client: BenchClient, tokenizer: str | None = None) -> tuple[list[dict], list[dict]]:
        return [{"rate": "single", "args": self.args(client, tokenizer)}], []


def _common(client: BenchClient, tokenizer: str | None, *, flush: bool) -> list[str]:
    args = ["--output-details", "--warmup-requests", "1"]
    if flush:
        args.append("--flush-cache")
    if client.cache_report:
        args.append("--cache-report")
    if client.has("--disable-tqdm"):
        args.append("--disable-tqdm")
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    return args


def workload(name: str):
    if name == "serving":
        return Serving()
    if name == "single-stream":
        return SingleStream()
    raise ValueError(f"unknown workload {name!r}; workloads: {', '.join(WORKLOADS)}")
