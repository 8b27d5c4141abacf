"""The OpenAI-compatible HTTP API on FastAPI: /v1/chat/completions, /v1/completions, /v1/models,
/health and Prometheus /metrics.

Model ``grpo`` runs the scheme (the GRPO model first, the fallback on deadline or an incomplete
answer); model ``base`` asks the fallback model directly. Each answer says which model answered and
why: the fields ``answered_by`` and ``answer_reason`` and the headers ``X-Grpo-Answered-By`` and
``X-Grpo-Reason``. A bad request is a 4xx naming its field, a full queue a 429, a draining server a
503; an error inside one request is a 500 for that request only.
"""

from __future__ import annotations

import hmac
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from grpo.data.tasks import render_prompt
from grpo.serve.batcher import Batcher, Overloaded
from grpo.serve.engines import ServeEngine
from grpo.serve.protocol import ApiError, Limits, parse_json, parse_request
from grpo.serve.scheme import Router, Scheme

MODELS = ("grpo", "base")


class Metrics:
    """The server's Prometheus metrics, in a registry of its own (one per app)."""

    def __init__(self, state: "ServerState"):
        self.registry = r = CollectorRegistry()
        buckets = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
        self.latency = Histogram("grpo_serve_request_seconds", "Latency of answered requests", ["answered_by"],
                                 buckets=buckets, registry=r)
        self.requests = Counter("grpo_serve_requests", "Answered requests by the model that answered",
                                ["answered_by"], registry=r)
        self.fallbacks = Counter("grpo_serve_fallbacks", "Requests the fallback answered, by reason", ["reason"],
                                 registry=r)
        self.errors = Counter("grpo_serve_errors", "Refused or failed requests by HTTP status", ["status"], registry=r)
        depth = Gauge("grpo_serve_queue_depth", "Requests waiting or decoding, by model", ["model"], registry=r)
        depth.labels(model="grpo").set_function(lambda: state.grpo.depth())
        depth.labels(model="base").set_function(lambda: state.fallback.depth())


@dataclass
class ServerState:
    """Everything the routes read: the batchers, the scheme, the limits, the key."""

    grpo: Batcher
    fallback: Batcher
    scheme: Scheme
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = None
    system_prompt: str = ""
    default_temperature: float = 0.0
    draining: bool = False

    @property
    def engine(self) -> ServeEngine:
        return self.grpo.engine


def _error(e: ApiError, metrics: Metrics) -> JSONResponse:
    metrics.errors.labels(status=str(e.status)).inc()
    headers = {"Retry-After": "1"} if e.status in (429, 503) else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, "body", f"body: {declared} bytes, over the limit of {limit} (--max-request-bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "body", f"body: over the limit of {limit} bytes (--max-request-bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


def _check_key(request: Request, key: str | None) -> None:
    if key is None:
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
        raise ApiError(401, "authorization", "authorization: a valid 'Bearer <api key>' header is required",
                       code="invalid_api_key")


async def _answer(state: ServerState, router: Router, request: Request, *, chat: bool):
    """The checked request, its prompt's token count and the scheme's Answer (ApiError when refused)."""
    _check_key(request, state.api_key)
    if state.draining:
        raise ApiError(503, None, "the server is shutting down", code="unavailable")
    req = parse_request(parse_json(await _read_body(request, state.limits.max_body_bytes)), chat=chat,
                        limits=state.limits, models=list(MODELS))
    prompt = render_prompt(state.engine.tokenizer, req.messages, state.system_prompt) if chat else req.prompt
    n_prompt = state.engine.prompt_tokens(prompt)
    if n_prompt > state.limits.max_prompt_tokens:
        name = "messages" if chat else "prompt"
        raise ApiError(400, name, f"{name}: {n_prompt} prompt tokens, over the limit of "
                       f"{state.limits.max_prompt_tokens} (--max-prompt-tokens)")
    temperature = state.default_temperature if req.temperature is None else req.temperature
    sample = {"prompt": req.messages if chat else req.prompt, "answer": None}
    try:
        ans = await router.answer(prompt, sample, max_tokens=req.max_tokens, temperature=temperature,
                                  top_p=req.top_p, direct_fallback=req.model == "base")
    except Overloaded as e:
        raise ApiError(503 if state.draining else 429, None, f"overloaded: {e}", code="overloaded") from None
    return req, n_prompt, ans


def _response(req, n_prompt: int, ans, *, chat: bool) -> JSONResponse:
    """OpenAI's response object, plus who answered and why (fields and headers)."""
    usage = {"prompt_tokens": n_prompt, "completion_tokens": ans.completion_tokens,
             "total_tokens": n_prompt + ans.completion_tokens}
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": ans.text},
                  "finish_reason": ans.finish_reason, "logprobs": None}
    else:
        choice = {"index": 0, "text": ans.text, "finish_reason": ans.finish_reason, "logprobs": None}
    body = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": req.model, "choices": [choice], "usage": usage,
            "answered_by": ans.answered_by, "answer_reason": ans.reason}
    return JSONResponse(body, headers={"X-Grpo-Answered-By": ans.answered_by, "X-Grpo-Reason": ans.reason})


def create_app(state: ServerState, *, on_shutdown=None) -> FastAPI:
    """The FastAPI app over ``state``; ``on_shutdown`` runs after the last in-flight request."""
    app = FastAPI(title="grpo serve", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = Metrics(state)
    router = Router(state.grpo, state.fallback, state.scheme)
    app.state.grpo = state
    app.state.metrics = metrics
    if on_shutdown is not None:
        app.router.add_event_handler("shutdown", on_shutdown)

    async def complete(request: Request, *, chat: bool) -> Response:
        start = time.monotonic()
        try:
            req, n_prompt, ans = await _answer(state, router, request, chat=chat)
        except ApiError as e:
            return _error(e, metrics)
        except Exception as e:  # a failing request is a 500 for it alone; the server keeps serving
            return _error(ApiError(500, None, f"internal error: {type(e).__name__}: {e}", code="internal"), metrics)
        metrics.latency.labels(answered_by=ans.answered_by).observe(time.monotonic() - start)
        metrics.requests.labels(answered_by=ans.answered_by).inc()
        if ans.answered_by != "grpo" and ans.reason != "requested":
            metrics.fallbacks.labels(reason=ans.reason).inc()
        return _response(req, n_prompt, ans, chat=chat)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    @app.get("/v1/models")
    async def models(request: Request):
        try:
            _check_key(request, state.api_key)
        except ApiError as e:
            return _error(e, metrics)
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "grpo"}
                                           for m in MODELS]}

    @app.get("/health")
    async def health():
        status = "draining" if state.draining else "ok"
        return JSONResponse({"status": status, "queue": {"grpo": state.grpo.depth(), "base": state.fallback.depth()}},
                            status_code=503 if state.draining else 200)

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
