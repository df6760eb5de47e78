"""A TEST DOUBLE of ``python -m sglang.launch_server`` (a stand-in, not sglang).

It answers what the ROCm tier's in-image checks ask of a server: ``/health``; non-streaming
``/generate`` with temperature-0 text that depends only on the prompt (so greedy outputs agree
between launch configurations, as EAGLE verification promises) and, when launched with
``--speculative-num-steps d``, the accept length of a chain of d drafts each accepted with
probability 0.95; ``/server_info`` with that accept length as the running average.

Every start appends its arguments and its ``SGLANG_USE_AITER`` to
``/sglpatch-state/standin-server-starts.jsonl`` (the job's state folder, mounted by the job), so a
test counts the servers a job really started. The model folder's ``standin.json`` asks for
failures: ``{"start": "mismatch"}`` logs a shape-mismatch error and exits 1; ``{"generate":
"error"}`` answers 500; ``{"generate": "hang"}`` never answers; ``{"generate": "exit"}`` dies at
the first generate. It binds 127.0.0.1 only and stops
itself after LIFETIME_S.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

STARTS = Path("/sglpatch-state/standin-server-starts.jsonl")
ACCEPTANCE = 0.95
ITL_S = 0.0005  # seconds per generated token, whatever the depth
LIFETIME_S = 900
HANG_S = 600


def text_for(prompt: str, tokens: int) -> str:
    seed = zlib.crc32(prompt.encode())
    return " ".join(f"t{(seed + k) % 1000}" for k in range(tokens))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sglang.launch_server (stand-in)")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--speculative-num-steps", type=int)
    args, _ = parser.parse_known_args(argv)
    if args.host != "127.0.0.1":
        print("the stand-in server listens on the loopback address only", flush=True)
        return 2
    if STARTS.parent.is_dir():
        with open(STARTS, "a") as handle:
            handle.write(json.dumps({"argv": argv, "SGLANG_USE_AITER": os.environ.get("SGLANG_USE_AITER"),
                                     "pid": os.getpid(), "time": time.time()}) + "\n")
    config = Path(args.model_path) / "standin.json"
    behaviour = json.loads(config.read_text()) if config.is_file() else {}
    print(f"stand-in sglang server (a test double) starting: {' '.join(argv)}", flush=True)
    if behaviour.get("start") == "mismatch":
        print("RuntimeError: size mismatch for model.decoder.mlp.shared_experts.gate_up_proj.weight: "
              "copying a param with shape [4096, 6144] from checkpoint, the shape in current model is [2048, 3072]",
              flush=True)
        return 1
    depth = args.speculative_num_steps
    accept = round(sum(ACCEPTANCE**k for k in range(depth + 1)), 3) if depth else None

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _json(self, payload: dict, status: int = 200) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.startswith("/health"):
                return self._json({})
            if self.path.startswith(("/server_info", "/get_server_info")):
                return self._json({"internal_states": [{"avg_spec_accept_length": accept}], "standin": True})
            return self._json({"error": f"the stand-in has no {self.path}"}, 404)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if not self.path.startswith("/generate"):
                return self._json({"error": f"the stand-in has no {self.path}"}, 404)
            if behaviour.get("generate") == "error":
                return self._json({"error": "the stand-in was asked to fail every generate"}, 500)
            if behaviour.get("generate") == "hang":
                time.sleep(HANG_S)
            if behaviour.get("generate") == "exit":
                print("stand-in: asked to die at the first generate", flush=True)
                os._exit(3)
            prompt = str(body.get("text", ""))
            tokens = int((body.get("sampling_params") or {}).get("max_new_tokens") or 16)
            time.sleep(tokens * ITL_S)
            meta = {"completion_tokens": tokens, "prompt_tokens": len(prompt.split())}
            if accept:
                meta.update(spec_accept_length=accept, spec_verify_ct=math.ceil(tokens / accept))
            return self._json({"text": text_for(prompt, tokens), "meta_info": meta})

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 128  # the spec check's burst of 32 connects at once (the default backlog is 5)

    httpd = Server((args.host, args.port), Handler)
    watchdog = threading.Timer(LIFETIME_S, httpd.shutdown)
    watchdog.daemon = True
    watchdog.start()
    print("The server is fired up and ready to roll! (stand-in)", flush=True)
    httpd.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
