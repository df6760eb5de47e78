"""ROCm tier, inside the patched image: GSM8K through sglang's own few-shot evaluation, and the
accept length the server reports, with the launch profile (MTP on). Standard library only.

Usage: accuracy_check.py CONFIG_JSON
CONFIG: {"argv": [launch_server args], "env": {}, "timeout": s, "state": folder, "questions": 200,
         "shots": 5, "data_path": GSM8K's test set as JSONL (optional: else downloaded)}: start the server, evaluate, stop it (the accuracy session alone);
        {"mode": "attach", "url": the running server, "server": what serve_check's serve mode
         printed, "state", "questions", "shots"}: evaluate against the server a ROCm job holds
         for the profile as shipped (shared with the load and depth-5 spec cells).
Prints one JSON line: {"healthy_s", "accuracy", "invalid", "accept_length", "command", "error"}.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import serve_check

_ACCURACY = re.compile(r"^Accuracy: ([0-9.]+)", re.MULTILINE)
_INVALID = re.compile(r"^Invalid: ([0-9.]+)", re.MULTILINE)


def server_accept_length() -> float | None:
    """avg_spec_accept_length of the server's first scheduler (/server_info; /get_server_info before it)."""
    for path in ("/server_info", "/get_server_info"):
        try:
            with urllib.request.urlopen(f"{serve_check.URL}{path}", timeout=30) as response:
                info = json.loads(response.read())
        except (OSError, ValueError):
            continue
        states = info.get("internal_states") or [{}]
        value = states[0].get("avg_spec_accept_length")
        return float(value) if value is not None else None
    return None


def evaluate(config: dict) -> dict:
    # sglang's own few-shot GSM8K: greedy (temperature 0 by default), its own answer extraction.
    # The host without its scheme: 0.5.23's few_shot_gsm8k (normalize_base_url) prefixes "http://"
    # itself and would ask for http://http://...; 0.5.10 took either and warned about the scheme.
    address = urllib.parse.urlsplit(serve_check.URL)
    host, port = address.hostname, str(address.port)
    command = [sys.executable, "-m", "sglang.test.few_shot_gsm8k", "--num-questions", str(config.get("questions", 200)),
               "--num-shots", str(config.get("shots", 5)), "--host", host, "--port", port]
    if config.get("data_path"):
        # Without it every release 0.5.10-0.5.23 downloads GSM8K's test set from GitHub into /tmp
        # (few_shot_gsm8k's default): a node without that network has no dataset.
        command += ["--data-path", config["data_path"]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=config.get("eval_timeout", 7200),
                          cwd=config["state"])
    print(done.stdout[-4000:], done.stderr[-4000:], flush=True)
    accuracy, invalid = _ACCURACY.search(done.stdout), _INVALID.search(done.stdout)
    return {"command": " ".join(command), "exit": done.returncode,
            "accuracy": float(accuracy.group(1)) if accuracy else None,
            "invalid": float(invalid.group(1)) if invalid else None,
            "accept_length": server_accept_length()}


def main(config: dict) -> int:
    Path(config["state"]).mkdir(parents=True, exist_ok=True)
    if config.get("mode") == "attach":
        serve_check.URL = config.get("url", serve_check.URL)
        figures = serve_check.check_figures(config, lambda: evaluate(config))
    else:
        figures = serve_check.serve(config["argv"], "accuracy", config, lambda: evaluate(config))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
