"""ROCm tier, inside the patched image: aiter's own fused-MoE tuner for the profile's MoE shapes.

Usage: tune_moe.py CONFIG_JSON
CONFIG: {"rows": [[token, model_dim, inter_dim, expert, topk, act_type, dtype, q_dtype_a, q_dtype_w,
         q_type, use_g1u1, doweight_stage1], ...], "out": tuned CSV to write, "work": folder,
         "aiter": the aiter checkout (sglang's images: /sgl-workspace/aiter), "timeout": s}
Writes the untuned CSV aiter's tuner reads, runs csrc/ck_gemm_moe_2stages_codegen/gemm_moe_tune.py
-i untuned -o tuned, and prints one JSON line: {"command", "exit", "rows_in", "rows_out", "error"}.
aiter reads the result through AITER_CONFIG_FMOE. Standard library only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

COLUMNS = ("token", "model_dim", "inter_dim", "expert", "topk", "act_type", "dtype", "q_dtype_a", "q_dtype_w",
           "q_type", "use_g1u1", "doweight_stage1")


def main(config: dict) -> int:
    work, out = Path(config["work"]), Path(config["out"])
    work.mkdir(parents=True, exist_ok=True)
    untuned = work / "untuned_fmoe.csv"
    untuned.write_text(",".join(COLUMNS) + "\n" + "".join(",".join(str(v) for v in row) + "\n" for row in config["rows"]))
    tuner = Path(config.get("aiter", "/sgl-workspace/aiter")) / "csrc" / "ck_gemm_moe_2stages_codegen" / "gemm_moe_tune.py"
    result = {"rows_in": len(config["rows"]), "untuned": str(untuned)}
    if not tuner.is_file():
        result["error"] = f"aiter's tuner is not in this image: {tuner}"
        print(json.dumps(result))
        return 1
    command = [sys.executable, str(tuner), "-i", str(untuned), "-o", str(out)]
    result["command"] = " ".join(command)
    try:
        done = subprocess.run(command, cwd=tuner.parents[2], timeout=config.get("timeout", 6 * 3600))
        result["exit"] = done.returncode
    except subprocess.TimeoutExpired:
        result["exit"], result["error"] = None, f"the tuner did not finish in {config.get('timeout')} s"
    rows = out.read_text().splitlines()[1:] if out.is_file() else []
    result["rows_out"] = len(rows)
    print(json.dumps(result))
    return 0 if result.get("exit") == 0 and rows else 1


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
