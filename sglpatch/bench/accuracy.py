"""The accuracy gate: GSM8K through sglang's own few-shot evaluation on the patched image, with
the launch profile (MTP 5/1/6 on), and the accept length the server reports.

Thresholds as sglang's own AMD CI sets them for GLM-5.2 MXFP4 with MTP 5/1/6
(--kv-cache-dtype fp8_e4m3, SGLANG_USE_AITER=1): GSM8K >= 0.935, accept length >= 5.0. The write-up
measured 0.955 (200 questions, 5-shot, greedy), which is what the evaluation runs.
"""

from __future__ import annotations

from sglpatch.matrix.records import FAILED, PASSED, Part
from sglpatch.rocm.constants import SGLANG_CI_ACCEPT_LENGTH

GSM8K_FLOOR = 0.935
ACCEPT_LENGTH_FLOOR = SGLANG_CI_ACCEPT_LENGTH
QUESTIONS, SHOTS = 200, 5
WRITE_UP_GSM8K = 0.955


def judge(figures: dict) -> list[Part]:
    """The gate's parts from what accuracy_check printed."""
    healthy = figures.get("healthy_s")
    parts = [Part("server healthy", PASSED if healthy is not None else FAILED,
                  f"after {healthy} s" if healthy is not None else f"not healthy: {figures.get('error', 'see the log')}")]
    if healthy is None:
        return parts
    accuracy, accept = figures.get("accuracy"), figures.get("accept_length")
    parts.append(Part(f"GSM8K ({QUESTIONS} questions, {SHOTS}-shot, greedy) at least {GSM8K_FLOOR}",
                      PASSED if accuracy is not None and accuracy >= GSM8K_FLOOR else FAILED,
                      f"{accuracy} (sglang's AMD CI floor; the write-up measured {WRITE_UP_GSM8K})"
                      + (f"; {figures.get('error')}" if figures.get("error") else "")))
    parts.append(Part(f"accept length at least {ACCEPT_LENGTH_FLOOR}",
                      PASSED if accept is not None and accept >= ACCEPT_LENGTH_FLOOR else FAILED,
                      f"{accept} (sglang's AMD CI floor for MTP 5/1/6)"))
    return parts
