"""The OpenAI request bodies ``grpo serve`` accepts, checked field by field: a bad request is an
``ApiError`` whose message names the field (answered 4xx in OpenAI's error format)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from grpo.infra.http import json_depth

ROLES = ("system", "user", "assistant")
MAX_TOP_LOGPROBS = 20  # alternatives per token a request may ask for (OpenAI's chat limit)


class ApiError(Exception):
    """A request the server refuses: HTTP status, the field at fault, a message naming it."""

    def __init__(self, status: int, param: str | None, message: str, code: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.message, self.code = status, param, message, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


@dataclass
class Limits:
    """What one request may ask for."""

    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int = 1024
    max_tokens: int = 1024
    max_json_depth: int = 32
    max_requests: int = 256  # requests at once (any route) before 429
    body_timeout_s: float = 30.0  # seconds a request's whole body may take (408 past it)
    head_timeout_s: float = 10.0  # seconds a request's whole head may take, however it trickles (408 past it)


@dataclass
class Request:
    """A checked request: the model asked for, the chat messages or the raw prompt, sampling."""

    model: str
    messages: list[dict] | None  # chat
    prompt: str | None  # completions
    max_tokens: int | None
    temperature: float | None
    top_p: float
    stream: bool = False  # server-sent events
    include_usage: bool = False  # stream_options.include_usage: a last event with the usage
    top_logprobs: int | None = None  # log-probs asked: that many alternatives per token (None: none asked)


def parse_json(raw: bytes, max_depth: int = 32) -> dict:
    depth = json_depth(raw)
    if depth > max_depth:
        raise ApiError(400, "body", f"body: JSON nested {depth} levels deep, over the limit of {max_depth}")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ApiError(400, "body", f"body: not valid JSON ({str(e)[:120]})") from None
    if not isinstance(body, dict):
        raise ApiError(400, "body", f"body: a JSON object expected, got {type(body).__name__}")
    return body


def _number(body: dict, name: str, lo: float, hi: float) -> float | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ApiError(400, name, f"{name}: a number expected, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise ApiError(400, name, f"{name}: {v} is outside [{lo}, {hi}]")
    return float(v)


def _max_tokens(body: dict, limits: Limits) -> int | None:
    for name in ("max_completion_tokens", "max_tokens"):
        v = body.get(name)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise ApiError(400, name, f"{name}: an integer expected, got {type(v).__name__}")
        if not 1 <= v <= limits.max_tokens:
            raise ApiError(400, name, f"{name}: {v} is outside [1, {limits.max_tokens}] (--max-tokens-limit)")
        return v
    return None


def _text(value: str, name: str) -> str:
    """``value`` where it is valid Unicode; JSON's escapes can spell a lone surrogate ("\\ud800"), which
    no tokenizer can encode: a 400 naming the field instead of a failure deep in the model's lane."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = value[e.start:e.end].encode("utf-8", "backslashreplace").decode()
        raise ApiError(400, name, f"{name}: not valid Unicode (a lone surrogate, {bad}, at character {e.start})") from None
    return value


def _content(m: dict, i: int) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return _text(c, f"messages[{i}].content")
    if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                   for p in c):
        return _text("".join(p["text"] for p in c), f"messages[{i}].content")
    raise ApiError(400, f"messages[{i}].content", f"messages[{i}].content: a string (or text parts) expected, "
                   f"got {type(c).__name__}")


def _messages(body: dict) -> list[dict]:
    msgs = body.get("messages")
    if msgs is None:
        raise ApiError(400, "messages", "messages: required")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "messages", "messages: a non-empty list of {role, content} objects expected")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise ApiError(400, f"messages[{i}]", f"messages[{i}]: an object expected, got {type(m).__name__}")
        if m.get("role") not in ROLES:
            raise ApiError(400, f"messages[{i}].role", f"messages[{i}].role: {m.get('role')!r} is not one of {ROLES}")
        out.append({"role": m["role"], "content": _content(m, i)})
    return out


def _prompt(body: dict) -> str:
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1:
        p = p[0]
    if not isinstance(p, str):
        raise ApiError(400, "prompt", f"prompt: a string expected, got {type(p).__name__}")
    return _text(p, "prompt")


def parse_request(body: dict, *, chat: bool, limits: Limits, models: list[str]) -> Request:
    """The checked request of a /v1/chat/completions (``chat``) or /v1/completions body."""
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "model", "model: required, a string" if model is None else
                       f"model: a string expected, got {type(model).__name__}")
    if model not in models:
        raise ApiError(404, "model", f"model: {model!r} is not served; served: {', '.join(models)}",
                       code="model_not_found")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ApiError(400, "stream", f"stream: true or false expected, got {type(stream).__name__}")
    include_usage = _stream_options(body, stream)
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise ApiError(400, "n", f"n: only 1 completion per request is served, got {n!r}")
    if body.get("stop") is not None:
        raise ApiError(400, "stop", "stop: stop sequences are not supported")
    if body.get("logit_bias"):  # null or {} (what clients send by default) ask for nothing
        raise ApiError(400, "logit_bias", "logit_bias: not applied by this server (the GRPO model's answers are "
                       "its own distribution); send none, null or {}")
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise ApiError(400, "top_p", "top_p: must be > 0")
    top_logprobs = _logprobs(body, chat)
    if top_logprobs is not None and stream:
        raise ApiError(400, "logprobs", "logprobs: not served with stream=true; ask without streaming")
    return Request(model=model, messages=_messages(body) if chat else None, prompt=None if chat else _prompt(body),
                   max_tokens=_max_tokens(body, limits), temperature=_number(body, "temperature", 0.0, 2.0),
                   top_p=1.0 if top_p is None else top_p, stream=stream, include_usage=include_usage,
                   top_logprobs=top_logprobs)


def _count(body: dict, name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, name, f"{name}: an integer expected, got {type(v).__name__}")
    if not 0 <= v <= MAX_TOP_LOGPROBS:
        raise ApiError(400, name, f"{name}: {v} is outside [0, {MAX_TOP_LOGPROBS}]")
    return v


def _logprobs(body: dict, chat: bool) -> int | None:
    """How many alternatives per token the request asks log-probs for (None: no log-probs). Chat:
    ``logprobs`` true and ``top_logprobs`` (0 when absent); completions: ``logprobs`` the count."""
    if not chat:
        return _count(body, "logprobs")
    asked = body.get("logprobs")
    if asked is not None and not isinstance(asked, bool):
        raise ApiError(400, "logprobs", f"logprobs: true or false expected, got {type(asked).__name__}")
    top = _count(body, "top_logprobs")
    if top is not None and not asked:
        raise ApiError(400, "top_logprobs", "top_logprobs: only allowed with logprobs=true")
    return (top or 0) if asked else None


def _stream_options(body: dict, stream: bool) -> bool:
    """``stream_options`` (only with stream=true): {"include_usage": bool}; returns include_usage."""
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not stream:
        raise ApiError(400, "stream_options", "stream_options: only allowed with stream=true")
    if not isinstance(opts, dict):
        raise ApiError(400, "stream_options", f"stream_options: an object expected, got {type(opts).__name__}")
    usage = opts.get("include_usage", False)
    if not isinstance(usage, bool):
        raise ApiError(400, "stream_options.include_usage", "stream_options.include_usage: true or false expected")
    return usage
