"""ROCm tier, inside the patched image: serve the model and measure; the host judges the figures.

Usage: serve_check.py CONFIG_JSON

CONFIG: {"mode": "load" | "spec", "argv": [...launch_server args...], "timeout": seconds,
         "state": folder kept between cells of one image (baselines), "image": image id,
         spec only: "depth": d, "argv_depth3": [...], "argv_plain": [...] (no speculative decoding)}

Prints one JSON line of figures last. Standard library only: it runs with the image's Python.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

PORT = 30731
# A fixed prompt set for greedy comparison: short, varied, deterministic to tokenise.
PROMPTS = [
    "The capital of France is",
    "Write a Python function that returns the factorial of n.",
    "List the first ten prime numbers, separated by commas:",
    "Explain in two sentences why the sky is blue.",
    "Translate to German: The weather is nice today.",
    "def fibonacci(n):",
    "Q: What is 17 times 23? A:",
    "Summarise the plot of Romeo and Juliet in one sentence.",
]
MISMATCH = re.compile(r"(size|shape) mismatch", re.IGNORECASE)
BURST = 32


def post(path: str, payload: dict, timeout: float = 600) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}", json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def get(path: str, timeout: float = 10) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=timeout) as response:
        return response.status, response.read()


class Server:
    def __init__(self, argv: list[str], log: Path, timeout: float, env: dict | None = None):
        self.log_path = log
        self.log = open(log, "w")
        command = [sys.executable, "-m", "sglang.launch_server", *argv, "--host", "127.0.0.1", "--port", str(PORT)]
        print("$ " + " ".join(command), flush=True)
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, **(env or {})})
        self.started = time.monotonic()
        self.healthy_after = self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float) -> float | None:
        while time.monotonic() - self.started < timeout:
            if self.process.poll() is not None:
                return None
            try:
                if get("/health")[0] == 200:
                    return round(time.monotonic() - self.started, 1)
            except OSError:
                pass
            time.sleep(5)
        return None

    def log_text(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()
        print(self.log_text()[-4000:], flush=True)


def generate(prompt: str, max_new_tokens: int, ignore_eos: bool = False) -> dict:
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos}
    return post("/generate", {"text": prompt, "sampling_params": params})


def accept_length(meta: dict) -> float | None:
    if "spec_accept_length" in meta:
        return float(meta["spec_accept_length"])
    if meta.get("spec_verify_ct"):
        return meta["completion_tokens"] / meta["spec_verify_ct"]
    return None


def greedy_outputs() -> list[str]:
    return [generate(prompt, 64)["text"] for prompt in PROMPTS]


def decode_speed() -> float:
    generate(PROMPTS[0], 16)  # warm-up: graphs and JIT kernels of this batch size
    started = time.monotonic()
    out = generate(PROMPTS[0], 512, ignore_eos=True)
    return out["meta_info"]["completion_tokens"] / (time.monotonic() - started)


def burst() -> tuple[int, list[str]]:
    errors: list[str] = []
    done = []

    def one(n: int) -> None:
        try:
            out = generate(PROMPTS[n % len(PROMPTS)], 128)
            done.append(out["meta_info"]["completion_tokens"])
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(n,)) for n in range(BURST)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=1800)
    return len(done), errors[:3]


def serve(argv: list[str], name: str, config: dict, work) -> dict:
    """Start a server, run ``work`` against it, stop it; figures plus health and log findings."""
    server = Server(argv, Path(config["state"]) / f"{name}.log", config["timeout"])
    try:
        figures = {"healthy_s": server.healthy_after}
        if server.healthy_after is not None:
            figures.update(work())
    except Exception as exc:
        figures["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        server.stop()
    mismatches = [line for line in server.log_text().splitlines() if MISMATCH.search(line)]
    figures["mismatch_lines"] = mismatches[:3]
    return figures


def baseline(config: dict) -> dict:
    """Greedy outputs without speculative decoding, and decode speed at depth 3, once per image."""
    path = Path(config["state"]) / f"baseline-{config['image'].replace(':', '-')}.json"
    if path.is_file():
        return json.loads(path.read_text())
    plain = serve(config["argv_plain"], "plain", config, lambda: {"outputs": greedy_outputs()})
    depth3 = serve(config["argv_depth3"], "depth3", config, lambda: {"decode_tok_s": decode_speed()})
    result = {"plain": plain, "depth3": depth3}
    if plain.get("outputs") and depth3.get("decode_tok_s"):
        path.write_text(json.dumps(result))
    return result


def common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main(config: dict) -> int:
    Path(config["state"]).mkdir(parents=True, exist_ok=True)
    if config["mode"] == "load":
        figures = serve(config["argv"], "load", config, lambda: {"generate": generate(PROMPTS[0], 16)["text"]})
    else:
        base = baseline(config)

        def work() -> dict:
            outputs = [generate(prompt, 64) for prompt in PROMPTS]
            lengths = [accept_length(out["meta_info"]) for out in outputs]
            lengths = [value for value in lengths if value is not None]
            completed, errors = burst()
            return {
                "outputs": [out["text"] for out in outputs],
                "accept_length": sum(lengths) / len(lengths) if lengths else None,
                "decode_tok_s": decode_speed(),
                "burst_completed": completed,
                "burst_errors": errors,
            }

        figures = serve(config["argv"], f"depth{config['depth']}", config, work)
        plain = base["plain"].get("outputs") or []
        mine = figures.pop("outputs", [])
        if plain and mine:
            figures["prefix_match"] = [
                round(common_prefix(a, b) / max(len(a), 1), 3) for a, b in zip(plain, mine)
            ]
            figures["exact_match"] = sum(a == b for a, b in zip(plain, mine))
        figures["depth3_decode_tok_s"] = base["depth3"].get("decode_tok_s")
        figures["baseline_errors"] = [v.get("error") for v in base.values() if v.get("error")]
    try:
        import torch

        figures["gpu"] = torch.cuda.get_device_name(0)
    except Exception as exc:
        figures["gpu"] = f"unknown ({type(exc).__name__})"
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
