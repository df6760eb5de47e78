"""A TEST DOUBLE of ``python -m sglang.launch_server`` (a stand-in, not sglang).

It answers what the ROCm tier's in-image checks ask of a server: ``/health``; non-streaming
``/generate`` with temperature-0 text that depends only on the prompt (so greedy outputs agree
between launch configurations, as EAGLE verification promises) and, when launched with
``--speculative-num-steps d``, the accept length of a chain of d drafts each accepted with
probability 0.95; ``/server_info`` with that accept length as the running average.

Every start appends its arguments, its ``SGLANG_USE_AITER`` and ``HIP_VISIBLE_DEVICES``, and what
it read of the model folder to ``/sglpatch-state/standin-server-starts.jsonl`` (the job's state
folder, mounted by the job), so a test counts the servers a job really started and sees that the
checkpoint reached them: from ``config.json`` the architecture, depth and the Quark exclude list's
MTP entries, from each ``*.safetensors`` file's header (the 8-byte length and the JSON, not the
data) the tensor count and the MTP layer's bf16 tensors. A folder whose ``config.json`` or
safetensors header does not parse fails the start, as sglang's would. ``/server_info`` reports the
checked flags of its argv as ``server_args``. The model folder's ``standin.json`` asks for
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
import struct
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


def read_model(folder: Path) -> dict:
    """What the stand-in reads of a model folder: the config's shape and exclude list, each
    safetensors header. {} for a folder with neither (a test's behaviour-only folder)."""
    seen: dict = {}
    config_path = folder / "config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        layers = config["num_hidden_layers"]
        exclude = (config.get("quantization_config") or {}).get("exclude") or []
        seen.update(architectures=config.get("architectures"), num_hidden_layers=layers,
                    quant_method=(config.get("quantization_config") or {}).get("quant_method"),
                    mtp_excluded=sorted(name for name in exclude if name.startswith(f"model.layers.{layers}.")
                                        and ".self_attn." not in name))
    tensors: dict = {}
    for path in sorted(folder.glob("*.safetensors")):
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        tensors.update({name: info for name, info in header.items() if name != "__metadata__"})
    if tensors:
        mtp = f"model.layers.{seen.get('num_hidden_layers')}."
        seen.update(tensors=len(tensors), bytes=sum(info["data_offsets"][1] - info["data_offsets"][0] for info in tensors.values()),
                    mtp_bf16={name: info["shape"] for name, info in tensors.items()
                              if name.startswith(mtp) and info["dtype"] == "BF16" and ".self_attn." not in name
                              and name.endswith("proj.weight")})
    return seen


def flag_values(argv: list[str]) -> dict:
    """The flags serve_check reads back, as server_args would hold them."""
    values: dict = {}
    for flag in ("--kv-cache-dtype", "--enable-aiter-allreduce-fusion", "--speculative-num-steps", "--tp-size"):
        if flag in argv:
            at = argv.index(flag)
            value = argv[at + 1] if at + 1 < len(argv) and not argv[at + 1].startswith("--") else True
            values[flag[2:].replace("-", "_")] = int(value) if isinstance(value, str) and value.isdigit() else value
    return values


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
    try:
        model = read_model(Path(args.model_path))
    except (OSError, ValueError, KeyError, struct.error) as exc:
        print(f"stand-in: the model folder {args.model_path} does not load: {type(exc).__name__}: {exc}", flush=True)
        return 1
    if STARTS.parent.is_dir():
        with open(STARTS, "a") as handle:
            handle.write(json.dumps({"argv": argv, "SGLANG_USE_AITER": os.environ.get("SGLANG_USE_AITER"),
                                     "HIP_VISIBLE_DEVICES": os.environ.get("HIP_VISIBLE_DEVICES"), "model": model,
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
                return self._json({"internal_states": [{"avg_spec_accept_length": accept}], "server_args": flag_values(argv),
                                   "standin": True})
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
