"""ROCm tier, inside the patched image: hold one sglang server, and the checks that talk to it.

Usage: serve_check.py CONFIG_JSON

A ROCm job (``sglpatch.rocm.job``) starts one server per launch configuration and runs every
check that shares it against it, each check in its own container in the server container's network:

- ``"mode": "serve"``: start ``python -m sglang.launch_server`` with CONFIG "argv" (and "env"),
  on CONFIG "port" (several servers share a runner's network), wait up to "timeout" seconds for
  /health ("health_poll_s" between tries), write its log to "log", and print one JSON line:
  {"serving": true|false, "healthy_s", "gpu", "log", "mismatch_lines", "compile_failures",
  "error"}. Then hold the server until the container is stopped (SIGTERM), and stop it.
- ``"load"``, ``"spec"``, ``"greedy"``, ``"speed"``: talk to the running server at CONFIG "url" only
  and print one JSON line of figures. CONFIG "server" is what the serve mode printed (its health,
  GPU and log, echoed and scanned for shape mismatches and failed compiles of the fused
  metadata-copy kernel). load: one generate, and the checked flags of CONFIG "argv" as the
  server's /server_info reports them. spec: "depth" and "baseline", the file of
  the job's greedy outputs and decode speed without speculative decoding ({"plain": {"outputs"},
  "plain_speed": {"decode_tok_s"}}) that ``greedy`` and ``speed`` measured on that server.

The host judges the figures. Standard library only: it runs with the image's Python.
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
URL = f"http://127.0.0.1:{PORT}"
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
# What the pins' Python callers of the fused metadata-copy kernel log when its JIT compile fails
# (``logger.error`` in the loader, the DSA backend's "falling back" print), read in their sources
# 0.5.10-0.5.23; the failure is not cached, so the lines repeat once per decode step.
COMPILE_FAILURE = re.compile(r"Failed to compile JIT fused metadata copy|fused metadata copy kernel failed with error")
# Flags whose resolved value the load check reads back: (argv flag, server_args field).
CHECKED_FLAGS = {"--kv-cache-dtype": "kv_cache_dtype", "--enable-aiter-allreduce-fusion": "enable_aiter_allreduce_fusion",
                 "--speculative-num-steps": "speculative_num_steps", "--tp-size": "tp_size"}
# Patch 0003's warning where the fusion cannot engage (the profile's disable-custom-all-reduce
# is one such reason): recorded beside the flags, not a failure.
FLAG_FINDING = re.compile(r"enable-aiter-allreduce-fusion has no effect[^\n]*")
BURST = 32
GPU_PROBE_TIMEOUT_S = 300


def post(path: str, payload: dict, timeout: float = 600) -> dict:
    request = urllib.request.Request(f"{URL}{path}", json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def get(path: str, timeout: float = 10) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"{URL}{path}", timeout=timeout) as response:
        return response.status, response.read()


class Server:
    def __init__(self, argv: list[str], log: Path, timeout: float, env: dict | None = None, poll_s: float = 5.0,
                 port: int = PORT):
        global URL
        URL = f"http://127.0.0.1:{port}"
        self.log_path = log
        self.log = open(log, "w")
        command = [sys.executable, "-m", "sglang.launch_server", *argv, "--host", "127.0.0.1", "--port", str(port)]
        print("$ " + " ".join(command), flush=True)
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, **(env or {})})
        self.started = time.monotonic()
        self.poll_s = poll_s
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
            time.sleep(self.poll_s)
        return None

    def log_text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        self.log.close()
        print(self.log_text()[-4000:], flush=True)


def mismatch_lines(log_text: str) -> list[str]:
    return [line for line in log_text.splitlines() if MISMATCH.search(line)][:3]


def log_findings(log_text: str) -> dict:
    """Shape mismatches, failed compiles of the fused metadata-copy kernel (how many, the first),
    and what the server said about the checked flags."""
    failures = [line for line in log_text.splitlines() if COMPILE_FAILURE.search(line)]
    findings = {"mismatch_lines": mismatch_lines(log_text), "compile_failures": len(failures),
                "flag_findings": sorted({match.group(0)[:300] for match in FLAG_FINDING.finditer(log_text)})[:3]}
    if failures:
        findings["compile_failure_line"] = failures[0][:300]
    return findings


def flags_asked(argv: list[str]) -> dict:
    """The checked flags' values in a launch's argv, typed as server_args holds them."""
    asked = {}
    for flag, field in CHECKED_FLAGS.items():
        if flag not in argv:
            continue
        at = argv.index(flag)
        value = argv[at + 1] if at + 1 < len(argv) and not argv[at + 1].startswith("--") else True
        asked[field] = int(value) if isinstance(value, str) and value.isdigit() else value
    return asked


def find_fields(data, fields: set[str]) -> dict:
    """The first value of each field anywhere in /server_info's answer (flat before 0.5.17, in
    namespaces after)."""
    found: dict = {}
    stack = [data]
    while stack:
        item = stack.pop(0)
        if isinstance(item, dict):
            for key, value in item.items():
                if key in fields and key not in found and not isinstance(value, (dict, list)):
                    found[key] = value
                stack.append(value)
        elif isinstance(item, list):
            stack.extend(item)
    return found


def resolved_flags(config: dict) -> dict:
    asked = flags_asked(config.get("argv") or [])
    info = {}
    for path in ("/server_info", "/get_server_info"):
        try:
            info = json.loads(get(path, timeout=60)[1])
            break
        except (OSError, ValueError):
            continue
    return {"flags_asked": asked, "flags_resolved": find_fields(info, set(asked))}


def load_work(config: dict) -> dict:
    # ignore_eos: a random-weight checkpoint may pick its end-of-text token first, and an empty
    # text would say nothing about loading.
    return {"generate": generate(PROMPTS[0], 16, ignore_eos=True)["text"], **resolved_flags(config)}


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
    """Start a server, run ``work`` against it, stop it; figures plus health and log findings.
    (The accuracy gate's own session; a ROCm job holds its servers with the serve mode instead.)"""
    server = Server(argv, Path(config["state"]) / f"{name}.log", config["timeout"])
    try:
        figures = {"healthy_s": server.healthy_after}
        if server.healthy_after is not None:
            figures.update(work())
    except Exception as exc:
        figures["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        server.stop()
    figures["mismatch_lines"] = mismatch_lines(server.log_text())
    return figures


def gpu_name() -> str:
    """The GPU's name, asked in a child that exits before the server starts (so it holds no GPU
    memory while the server runs)."""
    probe = "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU visible')"
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=GPU_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"unknown (the torch probe did not answer in {GPU_PROBE_TIMEOUT_S} s)"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return f"unknown ({last[:200]})"
    return done.stdout.strip()


def hold(config: dict) -> int:
    """The serve mode: start the server, report, hold it until SIGTERM, stop it."""
    log = Path(config["log"])
    log.parent.mkdir(parents=True, exist_ok=True)
    stopping = threading.Event()
    # PID 1 of a container ignores SIGTERM unless it handles it: docker stop must end the hold.
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    report: dict = {"gpu": gpu_name(), "log": str(log)}
    server = Server(config["argv"], log, config["timeout"], env=config.get("env"), poll_s=config.get("health_poll_s", 5.0),
                    port=config.get("port", PORT))
    try:
        report["healthy_s"] = server.healthy_after
        report["serving"] = server.healthy_after is not None
        if not report["serving"]:
            exit_code = server.process.poll()
            report["error"] = (f"the server exited with {exit_code}" if exit_code is not None
                               else f"not healthy within {config['timeout']} s")
        report.update(log_findings(server.log_text()))
        print(json.dumps(report), flush=True)
        while report["serving"] and not stopping.is_set() and server.process.poll() is None:
            stopping.wait(1.0)
        if report["serving"] and server.process.poll() is not None:
            print(f"sglpatch: the server exited with {server.process.poll()} while held", flush=True)
    finally:
        server.stop()
    return 0 if report["serving"] else 1


def check_figures(config: dict, work) -> dict:
    """A check against the running server: its figures, the server's health and GPU as the serve
    mode reported them, and shape mismatches in the server's log so far."""
    server = config.get("server", {})
    figures: dict = {"healthy_s": server.get("healthy_s"), "gpu": server.get("gpu", "")}
    try:
        get("/health", timeout=60)
    except OSError as exc:  # it was healthy once; a server that died while held is not
        figures.update(healthy_s=None, error=f"the server did not answer /health before this check: {exc}")
    else:
        try:
            figures.update(work())
        except Exception as exc:
            figures["error"] = f"{type(exc).__name__}: {exc}"
    try:
        figures.update(log_findings(Path(server["log"]).read_text(errors="replace")))
    except (KeyError, OSError) as exc:
        figures["mismatch_lines"] = []
        figures["log_error"] = f"the server log could not be read: {exc}"
    return figures


def common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def spec_work(config: dict) -> dict:
    outputs = [generate(prompt, 64) for prompt in PROMPTS]
    lengths = [accept_length(out["meta_info"]) for out in outputs]
    lengths = [value for value in lengths if value is not None]
    completed, errors = burst()
    figures = {
        "accept_length": sum(lengths) / len(lengths) if lengths else None,
        "decode_tok_s": decode_speed(),
        "burst_completed": completed,
        "burst_errors": errors,
    }
    try:
        base = json.loads(Path(config["baseline"]).read_text())
    except (KeyError, OSError, ValueError) as exc:
        base = {"plain": {"error": f"no baseline: {exc}"}, "plain_speed": {"error": f"no baseline: {exc}"}}
    plain = base.get("plain", {}).get("outputs") or []
    mine = [out["text"] for out in outputs]
    if plain and mine:
        figures["prefix_match"] = [round(common_prefix(a, b) / max(len(a), 1), 3) for a, b in zip(plain, mine)]
        figures["exact_match"] = sum(a == b for a, b in zip(plain, mine))
    figures["plain_decode_tok_s"] = base.get("plain_speed", {}).get("decode_tok_s")
    figures["baseline_errors"] = [base[key]["error"] for key in ("plain", "plain_speed") if base.get(key, {}).get("error")]
    return figures


CHECKS = {
    "load": load_work,
    "greedy": lambda config: {"outputs": greedy_outputs()},
    "speed": lambda config: {"decode_tok_s": decode_speed()},
    "spec": spec_work,
}


def main(config: dict) -> int:
    global URL
    if config["mode"] == "serve":
        return hold(config)
    if config["mode"] not in CHECKS:
        print(json.dumps({"error": f"unknown mode {config['mode']!r}; modes: serve, {', '.join(CHECKS)}"}))
        return 2
    URL = config.get("url", URL)
    print(json.dumps(check_figures(config, lambda: CHECKS[config["mode"]](config))))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
