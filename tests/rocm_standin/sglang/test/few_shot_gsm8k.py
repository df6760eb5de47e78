"""A TEST DOUBLE of ``python -m sglang.test.few_shot_gsm8k`` (a stand-in, not sglang's evaluation).

It sends a few questions (at most QUESTIONS_ASKED) to the server named by --host and --port and
prints sglang's summary lines; the accuracy is a canned 0.95 times the share of questions the
server answered, so a server that answers nothing scores 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request

QUESTIONS_ASKED = 5
CANNED_ACCURACY = 0.95


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sglang.test.few_shot_gsm8k (stand-in)")
    parser.add_argument("--num-questions", type=int, default=200)
    parser.add_argument("--num-shots", type=int, default=5)
    parser.add_argument("--host", default="http://127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    args, _ = parser.parse_known_args(argv)
    asked = min(args.num_questions, QUESTIONS_ASKED)
    # As the real one does (0.5.23 adds the scheme to a bare host; 0.5.10 takes either): the job
    # passes the bare host, as the rehearsal against the real server found it must.
    base = args.host if "://" in args.host else f"http://{args.host}"
    answered = 0
    for number in range(asked):
        payload = {"text": f"Question {number}: what is {number} + {number}?", "sampling_params": {"max_new_tokens": 8}}
        request = urllib.request.Request(f"{base}:{args.port}/generate", json.dumps(payload).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answered += bool(json.loads(response.read()).get("text"))
        except OSError as exc:
            print(f"question {number}: {exc}")
    print(f"Accuracy: {CANNED_ACCURACY * answered / asked:.3f}")
    print("Invalid: 0.000")
    print(f"Latency: 0.100 s (stand-in; {answered} of {asked} answered, {args.num_shots}-shot asked)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
