"""A test double of sglang's HTTP server (a stand-in, not sglang): loopback only, bounded.

It speaks what sglang's benchmark client asks of a server -- ``/v1/models``, ``/model_info``,
``/health``, ``/server_info`` (and ``/get_server_info``), ``/flush_cache``, streaming ``/generate``
(sglang's native API, cumulative text and ``meta_info`` with completion, prompt and cached tokens)
and streaming ``/v1/completions`` (OpenAI-compatible) -- with a timing model simple enough to
predict:

- prompts are tokenised by whitespace, exactly as the word-level tokenizer the tests build;
- one prefill engine serves requests first come, first served: ``prefill_s`` per request plus
  ``prefill_per_token_s`` per token not found in the prefix cache; requests queue behind it, so
  above 1 / prefill_s requests per second TTFT grows without bound (a knee);
- a prefix cache keeps every prefilled prompt (longest common token prefix wins), until flushed;
  the hit is returned per request and logged as sglang's scheduler logs it
  ("Prefill batch, #new-seq: 1, #new-token: N, #cached-token: M, ...");
- decode streams one token every ``itl_s``, concurrently for every request.

It refuses to bind anything but 127.0.0.1, answers at most ``max_requests`` generations and stops
itself after ``lifetime_s``.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

OUTPUT_WORD = "w7"


@dataclass
class Timing:
    prefill_s: float = 0.04
    prefill_per_token_s: float = 0.0
    itl_s: float = 0.004


@dataclass
class StandinState:
    model: str
    timing: Timing
    log_path: Path
    max_requests: int = 2000
    cache: list[tuple[str, ...]] = field(default_factory=list)
    served: int = 0
    prefills: list[dict] = field(default_factory=list)  # what the server itself counted, per request
    lock: threading.Lock = field(default_factory=threading.Lock)

    def log(self, line: str) -> None:
        with self.lock, open(self.log_path, "a") as handle:
            handle.write(time.strftime("[%Y-%m-%d %H:%M:%S] ") + line + "\n")


class PrefillEngine(threading.Thread):
    """One request at a time, in arrival order: the queue behind it is what makes a knee."""

    def __init__(self, state: StandinState):
        super().__init__(daemon=True)
        self.state = state
        self.jobs: queue.Queue = queue.Queue()

    def submit(self, tokens: tuple[str, ...]) -> int:
        done = threading.Event()
        answer: dict = {}
        self.jobs.put((tokens, done, answer))
        done.wait(timeout=120)
        return answer.get("cached", 0)

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            tokens, done, answer = job
            state = self.state
            with state.lock:
                hit = max((_common_prefix(tokens, cached) for cached in state.cache), default=0)
            time.sleep(state.timing.prefill_s + state.timing.prefill_per_token_s * (len(tokens) - hit))
            with state.lock:
                state.cache.append(tokens)
                state.prefills.append({"tokens": len(tokens), "cached": hit})
            state.log(f"Prefill batch, #new-seq: 1, #new-token: {len(tokens) - hit}, #cached-token: {hit}, "
                      f"token usage: 0.00, #running-req: 0, #queue-req: {self.jobs.qsize()}, ")
            answer["cached"] = hit
            done.set()


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _handler(state: StandinState, engine: PrefillEngine):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # the test's output stays quiet; the server log is the record
            pass

        def _json(self, payload, status: int = 200) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.startswith("/v1/models"):
                return self._json({"object": "list", "data": [{"id": state.model, "object": "model"}]})
            if self.path.startswith("/model_info"):
                return self._json({"model_path": state.model, "tokenizer_path": state.model, "is_generation": True})
            if self.path.startswith(("/server_info", "/get_server_info")):
                return self._json({"internal_states": [{"avg_spec_accept_length": None}], "standin": True})
            if self.path.startswith("/health"):
                return self._json({})
            self._json({"error": f"the stand-in has no {self.path}"}, 404)

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path.startswith("/flush_cache"):
                with state.lock:
                    state.cache.clear()
                state.log("Cache flushed successfully!")
                return self._json({"message": "Cache flushed."})
            if self.path.startswith(("/generate", "/v1/completions")):
                with state.lock:
                    state.served += 1
                    over = state.served > state.max_requests
                if over:
                    return self._json({"error": "the stand-in's request bound is reached"}, 503)
                return self._generate(body, native=self.path.startswith("/generate"))
            self._json({"error": f"the stand-in has no {self.path}"}, 404)

        def _generate(self, body: dict, *, native: bool) -> None:
            if native:
                prompt = body.get("text") if body.get("text") is not None else body.get("input_ids")
                limit = int((body.get("sampling_params") or {}).get("max_new_tokens") or 16)
            else:
                prompt, limit = body.get("prompt"), int(body.get("max_tokens") or 16)
            tokens = tuple(str(t) for t in prompt) if isinstance(prompt, list) else tuple(str(prompt).split())
            cached = engine.submit(tokens)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            text = ""
            for k in range(1, limit + 1):
                piece = OUTPUT_WORD if k == 1 else " " + OUTPUT_WORD
                text += piece
                meta = {"completion_tokens": k, "prompt_tokens": len(tokens), "cached_tokens": cached}
                if native:
                    chunk = {"text": text, "meta_info": meta}
                else:
                    chunk = {"choices": [{"text": piece, "index": 0, "finish_reason": None}],
                             "usage": {"prompt_tokens": len(tokens), "completion_tokens": k}}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
                if k < limit:
                    time.sleep(state.timing.itl_s)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler


class StandinServer:
    """``with StandinServer(model, log) as server: server.url`` -- started on 127.0.0.1, stopped on exit."""

    def __init__(self, model: str, log_path: Path, timing: Timing | None = None, *, host: str = "127.0.0.1",
                 max_requests: int = 2000, lifetime_s: float = 600):
        if host != "127.0.0.1":
            raise ValueError("the stand-in server listens on the loopback address only")
        self.state = StandinState(model, timing or Timing(), log_path, max_requests)
        self.engine = PrefillEngine(self.state)
        self.httpd = ThreadingHTTPServer((host, 0), _handler(self.state, self.engine))
        self.httpd.daemon_threads = True
        self.lifetime_s = lifetime_s

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "StandinServer":
        self.engine.start()
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self._watchdog = threading.Timer(self.lifetime_s, self.httpd.shutdown)
        self._watchdog.daemon = True
        self._watchdog.start()
        return self

    def __exit__(self, *exc) -> None:
        self._watchdog.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.engine.jobs.put(None)
