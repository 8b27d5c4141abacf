"""Rewards that wait on something else: ``async def`` reward functions, run concurrently, and rewards
served over HTTP(S), given as a URL in ``rewards``.

Both are batch-form rewards (``grpo.rewards.forms``: one call per step's completions) that keep their
own deadline (their ``Reward`` declares ``own_deadline``), so they run in the trainer's process, not
in the reward workers, and every outcome (a value, or the exception of a
failed sample) goes through ``score_completions``' failure accounting like any other reward's.

The HTTP protocol (docs/guides/rewards.md, "Remote rewards"): one POST per batch with the JSON body
``{"prompts": [...], "completions": [...], "samples": [{...the task row...}, ...]}`` (row i of each list
belongs together), answered with ``{"scores": [float or null, ...]}``, one per completion; null is
"not applicable to this row", as a reward returning None. A timeout, a refused connection,
a 429 or a 5xx is retried ``retries`` times with exponential backoff; a 4xx other than 429, a body that
is not JSON, an answer over ``MAX_REPLY_BYTES`` and a wrong number of scores are not (a retry would get
the same answer) and fail the batch. With ``$GRPO_REWARD_API_KEY`` set, each POST carries it as
``Authorization: Bearer KEY`` (a credential never needs to sit in the URL, which is logged). Each
attempt runs in the calling thread with a deadline for the whole exchange (grpo.infra.http_client), so
an attempt that timed out leaves no thread reading behind.
"""

from __future__ import annotations

import asyncio
import http.client
import inspect
import json
import os
import threading
import time
from typing import Callable

from grpo.infra.http_client import TooLarge, bearer, exchange

DEFAULT_CONCURRENCY = 16
BACKOFF = 0.25  # seconds before the first retry of a URL reward, doubling after each
KEY_ENV = "GRPO_REWARD_API_KEY"
MAX_REPLY_BYTES = 16 << 20  # a batch's scores are a few numbers each
NO_DEADLINE = 24 * 3600.0  # reward_timeout=0 ("none"): still not forever


def is_url(name: str) -> bool:
    return name.startswith(("http://", "https://"))


def is_async(fn) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _run_loop(coro):
    """``asyncio.run(coro)``, or in a thread of its own where this thread already runs an event loop
    (a notebook), which cannot be re-entered."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(out=asyncio.run(coro)), daemon=True)
    thread.start()
    thread.join()
    return box["out"]


class AsyncReward:
    """An ``async def fn(completion, sample)`` reward: a batch's calls run concurrently on one event loop,
    at most ``concurrency`` at a time, each within ``timeout`` seconds (0 = no deadline). A call that
    passes it is cancelled and fails its sample (counted in ``timeouts``). The deadline holds where the
    function awaits; code that blocks the loop without awaiting cannot be interrupted."""

    def __init__(self, fn: Callable, *, timeout: float, concurrency: int = DEFAULT_CONCURRENCY):
        self.fn, self.timeout, self.concurrency = fn, timeout, concurrency
        self.timeouts = 0
        self.__name__ = getattr(fn, "__name__", "async_reward")

    async def _one(self, gate: asyncio.Semaphore, completion: str, sample: dict):
        async with gate:
            try:
                if self.timeout > 0:
                    return await asyncio.wait_for(self.fn(completion, sample), self.timeout)
                return await self.fn(completion, sample)
            except asyncio.TimeoutError:
                self.timeouts += 1
                return TimeoutError(f"did not return within its {self.timeout:g} s deadline")
            except Exception as e:  # one sample's failure, given back as its outcome
                return e

    async def _all(self, completions: list[str], samples: list[dict]) -> list:
        gate = asyncio.Semaphore(self.concurrency)
        return list(await asyncio.gather(*(self._one(gate, c, s) for c, s in zip(completions, samples))))

    def __call__(self, completions: list[str], samples: list[dict]) -> list:
        return _run_loop(self._all(completions, samples))


class _Retryable(Exception):
    """A failure another attempt may not have (timeout, refused connection, 429, 5xx)."""

    def __init__(self, message: str, *, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


def _post(url: str, body: bytes, timeout: float, key_env: str = KEY_ENV) -> bytes:
    """One POST, its whole exchange within ``timeout`` seconds (0 = a day), in this thread; the key in
    the environment variable ``key_env``, when set, as a bearer token."""
    headers = {"Content-Type": "application/json", "Accept": "application/json", **bearer(os.environ.get(key_env))}
    try:
        r = exchange(url, body=body, headers=headers, deadline_s=timeout or NO_DEADLINE,
                     max_reply_bytes=MAX_REPLY_BYTES)
    except TimeoutError:
        raise _Retryable(f"{url} did not answer within the {timeout:g} s deadline", timed_out=True) from None
    except TooLarge as e:
        raise ValueError(str(e)) from None
    except (OSError, http.client.HTTPException) as e:  # refused, reset
        raise _Retryable(f"{url}: {type(e).__name__}: {e}") from None
    if r.status == 200:
        return r.body
    err = f"HTTP {r.status} from {url}: {r.body[:200].decode('utf-8', 'replace')}"
    raise _Retryable(err) if r.status == 429 or r.status >= 500 else RuntimeError(err)


class HttpReward:
    """A reward served at ``url`` (the protocol above): one POST per batch, each attempt within
    ``timeout`` seconds, up to ``retries`` more attempts after a retryable failure (waiting
    ``backoff * 2**attempt`` seconds). A batch that still fails fails every one of its samples with the
    last error; ``timeouts`` counts batches whose last attempt passed the deadline."""

    def __init__(self, url: str, *, timeout: float, retries: int = 2, backoff: float = BACKOFF):
        self.url, self.timeout, self.retries, self.backoff = url, timeout, retries, backoff
        self.timeouts = 0
        self._count_lock = threading.Lock()  # requests may run in several threads (the judge's)
        self.__name__ = url

    key_env = KEY_ENV  # the environment variable whose key each POST carries

    def _post_retrying(self, url: str, body: bytes) -> bytes:
        """POST ``body`` to ``url``, retried as the class docstring says; the answer's body, or
        TimeoutError / ConnectionError after the last attempt (a timeout counted in ``timeouts``)."""
        for attempt in range(self.retries + 1):
            try:
                return _post(url, body, self.timeout, self.key_env)
            except _Retryable as e:
                if attempt == self.retries:
                    if e.timed_out:
                        with self._count_lock:
                            self.timeouts += 1
                        raise TimeoutError(f"{e} ({attempt + 1} attempts)") from None
                    raise ConnectionError(f"{e} ({attempt + 1} attempts)") from None
                time.sleep(self.backoff * 2 ** attempt)
        raise AssertionError("unreachable")

    def _scores(self, body: bytes, n: int) -> list:
        raw = self._post_retrying(self.url, body)
        try:
            scores = json.loads(raw)["scores"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{self.url} answered {raw[:200]!r}, not JSON with a 'scores' list") from None
        if not isinstance(scores, list) or len(scores) != n:
            got = len(scores) if isinstance(scores, list) else type(scores).__name__
            raise ValueError(f"{self.url} returned {got} scores for {n} completions")
        return scores

    def __call__(self, completions: list[str], samples: list[dict]) -> list:
        body = json.dumps({"prompts": [s.get("prompt") for s in samples], "completions": list(completions),
                           "samples": samples}, default=str).encode()
        try:
            return self._scores(body, len(completions))
        except Exception as e:  # the batch's failure is each of its samples'
            return [e] * len(completions)


