"""``rollout_engine=vllm_server``: sampling on a vLLM engine in another process, found by URL.

Like TRL's ``vllm_mode="server"``: the engine runs apart (``grpo vllm-serve MODEL --port N``, on other
GPUs or another node), the trainer connects to ``http://vllm_server_host:vllm_server_port`` and, after
each optimizer step, sends its weights (LoRA merged) as one safetensors file: in the body of the
request (works across machines), or, with ``vllm_server_weight_dir`` set, written to that folder
(one both machines see: /dev/shm on the same one, a shared filesystem) and only its path sent.
vLLM's NCCL weight transfer (trainer and engine GPUs in one communicator, the tensors broadcast
without leaving the GPUs) is not built: on GPUs the weights take the same way through host memory.

Sampling, seeding and the returned log-probs are the colocated engine's (rows.py): one request
per row, seeded with its key. Faults: no server at the URL is an error naming it before the run
starts (after waiting ``vllm_server_timeout`` seconds for one that is starting); a server that stops
answering mid-run (dead, or hung: every call has a connect timeout and a deadline,
``vllm_server_request_timeout`` plus its work's share, ``call_deadline``) is an EngineError naming the
URL, on which the trainer saves its checkpoint and stops. With ``$GRPO_VLLM_API_KEY`` set every call
carries it as a bearer key (the server's ``--api-key``). The client needs no vLLM: only the server does.
"""

from __future__ import annotations

import http.client
import json
import os
import time
from dataclasses import dataclass

from grpo.errors import EngineError
from grpo.infra.http_client import TooLarge, bearer, exchange
from grpo.rollout.engine import ROLLOUT_ENGINES
from grpo.rollout.vllm.rows import SampledRows, VLLMRowsEngine, shared_memory_dir

KEY_ENV = "GRPO_VLLM_API_KEY"
# A call's deadline beyond vllm_server_request_timeout: its work at rates far below any engine's (a
# generated token 10 ms, a scored token 1 ms, weights 10 MB/s), so only a server that stopped passes it.
SECONDS_PER_TOKEN, SECONDS_PER_SCORED_TOKEN, SECONDS_PER_BYTE = 0.01, 0.001, 1e-7


def call_deadline(base: float, *, tokens: int = 0, scored: int = 0, nbytes: int = 0) -> float:
    """Seconds one call may take: ``base`` plus its work's share (generated and scored tokens, bytes sent)."""
    return base + tokens * SECONDS_PER_TOKEN + scored * SECONDS_PER_SCORED_TOKEN + nbytes * SECONDS_PER_BYTE


@dataclass(frozen=True)
class VLLMServerOptions:
    """Where the server is and how long to wait for it (Config fields ``vllm_server_*``)."""

    host: str = "127.0.0.1"  # the `grpo vllm-serve` server's host
    port: int = 8000  # its port
    timeout: float = 240.0  # seconds to wait for it to answer when the run starts
    request_timeout: float = 300.0  # seconds each call may take beyond its work's share (call_deadline)
    weight_dir: str | None = None  # a folder both see: the weights file goes there, only its path is sent


class VLLMServerEngine(VLLMRowsEngine):
    """Sampling on a ``grpo vllm-serve`` server, weights sent after each optimizer step (module docstring)."""

    name = "vllm_server"
    Options = VLLMServerOptions
    standalone = "vllm"  # the server may be sampling for a training run: grpo eval starts its own engine

    def __init__(self, model, tokenizer, *, synced: bool = False, kernels: str = "auto",
                 options: VLLMServerOptions | None = None):
        super().__init__(model, tokenizer, synced=synced, kernels=kernels, options=options)
        if synced:
            raise ValueError("rollout_engine vllm_server: synced (FSDP2) generation is not supported")
        o = self.options
        self.url = f"http://{o.host}:{int(o.port)}"
        self.dead: str | None = None
        self.request_timeout = float(o.request_timeout)
        self.headers = bearer(os.environ.get(KEY_ENV))
        self.server = self._wait_for_server(float(o.timeout))
        self.sync_weights(model)  # the trainer's weights, not the server's folder's

    def _wait_for_server(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = exchange(f"{self.url}/health", method="GET", headers=self.headers, deadline_s=5.0,
                             connect_s=5.0, max_reply_bytes=1 << 16)
                if r.status == 401:
                    raise ValueError(f"rollout_engine vllm_server: the server at {self.url} needs a key; set "
                                     f"${KEY_ENV} to its --api-key")
                if r.status != 200:
                    raise OSError(f"/health answered {r.status}")
                return json.loads(r.body)
            except (OSError, http.client.HTTPException, TooLarge, json.JSONDecodeError) as e:
                if time.monotonic() >= deadline:
                    raise ValueError(f"rollout_engine vllm_server: no vLLM server answers at {self.url} (waited "
                                     f"{timeout:g} s, vllm_server_timeout; start one with `grpo vllm-serve MODEL "
                                     f"--host HOST --port PORT`): {type(e).__name__}: {e}") from None
                time.sleep(0.5)

    def _post(self, what: str, path: str, body: bytes, deadline: float, content_type: str = "application/json") -> dict:
        """POST ``body`` to the server within ``deadline`` seconds; a server that does not answer in
        time (or at all) is an EngineError naming the URL (and every later call fails at once), an
        error it reports a RuntimeError with its message."""
        if self.dead is not None:
            raise EngineError(self.dead)
        try:
            r = exchange(f"{self.url}{path}", body=body, headers={"Content-Type": content_type, **self.headers},
                         deadline_s=deadline, connect_s=min(10.0, deadline), max_reply_bytes=1 << 32)
        except (OSError, http.client.HTTPException, TooLarge) as e:
            self.dead = (f"rollout engine vllm_server: the server at {self.url} stopped answering during {what} "
                         f"({type(e).__name__}: {e}); the run cannot sample any more")
            raise EngineError(self.dead) from e
        if r.status != 200:  # the server answered: an error of the request, not of the server
            hint = f" (set ${KEY_ENV} to the server's --api-key)" if r.status == 401 else ""
            raise RuntimeError(f"vllm server {self.url}{path}: HTTP {r.status}: "
                               f"{r.body[:500].decode(errors='replace')}{hint}")
        return json.loads(r.body)

    def _post_json(self, what: str, path: str, payload: dict, deadline: float) -> dict:
        return self._post(what, path, json.dumps(payload).encode(), deadline)

    def _sample(self, prompts: list[list[int]], params: list[dict]) -> SampledRows:
        tokens = sum(p["max_tokens"] for p in params)
        out = self._post_json("generate", "/generate", {"prompts": prompts, "params": params},
                              call_deadline(self.request_timeout, tokens=tokens))
        return SampledRows(out["token_ids"], out["logprobs"])

    def _score(self, rows: list[list[int]]) -> list[list[float]]:
        deadline = call_deadline(self.request_timeout, scored=sum(len(r) for r in rows))
        return self._post_json("sequence_logprobs", "/score", {"rows": rows}, deadline)["logprobs"]

    def _load_file(self, path: str) -> None:
        deadline = call_deadline(self.request_timeout, nbytes=os.path.getsize(path))
        if self.options.weight_dir:  # a folder the server reads too: only the path travels
            self._post_json("sync_weights", "/update_weights", {"path": path}, deadline)
        else:
            with open(path, "rb") as f:
                self._post("sync_weights", "/update_weights", f.read(), deadline, "application/octet-stream")

    def _weights_folder(self) -> str | None:
        return self.options.weight_dir or shared_memory_dir()

    def close(self) -> None:
        """Leaves the server running (it serves the next run); ``grpo vllm-serve`` ends on SIGTERM."""
        super().close()


ROLLOUT_ENGINES.register(VLLMServerEngine)
