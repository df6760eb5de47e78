"""ROCm tier, inside the patched image: serve with a launch profile, measure with sglang's own client.

Usage: bench_run.py CONFIG_JSON

CONFIG: {"out": folder for every raw file, "timeout": seconds for a server to become healthy,
         "run_timeout": seconds for one client run, "power_interval_s": seconds between samples,
         "ttft_p95_s": the knee's TTFT p95 limit, "client": {"prefix": [...], "module": "...",
         "cache_report": bool}, "variants": [{"name", "argv": [launch_server args], "env": {},
         "attach": {"port", "log", "healthy_s"} (optional: measure a server held elsewhere)}],
         "runs": [{"rate", "args": [client args]}]     every one of them, in order,
         "extend": [{"rate", "args": [...]}]}          each only while the run before met the rule

Per variant: one server, then the client once per run, with every GPU's power (and the node's
where the host exposes it) sampled around each run and kept over the benchmark's own measured
window; the server log stays in the variant's folder. Prints one JSON line: per variant the
runs (exact command, raw output file, figures, power, server log window) and the environment.
The host (``sglpatch.bench``) turns that and the raw files into records. Standard library only.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

try:  # on the host the modules are a package; in the image they sit side by side
    from sglpatch.rocm.checks import bench_metrics, power
except ImportError:
    import bench_metrics
    import power


# The client prints this when its warm-up is done; then it flushes the cache (where asked), pauses
# for WARMUP_PAUSE_S and only then starts the clock its "duration" is measured with (bench_serving's
# benchmark(), the same on every pin from 0.5.10 to 0.5.23).
WARMUP_DONE = "Starting main benchmark run"
WARMUP_PAUSE_S = 1.0


def measured_window(duration: float, written_at: float, warmup_done_at: float | None) -> tuple[float, float, str]:
    """(start, end, how it was found) of the benchmark's own measured window, in wall-clock seconds:
    ``duration`` long (the client's own), starting ``WARMUP_PAUSE_S`` after the client said its
    warm-up was done where it said so, else ending when it wrote its output file (it writes the
    file after computing its metrics, so this end is a little late). A warm-up anchor that would
    end after the file was written is impossible and not used."""
    if warmup_done_at is not None and warmup_done_at + WARMUP_PAUSE_S + duration <= written_at:
        start = warmup_done_at + WARMUP_PAUSE_S
        return start, start + duration, f"from the client's warm-up line + {WARMUP_PAUSE_S:g} s, its duration long"
    return written_at - duration, written_at, "ending when the client wrote its output, its duration long"


def run_client(client: dict, args: list[str], out_file: Path, *, env: dict | None = None,
               timeout: float = 7200, power_interval_s: float = 1.0, server_log: Path | None = None) -> dict:
    """One run of the client (``prefix + [module] + args + --output-file``), power sampled around it
    and kept over the benchmark's own measured window; its figures from the per-request output."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.unlink(missing_ok=True)  # the client appends: one file per run
    command = [*client["prefix"], client["module"], *args, "--output-file", str(out_file)]
    client_log = out_file.with_suffix(".client.log")
    log_start = server_log.stat().st_size if server_log and server_log.exists() else 0
    started = time.time()
    marks: dict[str, float] = {}
    # Unbuffered, so each line is timestamped when the client prints it, not when a buffer fills.
    run_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    with open(client_log, "w") as log, power.PowerSampler(power_interval_s) as sampler:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=run_env,
                                   text=True, errors="replace")

        def pump() -> None:
            for line in process.stdout:
                if WARMUP_DONE in line and "warmup_done" not in marks:
                    marks["warmup_done"] = time.time()
                log.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            exit_code, error = process.wait(timeout=timeout), ""
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            exit_code, error = None, f"the client did not finish in {timeout} s: {shlex.join(command)}"
        reader.join(timeout=10)
    result = {
        "command": shlex.join(command),
        "output_file": str(out_file),
        "client_log": str(client_log),
        "exit": exit_code,
        "started": started,
        "seconds": round(time.time() - started, 2),
        "error": error,
    }
    if server_log and server_log.exists():
        result["server_log"] = str(server_log)
        result["server_log_window"] = [log_start, server_log.stat().st_size]
    try:
        runs = bench_metrics.read_runs(out_file)
        figures = bench_metrics.run_figures(runs[-1])
        written_at = out_file.stat().st_mtime
    except (OSError, ValueError, IndexError, KeyError) as exc:
        tail = client_log.read_text(errors="replace")[-600:] if client_log.exists() else ""
        result["error"] = result["error"] or f"no per-request output ({type(exc).__name__}: {exc}): {tail}"
        result["power"] = {**sampler.summary(), "error": "no measured window: the client wrote no per-request output"}
        return result
    start, end, how = measured_window(figures["duration_s"], written_at, marks.get("warmup_done"))
    result["power"] = sampler.summary((start, end))
    result["power"]["window"]["found"] = how
    if "cache_hit_rate" not in figures and server_log and server_log.exists():
        with open(server_log, errors="replace") as handle:
            handle.seek(log_start)
            rate, batches = bench_metrics.log_cache_hit_rate(handle.read())
        figures["cache_hit_rate"] = rate
        figures["cache_hit_source"] = f"server log: #cached-token of {batches} prefill batches after the flush"
    result["figures"] = figures
    return result


def sweep(client: dict, runs: list[dict], extend: list[dict], out: Path, *, ttft_p95_s: float,
          env: dict | None = None, timeout: float = 7200, power_interval_s: float = 1.0,
          server_log: Path | None = None) -> list[dict]:
    """Every run of ``runs``, then each of ``extend`` in order while the run before it met the knee
    rule (TTFT p95 within ``ttft_p95_s``, every request successful): upward until the knee is passed."""
    results = []

    def one(entry: dict) -> dict:
        name = f"rate-{entry['rate']}.jsonl"
        result = run_client(client, entry["args"], out / name, env=env, timeout=timeout,
                            power_interval_s=power_interval_s, server_log=server_log)
        result["rate"] = entry["rate"]
        results.append(result)
        return result

    last = None
    for entry in runs:
        last = one(entry)
    for entry in extend:
        if last is None or not bench_metrics.meets_knee_rule(last.get("figures") or {}, ttft_p95_s):
            break
        last = one(entry)
    return results


def environment() -> dict:
    """What the receipt records about the machine: GPU model and count, HIP, ROCm and driver."""
    found: dict = {}
    try:
        import torch

        found["gpu_count"] = torch.cuda.device_count()
        found["gpu"] = torch.cuda.get_device_name(0) if found["gpu_count"] else "no GPU visible"
        found["hip"] = getattr(torch.version, "hip", None)
    except Exception as exc:
        found["gpu"] = f"unknown ({type(exc).__name__})"
    for key, path in (("rocm_version", "/opt/rocm/.info/version"), ("amdgpu_driver", "/sys/module/amdgpu/version")):
        try:
            found[key] = Path(path).read_text().strip()
        except OSError:
            found[key] = None
    return found


def main(config: dict) -> int:
    import serve_check  # the image's server launcher; only needed here, inside the image

    out = Path(config["out"])
    report = {"variants": {}, "environment": environment()}
    client = config["client"]
    host_args = ["--host", "127.0.0.1", "--port", str(serve_check.PORT)]
    for variant in config["variants"]:
        folder = out / variant["name"]
        folder.mkdir(parents=True, exist_ok=True)
        attached = variant.get("attach")
        if attached:
            # A server someone else holds (the rehearsal's, shared by its checks): its port, log and
            # health as its serve mode reported them; not started or stopped here.
            server, server_log = None, Path(attached["log"])
            healthy_s = attached.get("healthy_s")
            variant_host = ["--host", "127.0.0.1", "--port", str(attached["port"])]
        else:
            server_log = folder / "server.log"
            server = serve_check.Server(variant["argv"], server_log, config["timeout"], env=variant.get("env"))
            healthy_s, variant_host = server.healthy_after, host_args
        entry = {"argv": variant["argv"], "env": variant.get("env", {}), "healthy_s": healthy_s,
                 "server_log": str(server_log), "runs": []}
        try:
            if healthy_s is not None:
                with_host = lambda runs: [{**r, "args": [*r["args"], *variant_host]} for r in runs]  # noqa: E731
                entry["runs"] = sweep(
                    client, with_host(config["runs"]), with_host(config.get("extend", [])), folder,
                    ttft_p95_s=config.get("ttft_p95_s", bench_metrics.KNEE_TTFT_P95_S),
                    timeout=config.get("run_timeout", 7200), power_interval_s=config.get("power_interval_s", 1.0),
                    server_log=server_log,
                )
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            if server is not None:
                server.stop()
        report["variants"][variant["name"]] = entry
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
