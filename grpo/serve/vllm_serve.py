"""`grpo vllm-serve MODEL`: a vLLM engine behind a small HTTP API, for ``rollout_backend=vllm_server``.

Endpoints (JSON unless said otherwise):
- ``GET /health``: {"ok", "model", "dtype", "pid"}.
- ``POST /generate`` {"prompts": [[token ids]], "params": [SamplingParams keyword arguments]}, one
  request per row: {"token_ids": [[...]], "logprobs": [[...]] or null} (each sampled token's log-prob
  after temperature).
- ``POST /score`` {"rows": [[token ids]]}: {"logprobs": [[...]]}, each token's log-prob given the ones
  before it (temperature 1; the first token has none).
- ``POST /update_weights``: a safetensors file of the model's weights (Hugging Face names) as the
  body (``application/octet-stream``), or {"path": file} for one the server can read; loaded in
  place, the prefix cache dropped: {"loaded": tensors}.
- ``POST /close``: the server stops (as on SIGTERM or SIGINT).

Requests to the engine are served one at a time (vLLM's ``LLM`` is not thread-safe; its own
batching runs within a request). The engine processes die with the server, killed outright too
(grpo.rollout.vllm_worker.die_with_parent_plugin).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from grpo.errors import ConfigError
from grpo.rollout.vllm_rows import llm_load_weights, llm_sample, llm_scores, shared_memory_dir, start_llm


class _Handler(BaseHTTPRequestHandler):
    server: "EngineServer"

    def log_message(self, fmt, *args):  # one line per request on stderr is noise for a trainer's loop
        pass

    def _answer(self, code: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/health":
            self._answer(200, self.server.info)
        else:
            self._answer(404, {"error": f"no endpoint GET {self.path}"})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        route = {"/generate": self.server.generate, "/score": self.server.score,
                 "/update_weights": self.server.update_weights, "/close": self.server.close}.get(self.path)
        if route is None:
            self._answer(404, {"error": f"no endpoint POST {self.path}"})
            return
        try:
            self._answer(200, route(body, self.headers.get("Content-Type", "")))
        except (KeyError, TypeError, ValueError) as e:  # a malformed request: the engine is fine
            self._answer(400, {"error": f"{type(e).__name__}: {e}"})
        except Exception as e:
            self._answer(500, {"error": f"{type(e).__name__}: {e}"})


class EngineServer(ThreadingHTTPServer):
    """The HTTP server holding one vLLM ``LLM``; each route takes the raw body and its content type."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], llm, info: dict):
        super().__init__(address, _Handler)
        self.llm, self.info = llm, info
        self.lock = threading.Lock()

    def generate(self, body: bytes, _type: str) -> dict:
        req = json.loads(body)
        with self.lock:
            out = llm_sample(self.llm, req["prompts"], req["params"])
        return {"token_ids": out.token_ids, "logprobs": out.logprobs}

    def score(self, body: bytes, _type: str) -> dict:
        rows = json.loads(body)["rows"]
        with self.lock:
            return {"logprobs": llm_scores(self.llm, rows)}

    def update_weights(self, body: bytes, content_type: str) -> dict:
        if content_type.startswith("application/json"):
            with self.lock:
                return {"loaded": llm_load_weights(self.llm, json.loads(body)["path"])}
        with tempfile.TemporaryDirectory(prefix="grpo-weights-", dir=shared_memory_dir()) as tmp:
            path = os.path.join(tmp, "weights.safetensors")
            with open(path, "wb") as f:
                f.write(body)
            del body
            with self.lock:
                return {"loaded": llm_load_weights(self.llm, path)}

    def close(self, _body: bytes = b"", _type: str = "") -> dict:
        threading.Thread(target=self.shutdown, daemon=True).start()  # shutdown() waits for serve_forever
        return {"closing": True}


def vllm_serve_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="grpo vllm-serve", description=__doc__.split("\n")[0])
    p.add_argument("model", help="a model folder (or a name vLLM can fetch)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", default="auto", help="the weights' dtype: the trainer's (float32, bfloat16) "
                   "keeps the train/inference mismatch small")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="GPU: the share of its memory (default 0.9); vLLM's CPU build: the NUMA node's share for "
                   "the KV cache (default 0.2)")
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                   help="no CUDA graphs / compilation (default: eager on the CPU)")
    a = p.parse_args(argv)
    import torch

    cpu = not torch.cuda.is_available()
    try:
        llm = start_llm(a.model, dtype=a.dtype, cpu=cpu, options={
            "gpu_memory_utilization": a.gpu_memory_utilization or (0.2 if cpu else 0.9), "enforce_eager": a.enforce_eager})
    except ValueError as e:
        raise ConfigError(str(e)) from None
    server = EngineServer((a.host, a.port), llm, {"ok": True, "model": a.model, "dtype": a.dtype, "pid": os.getpid()})
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.close())
    print(f"grpo vllm-serve: {a.model} at http://{a.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # an engine that died already
            pass
    return 0
