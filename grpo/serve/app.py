"""The OpenAI-compatible HTTP API on FastAPI: /v1/chat/completions, /v1/completions (both also as
server-sent events with ``stream: true``, grpo.serve.stream), /v1/models, /health and Prometheus
/metrics.

Model ``grpo`` runs the scheme (the GRPO model first, the fallback on deadline or an incomplete
answer); model ``base`` asks the fallback model directly. Each answer says which model answered and
why: the fields ``answered_by`` and ``answer_reason`` and the headers ``X-Grpo-Answered-By`` and
``X-Grpo-Reason``. A bad request is a 4xx naming its field, a full queue a 429, a draining server a
503; an error inside one request is a 500 for that request only. With a key every route needs it,
/health and /metrics included. The network checks are grpo.infra.http's: ``Content-Length`` checked
before the body is read (411/400/413), the whole body within ``body_timeout_s`` (408), JSON depth
bounded, at most ``max_requests`` requests at once (429), and a request the HTTP parser refuses is a
JSON 400 too (``JsonErrorH11``).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from uvicorn.protocols.http.h11_impl import H11Protocol

from grpo.data.tasks import render_prompt
from grpo.infra.http import HttpError, body_length, key_matches
from grpo.serve.batcher import Lane, Overloaded
from grpo.serve.logprobs import chat_logprobs, completion_logprobs
from grpo.serve.protocol import ApiError, Limits, parse_json, parse_request
from grpo.serve.scheme import Router, Scheme
from grpo.serve.stream import stream_answer

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

    def answered(self, answered_by: str, reason: str, seconds: float) -> None:
        self.latency.labels(answered_by=answered_by).observe(seconds)
        self.requests.labels(answered_by=answered_by).inc()
        if answered_by != "grpo" and reason != "requested":
            self.fallbacks.labels(reason=reason).inc()


@dataclass
class ServerState:
    """Everything the routes read: the two models' lanes, the scheme, the limits, the key. ``noted``:
    the fallback is another model (its answers carry the note); ``scheduler``: what drives the lanes
    (its ``stop()`` finishes their requests and ends it)."""

    grpo: Lane
    fallback: Lane
    scheme: Scheme
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = None
    system_prompt: str = ""
    default_temperature: float = 0.0
    draining: bool = False
    in_flight: int = 0  # requests being answered, any route
    noted: bool = True
    scheduler: object = None

    @property
    def engine(self):
        return self.grpo.engine


def error_response(e: ApiError, metrics: Metrics) -> JSONResponse:
    metrics.errors.labels(status=str(e.status)).inc()
    headers = {"Retry-After": "1"} if e.status in (429, 503) else None
    if e.status == 503:  # draining: this connection will not be served again
        headers["Connection"] = "close"
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


async def _read_body(request: Request, limits) -> bytes:
    """The body, after ``Content-Length`` is checked (nothing read before), within the body deadline."""
    try:
        n = body_length(request.headers, limits.max_body_bytes)
    except HttpError as e:
        raise ApiError(e.status, e.field, f"{e.message} (--max-request-bytes)" if e.status == 413 else e.message) from None

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > n:
                raise ApiError(400, "body", f"body: longer than its Content-Length {n}")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, "body", f"body: did not arrive within {limits.body_timeout_s:g} s") from None


def _check_key(request: Request, key: str | None) -> None:
    if not key_matches(request.headers.get("authorization"), key):
        raise ApiError(401, "authorization", "authorization: a valid 'Bearer <api key>' header is required",
                       code="invalid_api_key")


class JsonErrorH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol whose refusal of a malformed request (a bad Content-Length, a broken
    head) is a JSON body like every other error of the server, as is a body cut short by the client
    (uvicorn would close without a word); and a request head has ``head_timeout_s`` for all of it
    (uvicorn reads a head a byte at a time for as long as it trickles): past it a 408 and the
    connection is closed. The timer runs from the connection's start, and again after each answer on a
    kept-alive connection, until the head is whole."""

    head_timeout_s: float = 10.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_expired)

    def data_received(self, data: bytes) -> None:
        import h11

        super().data_received(data)
        if self.conn.their_state is not h11.IDLE and self._head_timer is not None:  # the head is whole
            self._head_timer.cancel()
            self._head_timer = None

    def on_response_complete(self) -> None:
        import h11

        super().on_response_complete()  # may already have read a pipelined request's whole head
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_expired)

    def connection_lost(self, exc) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _head_expired(self) -> None:
        import h11

        self._head_timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        body = json.dumps(ApiError(408, "head", f"head: the request line and headers took over "
                                   f"{self.head_timeout_s:g} s").body()).encode()
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                             b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
        self.transport.close()

    def send_400_response(self, msg: str, field: str | None = None) -> None:
        import h11

        body = json.dumps(ApiError(400, field, f"{field or 'request'}: {msg}").body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close")]
        try:
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # a response already begun: nothing more can be said
            pass
        self.transport.close()

    def eof_received(self) -> None:
        import h11

        if self.conn.their_state is h11.SEND_BODY and self.conn.our_state is h11.SEND_RESPONSE:
            self.send_400_response("the connection ended before the body its Content-Length declared", "body")


class RequestLimit:
    """ASGI: at most ``state.limits.max_requests`` requests at once (429 past it), counted in
    ``state.in_flight`` (the drain waits for it to reach 0)."""

    def __init__(self, app, state: "ServerState"):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        st = self.state
        if st.in_flight >= st.limits.max_requests:
            body = json.dumps(ApiError(429, None, "busy: too many requests at once; retry later",
                                       code="overloaded").body()).encode()
            await send({"type": "http.response.start", "status": 429, "headers": [
                (b"content-type", b"application/json"), (b"retry-after", b"1"), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})
            return
        st.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            st.in_flight -= 1


@dataclass
class Prepared:
    """A checked request, ready for the scheme."""

    req: object  # protocol.Request
    prompt: str
    n_prompt: int
    sample: dict
    temperature: float


async def _prepare(state: ServerState, request: Request, *, chat: bool) -> Prepared:
    """The key, the drain, the body and the prompt's length checked (ApiError when refused)."""
    _check_key(request, state.api_key)
    if state.draining:
        raise ApiError(503, None, "the server is shutting down", code="unavailable")
    req = parse_request(parse_json(await _read_body(request, state.limits), state.limits.max_json_depth), chat=chat,
                        limits=state.limits, models=list(MODELS))
    prompt = render_prompt(state.engine.tokenizer, req.messages, state.system_prompt) if chat else req.prompt
    n_prompt = state.engine.prompt_tokens(prompt)
    if n_prompt > state.limits.max_prompt_tokens:
        name = "messages" if chat else "prompt"
        raise ApiError(400, name, f"{name}: {n_prompt} prompt tokens, over the limit of "
                       f"{state.limits.max_prompt_tokens} (--max-prompt-tokens)")
    temperature = state.default_temperature if req.temperature is None else req.temperature
    return Prepared(req, prompt, n_prompt, {"prompt": req.messages if chat else req.prompt, "answer": None}, temperature)


def overloaded(state: ServerState, e: Overloaded) -> ApiError:
    return ApiError(503 if state.draining else 429, None, f"overloaded: {e}", code="overloaded")


async def _answer(state: ServerState, router: Router, p: Prepared):
    """The scheme's Answer (ApiError when refused)."""
    try:
        return await router.answer(p.prompt, p.sample, max_tokens=p.req.max_tokens, temperature=p.temperature,
                                   top_p=p.req.top_p, direct_fallback=p.req.model == "base",
                                   top_logprobs=p.req.top_logprobs)
    except Overloaded as e:
        raise overloaded(state, e) from None


def _response(req, n_prompt: int, ans, *, chat: bool, tokenizer) -> JSONResponse:
    """OpenAI's response object, plus who answered and why (fields and headers); ``tokenizer``: the
    answering model's, for the log-probs' token texts."""
    usage = {"prompt_tokens": n_prompt, "completion_tokens": ans.completion_tokens,
             "total_tokens": n_prompt + ans.completion_tokens}
    logprobs = None if ans.logprobs is None else \
        chat_logprobs(ans.logprobs, tokenizer) if chat else completion_logprobs(ans.logprobs, tokenizer)
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": ans.text},
                  "finish_reason": ans.finish_reason, "logprobs": logprobs}
    else:
        choice = {"index": 0, "text": ans.text, "finish_reason": ans.finish_reason, "logprobs": logprobs}
    body = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": req.model, "choices": [choice], "usage": usage,
            "answered_by": ans.answered_by, "answer_reason": ans.reason}
    return JSONResponse(body, headers={"X-Grpo-Answered-By": ans.answered_by, "X-Grpo-Reason": ans.reason})


def create_app(state: ServerState, *, on_shutdown=None) -> FastAPI:
    """The FastAPI app over ``state``; ``on_shutdown`` runs after the last in-flight request."""
    app = FastAPI(title="grpo serve", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = Metrics(state)
    router = Router(state.grpo, state.fallback, state.scheme, noted=state.noted)
    app.state.grpo = state
    app.state.metrics = metrics
    if on_shutdown is not None:
        app.router.add_event_handler("shutdown", on_shutdown)
    app.add_middleware(RequestLimit, state=state)

    def keyed(request: Request) -> Response | None:
        try:
            _check_key(request, state.api_key)
        except ApiError as e:
            return error_response(e, metrics)
        return None

    async def complete(request: Request, *, chat: bool) -> Response:
        start = time.monotonic()
        try:
            p = await _prepare(state, request, chat=chat)
            if p.req.stream:
                return await stream_answer(state, router, metrics, p, chat=chat, start=start)
            ans = await _answer(state, router, p)
        except ApiError as e:
            return error_response(e, metrics)
        except Overloaded as e:
            return error_response(overloaded(state, e), metrics)
        except Exception as e:  # a failing request is a 500 for it alone; the server keeps serving
            return error_response(ApiError(500, None, f"internal error: {type(e).__name__}: {e}", code="internal"), metrics)
        metrics.answered(ans.answered_by, ans.reason, time.monotonic() - start)
        lane = state.grpo if ans.answered_by == "grpo" else state.fallback
        return _response(p.req, p.n_prompt, ans, chat=chat, tokenizer=lane.engine.tokenizer)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, chat=False)

    @app.get("/v1/models")
    async def models(request: Request):
        if (refused := keyed(request)) is not None:
            return refused
        return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "grpo"}
                                           for m in MODELS]}

    @app.get("/health")
    async def health(request: Request):
        if (refused := keyed(request)) is not None:
            return refused
        status = "draining" if state.draining else "ok"
        return JSONResponse({"status": status, "queue": {"grpo": state.grpo.depth(), "base": state.fallback.depth()},
                             "requests": state.in_flight - 1},  # being answered, this one aside
                            status_code=503 if state.draining else 200)

    @app.get("/metrics")
    async def prometheus(request: Request):
        if (refused := keyed(request)) is not None:
            return refused
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
