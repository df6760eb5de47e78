"""ROCm tier, inside the patched image: serve with a launch profile, measure with sglang's own client.

Usage: bench_run.py CONFIG_JSON

CONFIG: {"out": folder for every raw file, "timeout": seconds for a server to become healthy,
         "run_timeout": seconds for one client run, "power_interval_s": seconds between samples,
         "ttft_p95_s": the knee's TTFT p95 limit, "client": {"prefix": [...], "module": "...",
         "cache_report": bool}, "variants": [{"name", "argv": [launch_server args], "env": {}}],
         "runs": [{"rate", "args": [client args]}]     every one of them, in order,
         "extend": [{"rate", "args": [...]}]}          each only while the run before met the rule

Per variant: one server, then the client once per run, with every GPU's power sampled through
each run; the server log stays in the variant's folder. Prints one JSON line: per variant the
runs (exact command, raw output file, figures, power, server log window) and the environment.
The host (``sglpatch.bench``) turns that and the raw files into records. Standard library only.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

try:  # on the host the modules are a package; in the image they sit side by side
    from sglpatch.rocm_checks import bench_metrics, power
except ImportError:
    import bench_metrics
    import power


def run_client(client: dict, args: list[str], out_file: Path, *, env: dict | None = None,
               timeout: float = 7200, power_interval_s: float = 1.0, server_log: Path | None = None) -> dict:
    """One run of the client (``prefix + [module] + args + --output-file``), power sampled
    throughout; its figures from the per-request output."""
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.unlink(missing_ok=True)  # the client appends: one file per run
    command = [*client["prefix"], client["module"], *args, "--output-file", str(out_file)]
    client_log = out_file.with_suffix(".client.log")
    log_start = server_log.stat().st_size if server_log and server_log.exists() else 0
    started = time.time()
    with open(client_log, "w") as log, power.PowerSampler(power_interval_s) as sampler:
        try:
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                  timeout=timeout)
            exit_code, error = done.returncode, ""
        except subprocess.TimeoutExpired:
            exit_code, error = None, f"the client did not finish in {timeout} s: {shlex.join(command)}"
    result = {
        "command": shlex.join(command),
        "output_file": str(out_file),
        "client_log": str(client_log),
        "exit": exit_code,
        "started": started,
        "seconds": round(time.time() - started, 2),
        "power": sampler.summary(),
        "error": error,
    }
    if server_log and server_log.exists():
        result["server_log"] = str(server_log)
        result["server_log_window"] = [log_start, server_log.stat().st_size]
    try:
        runs = bench_metrics.read_runs(out_file)
        figures = bench_metrics.run_figures(runs[-1])
    except (OSError, ValueError, IndexError, KeyError) as exc:
        tail = client_log.read_text(errors="replace")[-600:] if client_log.exists() else ""
        result["error"] = result["error"] or f"no per-request output ({type(exc).__name__}: {exc}): {tail}"
        return result
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
        server = serve_check.Server(variant["argv"], folder / "server.log", config["timeout"], env=variant.get("env"))
        entry = {"argv": variant["argv"], "env": variant.get("env", {}), "healthy_s": server.healthy_after,
                 "server_log": str(folder / "server.log"), "runs": []}
        try:
            if server.healthy_after is not None:
                with_host = lambda runs: [{**r, "args": [*r["args"], *host_args]} for r in runs]  # noqa: E731
                entry["runs"] = sweep(
                    client, with_host(config["runs"]), with_host(config.get("extend", [])), folder,
                    ttft_p95_s=config.get("ttft_p95_s", bench_metrics.KNEE_TTFT_P95_S),
                    timeout=config.get("run_timeout", 7200), power_interval_s=config.get("power_interval_s", 1.0),
                    server_log=folder / "server.log",
                )
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            server.stop()
        report["variants"][variant["name"]] = entry
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
