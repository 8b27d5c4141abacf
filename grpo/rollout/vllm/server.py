"""`grpo vllm-serve MODEL`: a vLLM engine behind a small HTTP API, for ``rollout_engine=vllm_server``.

Endpoints (JSON unless said otherwise; with a key, every one needs ``Authorization: Bearer KEY``):
- ``GET /health``: {"ok", "model", "dtype", "pid"}.
- ``POST /generate`` {"prompts": [[token ids]], "params": [SamplingParams keyword arguments]}, one
  request per row: {"token_ids": [[...]], "logprobs": [[...]] or null} (each sampled token's log-prob
  after the sampling settings: log q). The settings are checked (grpo.rollout.vllm.requests): known names, types and
  ranges (``--max-tokens``, ``--max-logprobs``, n = 1), token ids inside the vocabulary, at most
  ``--max-rows`` rows.
- ``POST /score`` {"rows": [[token ids]]}: {"logprobs": [[...]]}, each token's log-prob given the ones
  before it (temperature 1; the first token has none).
- ``POST /update_weights``: a safetensors file of the model's weights (Hugging Face names) as the
  body (``application/octet-stream``), or {"path": file} for a file inside ``--weight-dir`` (the only
  folder it reads by path); its tensors must be the model's, with their shapes; loaded in place, the
  prefix cache dropped: {"loaded": tensors}.
- ``POST /close``: the server stops (as on SIGTERM or SIGINT); only on a server that has a key.

Requests to the engine are served one at a time (vLLM's ``LLM`` is not thread-safe; its own
batching runs within a request), at most ``--max-pending`` waiting (then 429). The network checks
(loopback by default, the key, body limits and deadlines, bounded connections) are grpo.infra.http's.
The engine processes die with the server, killed outright too (grpo.rollout.vllm.worker.die_with_parent_plugin).
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading
from typing import Callable

from grpo.errors import ConfigError
from grpo.infra.http import Gate, GuardedServer, HttpError, Route, add_server_flags, limits_of, parse_json
from grpo.rollout.vllm.requests import (SamplingLimits, check_weights_file, generate_request, model_tensors, token_rows,
                                      weights_path)

KEY_ENV = "GRPO_VLLM_API_KEY"


class ServedLLM:
    """The engine the server drives: a vLLM ``LLM`` (any object with these five members serves)."""

    def __init__(self, llm):
        self.llm = llm
        try:
            self.vocab_size = int(llm.llm_engine.model_config.get_vocab_size())
        except Exception:  # an engine that does not say: vLLM itself refuses out-of-vocabulary ids
            self.vocab_size = None

    def sample(self, prompts, params):
        from grpo.rollout.vllm.rows import llm_sample

        return llm_sample(self.llm, prompts, params)

    def score(self, rows):
        from grpo.rollout.vllm.rows import llm_scores

        return llm_scores(self.llm, rows)

    def load_weights(self, path: str) -> int:
        from grpo.rollout.vllm.rows import llm_load_weights

        return llm_load_weights(self.llm, path)

    def close(self) -> None:
        try:
            self.llm.llm_engine.engine_core.shutdown()
        except Exception:  # an engine that died already
            pass


class EngineServer:
    """The routes over one engine; ``http`` is the listening server (``serve_forever``)."""

    def __init__(self, engine, *, address: tuple[str, int], args, info: dict, reference: dict | None):
        self.engine, self.info, self.reference = engine, info, reference
        self.weight_dir = args.weight_dir
        self.limits = SamplingLimits(max_rows=args.max_rows, max_tokens=args.max_tokens,
                                     max_logprobs=args.max_logprobs, max_row_tokens=args.max_row_tokens)
        self.lock = threading.Lock()
        gate = Gate(args.max_pending, "engine requests")
        http = limits_of(args, env=KEY_ENV)
        self.max_json_depth = http.max_json_depth
        def weights_limit(kind: str) -> int | None:  # a weights file in the body; JSON bodies: the usual limit
            return args.max_weights_bytes if kind.startswith("application/octet-stream") else None

        routes = {("GET", "/health"): Route(lambda body, kind: self.info),
                  ("POST", "/generate"): Route(self.generate, gate=gate),
                  ("POST", "/score"): Route(self.score, gate=gate),
                  ("POST", "/update_weights"): Route(self.update_weights, gate=gate, max_bytes=weights_limit),
                  ("POST", "/close"): Route(self.close)}
        self.http = GuardedServer(address, routes, api_key=args.api_key, limits=http)

    def _json(self, body: bytes) -> dict:
        return parse_json(body, max_depth=self.max_json_depth)

    def generate(self, body: bytes, _type: str) -> dict:
        prompts, params = generate_request(self._json(body), vocab=self.engine.vocab_size, limits=self.limits)
        with self.lock:
            out = self.engine.sample(prompts, params)
        return {"token_ids": out.token_ids, "logprobs": out.logprobs}

    def score(self, body: bytes, _type: str) -> dict:
        rows = token_rows(self._json(body).get("rows"), "rows", vocab=self.engine.vocab_size, limits=self.limits)
        with self.lock:
            return {"logprobs": self.engine.score(rows)}

    def update_weights(self, body: bytes, content_type: str) -> dict:
        if content_type.startswith("application/json"):
            path = weights_path(self._json(body).get("path"), self.weight_dir)
            check_weights_file(path, self.reference)
            with self.lock:
                return {"loaded": self.engine.load_weights(path)}
        from grpo.rollout.vllm.rows import shared_memory_dir

        with tempfile.TemporaryDirectory(prefix="grpo-weights-", dir=shared_memory_dir()) as tmp:
            path = os.path.join(tmp, "weights.safetensors")
            with open(path, "wb") as f:
                f.write(body)
            del body
            check_weights_file(path, self.reference)
            with self.lock:
                return {"loaded": self.engine.load_weights(path)}

    def close(self, _body: bytes, _type: str) -> dict:
        """POST /close: only with the key (the route is keyed; a server without one refuses it)."""
        if self.http.api_key is None:
            raise HttpError(403, None, "close: this server has no key, so it cannot be stopped over HTTP; "
                            "send it SIGTERM")
        self.stop()
        return {"closing": True}

    def stop(self) -> None:
        threading.Thread(target=self.http.shutdown, daemon=True).start()  # shutdown() waits for serve_forever


def vllm_serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpo vllm-serve", description=__doc__.split("\n")[0])
    p.add_argument("model", help="a model folder (or a name vLLM can fetch)")
    p.add_argument("--dtype", default="auto", help="the weights' dtype: the trainer's (float32, bfloat16) "
                   "keeps the train/inference mismatch small")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="GPU: the share of its memory (default 0.9); vLLM's CPU build: the NUMA node's share for "
                   "the KV cache (default 0.2)")
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                   help="no CUDA graphs / compilation (default: eager on the CPU)")
    p.add_argument("--weight-dir", help="the one folder /update_weights reads {'path': ...} from (the "
                   "trainer's vllm_server_weight_dir); unset: weights only in the request body")
    p.add_argument("--max-rows", type=int, default=1024, help="rows of one /generate or /score request")
    p.add_argument("--max-tokens", type=int, default=4096, help="largest max_tokens a row may ask")
    p.add_argument("--max-logprobs", type=int, default=20, help="largest logprobs a row may ask")
    p.add_argument("--max-row-tokens", type=int, default=32768, help="longest prompt (or scored row)")
    p.add_argument("--max-pending", type=int, default=8, help="engine requests at work or waiting before 429")
    p.add_argument("--max-weights-bytes", type=int, default=1 << 37, help="largest weights file in a body")
    add_server_flags(p, port=8000, env=KEY_ENV, max_body_bytes=256 << 20)
    return p


def _start_vllm(a) -> ServedLLM:
    import torch

    from grpo.rollout.vllm.rows import VLLMOptions, start_llm

    cpu = not torch.cuda.is_available()
    try:
        share = a.gpu_memory_utilization or (VLLMOptions.gpu_memory_utilization if cpu else 0.9)
        return ServedLLM(start_llm(a.model, dtype=a.dtype, cpu=cpu,
                                    options=VLLMOptions(gpu_memory_utilization=share, enforce_eager=a.enforce_eager)))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def vllm_serve_main(argv: list[str], *, make_engine: Callable | None = None) -> int:
    """The command; ``make_engine(args)`` builds the engine (default: vLLM on the model)."""
    a = vllm_serve_parser().parse_args(argv)
    limits_of(a, env=KEY_ENV)  # refuse a bad bind before the engine loads
    for name in ("max_rows", "max_tokens", "max_row_tokens", "max_pending", "max_weights_bytes"):
        if getattr(a, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}: must be >= 1")
    if a.weight_dir is not None and not os.path.isdir(a.weight_dir):
        raise ConfigError(f"--weight-dir: {a.weight_dir!r} is not a folder")
    engine = (make_engine or _start_vllm)(a)
    server = EngineServer(engine, address=(a.host, a.port), args=a, reference=model_tensors(a.model),
                          info={"ok": True, "model": a.model, "dtype": a.dtype, "pid": os.getpid()})
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    print(f"grpo vllm-serve: {a.model} at http://{a.host}:{server.http.server_address[1]}"
          f"{' (key required)' if a.api_key else ''}", flush=True)
    try:
        server.http.serve_forever()
    finally:
        server.http.server_close()
        engine.close()
    return 0
