"""``rollout_backend=vllm_server``: sampling on a vLLM engine in another process, found by URL.

Like TRL's ``vllm_mode="server"``: the engine runs apart (``grpo vllm-serve MODEL --port N``, on other
GPUs or another node), the trainer connects to ``http://vllm_server_host:vllm_server_port`` and, after
each optimizer step, sends its weights (LoRA merged) as one safetensors file: in the body of the
request (works across machines), or, with ``vllm_server_weight_dir`` set, written to that folder
(one both machines see: /dev/shm on the same one, a shared filesystem) and only its path sent.
vLLM's NCCL weight transfer (trainer and engine GPUs in one communicator, the tensors broadcast
without leaving the GPUs) is not built: on GPUs the weights take the same way through host memory.

Sampling, seeding and the returned log-probs are the colocated engine's (vllm_rows.py): one request
per row, seeded with its key. Faults: no server at the URL is an error naming it before the run
starts (after waiting ``vllm_server_timeout`` seconds for one that is starting); a server that stops
answering mid-run is an EngineError, on which the trainer saves its checkpoint and stops. The client
needs no vLLM: only the server does.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request

from grpo.errors import EngineError
from grpo.rollout.engine import register
from grpo.rollout.vllm_rows import SampledRows, VLLMRowsEngine


@register
class VLLMServerEngine(VLLMRowsEngine):
    """Sampling on a ``grpo vllm-serve`` server, weights sent after each optimizer step (module docstring)."""

    name = "vllm_server"

    def __init__(self, model, tokenizer, *, synced: bool = False, kernels: str = "auto", options: dict | None = None):
        super().__init__(model, tokenizer, synced=synced, kernels=kernels, options=options)
        if synced:
            raise ValueError("rollout_backend vllm_server: synced (FSDP2) generation is not supported")
        o = self.options
        self.url = f"http://{o.get('host', '127.0.0.1')}:{int(o.get('port', 8000))}"
        self.dead: str | None = None
        self.server = self._wait_for_server(float(o.get("timeout", 240.0)))
        self.sync_weights(model)  # the trainer's weights, not the server's folder's

    def _wait_for_server(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    return json.loads(r.read())
            except (OSError, http.client.HTTPException, ValueError) as e:
                if time.monotonic() >= deadline:
                    raise ValueError(f"rollout_backend vllm_server: no vLLM server answers at {self.url} (waited "
                                     f"{timeout:g} s, vllm_server_timeout; start one with `grpo vllm-serve MODEL "
                                     f"--host HOST --port PORT`): {type(e).__name__}: {e}") from None
                time.sleep(0.5)

    def _post(self, what: str, path: str, body: bytes, content_type: str = "application/json") -> dict:
        """POST ``body`` to the server; a server that does not answer is an EngineError naming the URL
        (and every later call fails at once), an error it reports a RuntimeError with its message."""
        if self.dead is not None:
            raise EngineError(self.dead)
        req = urllib.request.Request(f"{self.url}{path}", data=body, method="POST",
                                     headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # the server answered: an error of the request, not of the server
            raise RuntimeError(f"vllm server {self.url}{path}: {e.read().decode(errors='replace')}") from e
        except (OSError, http.client.HTTPException) as e:
            self.dead = (f"rollout engine vllm_server: the server at {self.url} stopped answering during {what} "
                         f"({type(e).__name__}: {e}); the run cannot sample any more")
            raise EngineError(self.dead) from e

    def _post_json(self, what: str, path: str, payload: dict) -> dict:
        return self._post(what, path, json.dumps(payload).encode())

    def _sample(self, prompts: list[list[int]], params: list[dict]) -> SampledRows:
        out = self._post_json("generate", "/generate", {"prompts": prompts, "params": params})
        return SampledRows(out["token_ids"], out["logprobs"])

    def _score(self, rows: list[list[int]]) -> list[list[float]]:
        return self._post_json("sequence_logprobs", "/score", {"rows": rows})["logprobs"]

    def _load_file(self, path: str) -> None:
        if self.options.get("weight_dir"):  # a folder the server reads too: only the path travels
            self._post_json("sync_weights", "/update_weights", {"path": path})
        else:
            with open(path, "rb") as f:
                self._post("sync_weights", "/update_weights", f.read(), "application/octet-stream")

    def close(self) -> None:
        """Leaves the server running (it serves the next run); ``grpo vllm-serve`` ends on SIGTERM."""
        super().close()
