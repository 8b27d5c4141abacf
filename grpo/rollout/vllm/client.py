"""``rollout_engine=vllm_server``: sampling on vLLM engines in other processes, found by URL.

Like TRL's ``vllm_mode="server"``: the engine runs apart (``grpo vllm-serve MODEL --port N``, on other
GPUs or another node), the trainer connects to ``http://vllm_server_host:vllm_server_port`` (or to
each of several servers, ``vllm_server_urls``) and, after each optimizer step, sends its weights
(LoRA merged) as one safetensors file: in the body of the request (works across machines), or, with
``vllm_server_weight_dir`` set, written to that folder (one both machines see: /dev/shm on the same
one, a shared filesystem) and only its path sent. vLLM's NCCL weight transfer (trainer and engine GPUs
in one communicator, the tensors broadcast without leaving the GPUs) is not built: on GPUs the weights
take the same way through host memory.

Sampling, seeding and the returned log-probs are the colocated engine's (rows.py): one request
per row, seeded with its key, so any server with the same weights draws a row's same tokens. Several
servers: each call's groups are spread over the servers in use, whole groups in contiguous, near-equal
blocks, the requests sent at once (as prime-rl's router spreads over its vLLM replicas).

Faults: no server at a URL is an error naming it before the run starts (after waiting
``vllm_server_timeout`` seconds for one that is starting). Every call has a connect timeout and a
deadline (``vllm_server_request_timeout`` plus its work's share, ``call_deadline``). A server that stops
answering mid-run (dead, or hung) is skipped with a warning: its groups are sampled again on the others
from the same keys (the same tokens), and it is asked again every ``RETRY_SECONDS``; once it answers
and has taken the current weights it samples again. When no server is left, the call is an
EngineError naming the URL, on which the trainer saves its checkpoint and stops. With
``$GRPO_VLLM_API_KEY`` set every call carries it as a bearer key (the servers' ``--api-key``). The
client needs no vLLM: only the servers do.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from grpo.errors import EngineError
from grpo.infra.http_client import TooLarge, bearer, exchange
from grpo.rollout.engine import ROLLOUT_ENGINES
from grpo.rollout.vllm.rows import SampledRows, VLLMRowsEngine, shared_memory_dir

log = logging.getLogger("grpo.rollout")

KEY_ENV = "GRPO_VLLM_API_KEY"
RETRY_SECONDS = 10.0  # a skipped server is asked again at most this often
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
    urls: str = ""  # several servers, comma-separated http://host:port (replaces host and port)


class Unreachable(Exception):
    """A server that did not answer a call (refused, reset, or past its deadline)."""


@dataclass
class Server:
    """One ``grpo vllm-serve`` server: its URL and since when it is skipped (None: in use)."""

    url: str
    skipped_at: float | None = None
    why: str = ""  # what the last failure was


def server_urls(options: VLLMServerOptions) -> list[str]:
    """The servers' base URLs: ``urls`` (each http://host:port, no path), else host and port. ValueError
    naming vllm_server_urls for one that is not such a URL."""
    if not options.urls.strip():
        return [f"http://{options.host}:{int(options.port)}"]
    out = []
    for raw in options.urls.split(","):
        url = raw.strip().rstrip("/")
        rest = url.split("://", 1)[-1]
        if not url.startswith(("http://", "https://")) or not rest or "/" in rest:
            raise ValueError(f"vllm_server_urls: {raw.strip()!r} is not a server URL such as http://host:8000")
        out.append(url)
    if len(set(out)) != len(out):
        raise ValueError(f"vllm_server_urls: a server is named twice in {options.urls!r}")
    return out


def blocks(items: list, parts: int) -> list[list]:
    """``items`` in ``parts`` contiguous blocks whose sizes differ by at most one."""
    return [items[i * len(items) // parts:(i + 1) * len(items) // parts] for i in range(parts)]


class VLLMServerEngine(VLLMRowsEngine):
    """Sampling on ``grpo vllm-serve`` servers, weights sent after each optimizer step (module docstring)."""

    name = "vllm_server"
    Options = VLLMServerOptions
    standalone = "vllm"  # the server may be sampling for a training run: grpo eval starts its own engine

    def __init__(self, model, tokenizer, *, synced: bool = False, kernels: str = "auto",
                 options: VLLMServerOptions | None = None):
        super().__init__(model, tokenizer, synced=synced, kernels=kernels, options=options)
        if synced:
            raise ValueError("rollout_engine vllm_server: synced (FSDP2) generation is not supported")
        o = self.options
        self.servers = [Server(url) for url in server_urls(o)]
        self.url = self.servers[0].url
        self.dead: str | None = None
        self.request_timeout = float(o.request_timeout)
        self.headers = bearer(os.environ.get(KEY_ENV))
        for s in self.servers[1:]:
            self._wait_for_server(s.url, float(o.timeout))
        self.server = self._wait_for_server(self.url, float(o.timeout))  # the first one's /health
        self.sync_weights(model)  # the trainer's weights, not the server's folder's

    def _wait_for_server(self, url: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                r = exchange(f"{url}/health", method="GET", headers=self.headers, deadline_s=5.0,
                             connect_s=5.0, max_reply_bytes=1 << 16)
                if r.status == 401:
                    raise ValueError(f"rollout_engine vllm_server: the server at {url} needs a key; set "
                                     f"${KEY_ENV} to its --api-key")
                if r.status != 200:
                    raise OSError(f"/health answered {r.status}")
                return json.loads(r.body)
            except (OSError, http.client.HTTPException, TooLarge, json.JSONDecodeError) as e:
                if time.monotonic() >= deadline:
                    raise ValueError(f"rollout_engine vllm_server: no vLLM server answers at {url} (waited "
                                     f"{timeout:g} s, vllm_server_timeout; start one with `grpo vllm-serve MODEL "
                                     f"--host HOST --port PORT`): {type(e).__name__}: {e}") from None
                time.sleep(0.5)

    # ---- one server ----------------------------------------------------------------------------
    def _post(self, server: Server, what: str, path: str, body: bytes, deadline: float,
              content_type: str = "application/json") -> dict:
        """POST ``body`` to ``server`` within ``deadline`` seconds: Unreachable when it does not answer in
        time (or at all), a RuntimeError with its message when it answers an error."""
        try:
            r = exchange(f"{server.url}{path}", body=body, headers={"Content-Type": content_type, **self.headers},
                         deadline_s=deadline, connect_s=min(10.0, deadline), max_reply_bytes=1 << 32)
        except (OSError, http.client.HTTPException, TooLarge) as e:
            raise Unreachable(f"the server at {server.url} stopped answering during {what} "
                              f"({type(e).__name__}: {e})") from e
        if r.status != 200:  # the server answered: an error of the request, not of the server
            hint = f" (set ${KEY_ENV} to the server's --api-key)" if r.status == 401 else ""
            raise RuntimeError(f"vllm server {server.url}{path}: HTTP {r.status}: "
                               f"{r.body[:500].decode(errors='replace')}{hint}")
        return json.loads(r.body)

    def _send_weights(self, server: Server, path: str) -> None:
        deadline = call_deadline(self.request_timeout, nbytes=os.path.getsize(path))
        if self.options.weight_dir:  # a folder the server reads too: only the path travels
            self._post(server, "sync_weights", "/update_weights", json.dumps({"path": path}).encode(), deadline)
        else:
            with open(path, "rb") as f:
                self._post(server, "sync_weights", "/update_weights", f.read(), deadline, "application/octet-stream")

    # ---- the servers in use --------------------------------------------------------------------
    def _skip(self, server: Server, err: Unreachable) -> None:
        server.skipped_at, server.why = time.monotonic(), str(err)
        if len(self.servers) > 1:
            log.warning("rollout engine vllm_server: %s; skipped (its groups go to the other servers) until it "
                        "answers again", err)

    def _in_use(self) -> list[Server]:
        """The servers that answer; a skipped one asked again (every RETRY_SECONDS) is used again once it
        answers and has taken the current weights. EngineError when none answers (and at every later call)."""
        if self.dead is None and len(self.servers) > 1:  # one server: the run stops with it, as before
            last = all(s.skipped_at is not None for s in self.servers)  # then each is asked once more now
            for s in self.servers:
                if s.skipped_at is not None and (last or time.monotonic() - s.skipped_at >= RETRY_SECONDS):
                    self._revive(s)
        if self.dead is None and all(s.skipped_at is not None for s in self.servers):
            why = self.servers[0].why if len(self.servers) == 1 else \
                "no server answers (" + "; ".join(s.why for s in self.servers) + ")"
            self.dead = f"rollout engine vllm_server: {why}; the run cannot sample any more"
        if self.dead is not None:
            raise EngineError(self.dead)
        return [s for s in self.servers if s.skipped_at is None]

    def _revive(self, server: Server) -> None:
        try:
            self._wait_for_server(server.url, 0.0)
            with self._weights_file(self.model) as path:
                self._send_weights(server, path)
        except (ValueError, Unreachable, RuntimeError) as e:
            server.skipped_at, server.why = time.monotonic(), server.why or str(e)
            return
        server.skipped_at = None
        log.warning("rollout engine vllm_server: the server at %s answers again and has the current weights; "
                    "it samples again", server.url)

    def _each(self, items: list, call) -> list:
        """``call(item)`` on each item (a server, or a server and its groups) at once, each a call to one
        server; each one's result, or the Unreachable it raised (an error a server answered is raised)."""
        def guarded(item):
            try:
                return call(item)
            except Unreachable as e:
                return e
        if len(items) == 1:
            return [guarded(items[0])]
        with ThreadPoolExecutor(max_workers=len(items)) as pool:
            return list(pool.map(guarded, items))

    # ---- the engine's calls --------------------------------------------------------------------
    def _sample(self, prompts: list[list[int]], params: list[dict], *, group_size: int = 1) -> SampledRows:
        """Whole groups spread over the servers in use; a server's groups again on the others when it
        stops answering (the same keys: the same tokens)."""
        ids: list = [None] * len(prompts)
        logps: list = [None] * len(prompts)
        todo = list(range(len(prompts) // group_size))  # groups not sampled yet
        while todo:
            servers = self._in_use()
            parts = [(s, b) for s, b in zip(servers, blocks(todo, len(servers))) if b]

            def call(part):
                server, groups = part
                rows = [r for g in groups for r in range(g * group_size, (g + 1) * group_size)]
                body = {"prompts": [prompts[r] for r in rows], "params": [params[r] for r in rows]}
                deadline = call_deadline(self.request_timeout, tokens=sum(params[r]["max_tokens"] for r in rows))
                return rows, self._post(server, "generate", "/generate", json.dumps(body).encode(), deadline)
            todo = []
            for (server, groups), got in zip(parts, self._each(parts, call)):
                if isinstance(got, Unreachable):
                    self._skip(server, got)
                    todo += groups
                    continue
                rows, out = got
                for i, r in enumerate(rows):
                    ids[r] = out["token_ids"][i]
                    logps[r] = out["logprobs"][i] if out.get("logprobs") is not None else None
            todo.sort()
        return SampledRows(ids, None if any(lp is None for lp in logps) else logps)

    def _score(self, rows: list[list[int]]) -> list[list[float]]:
        deadline = call_deadline(self.request_timeout, scored=sum(len(r) for r in rows))
        body = json.dumps({"rows": rows}).encode()
        while True:
            server = self._in_use()[0]
            try:
                return self._post(server, "sequence_logprobs", "/score", body, deadline)["logprobs"]
            except Unreachable as e:
                self._skip(server, e)

    def _load_file(self, path: str) -> None:
        """The weights to every server in use, at once; one that does not take them is skipped."""
        servers = self._in_use()
        for server, got in zip(servers, self._each(servers, lambda s: self._send_weights(s, path))):
            if isinstance(got, Unreachable):
                self._skip(server, got)
        self._in_use()  # EngineError when none took them

    def _weights_folder(self) -> str | None:
        return self.options.weight_dir or shared_memory_dir()

    def close(self) -> None:
        """Leaves the servers running (they serve the next run); ``grpo vllm-serve`` ends on SIGTERM."""
        super().close()


ROLLOUT_ENGINES.register(VLLMServerEngine)
