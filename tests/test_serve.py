"""grpo serve on a live loopback server: the scheme's fallbacks (deadline, incomplete answer, entropy
stop) with a real tiny model scripted to be slow or to end early, the official openai client (plain
and streaming), streaming on both routes, bad input answered 4xx while the server keeps serving
(streamed requests too), overload, and the drain."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time

import httpx
import pytest
from transformers import LlamaForCausalLM

from grpo.serve.app import ServerState
from grpo.serve.batcher import Lane, Scheduler
from grpo.serve.engines import FastServeEngine, HFServeEngine
from grpo.serve.protocol import Limits
from grpo.serve.scheme import Scheme
from grpo.serve.server import make_server
from tests.conftest import TEST_SEED, build_tiny_model, build_tokenizer


class Scripted(LlamaForCausalLM):
    """A real tiny Llama whose forward can be slowed (per prefill, per step; ``release`` ends a wait
    early), made to emit EOS as its k-th token or never, to be certain of one token (entropy ~0), or
    to fail."""

    prefill_delay = step_delay = 0.0
    steps: dict = {}  # decode steps since the prefill, per row
    eos_after: int | None = None
    ban_eos = False
    peak_token: int | None = None
    fail = False
    release = threading.Event()

    def forward(self, input_ids=None, **kw):
        if self.fail:
            raise RuntimeError("scripted failure")
        row = id(kw.get("cache", kw.get("past_key_values")))  # each row has its own cache (the hf engine)
        if input_ids.shape[1] > 1:
            self.steps[row], delay = 0, self.prefill_delay
        else:
            self.steps[row], delay = self.steps.get(row, 0) + 1, self.step_delay
        self.step = self.steps[row]
        if delay:
            self.release.wait(delay)
        out = super().forward(input_ids=input_ids, **kw)
        if self.peak_token is not None:
            out.logits[:, -1, self.peak_token] += 100.0
        if self.ban_eos:
            out.logits[:, -1, self.config.eos_token_id] = float("-inf")
        if self.eos_after is not None and self.step + 1 >= self.eos_after:
            out.logits[:, -1, :] = float("-inf")
            out.logits[:, -1, self.config.eos_token_id] = 0.0
        return out

    def script(self, **kw):
        self.steps = {}
        self.prefill_delay = self.step_delay = 0.0
        self.eos_after = self.peak_token = None
        self.fail = self.ban_eos = False
        self.release = threading.Event()
        for k, v in kw.items():
            setattr(self, k, v)


def _models():
    tok = build_tokenizer()
    plain = build_tiny_model(len(tok), seed=TEST_SEED, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    scripted = Scripted(plain.config)
    scripted.load_state_dict(plain.state_dict())
    for m in (plain, scripted):
        m.generation_config.eos_token_id = tok.eos_token_id
        m.generation_config.pad_token_id = tok.pad_token_id
    return tok, plain, scripted


def _state(tok, plain, scripted) -> ServerState:
    grpo = Lane(HFServeEngine(scripted, tok, max_rows=4), max_rows=4, max_queue=8, entropy_threshold=0.01,
                entropy_run=3)
    fallback = Lane(FastServeEngine(plain, tok, kernels="mkl", max_rows=4, max_len=1024 + 200), name="base",
                    max_rows=4, max_queue=8)
    return ServerState(grpo=grpo, fallback=fallback, scheme=Scheme(markers={}), limits=Limits(max_prompt_tokens=200,
                       max_tokens=64, max_body_bytes=4096), scheduler=Scheduler([grpo, fallback]))


class Live:
    def __init__(self, state, server, port):
        self.state, self.server, self.url = state, server, f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def chat(self, content="What is 2 + 3?", **kw):
        return self.http.post("/v1/chat/completions", json={"model": "grpo", "messages": [
            {"role": "user", "content": content}], **kw})


@pytest.fixture(scope="module")
def live():
    tok, plain, scripted = _models()
    state = _state(tok, plain, scripted)
    server = make_server(state, host="127.0.0.1", port=0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    lv = Live(state, server, port)
    lv.scripted = scripted
    yield lv
    server.should_exit = True
    thread.join(timeout=30)


@pytest.fixture
def scheme(live):
    """Each test starts from the tiny defaults: markers off, nothing scripted, and no deadline, so that
    a verdict never depends on how fast a (shared, loaded) machine decodes; the tests of the deadline
    set their own, where a slower machine can only make the deadline pass sooner."""
    s = live.state.scheme
    s.deadline_s, s.grpo_max_tokens, s.fallback_max_tokens, s.markers, s.verifier = None, 512, 1024, {}, None
    s.completeness = "markers"
    live.state.api_key = None
    live.state.grpo.max_queue = live.state.fallback.max_queue = 8
    live.scripted.script()
    return s


def _answer(r):
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["answered_by"] == r.headers["x-grpo-answered-by"] and body["answer_reason"] == r.headers["x-grpo-reason"]
    return body


def test_complete_answer_comes_from_the_grpo_model(live, scheme):
    live.scripted.script(eos_after=5, ban_eos=True)
    body = _answer(live.chat(max_tokens=20))
    assert (body["answered_by"], body["answer_reason"]) == ("grpo", "complete")
    assert body["usage"]["completion_tokens"] == 5 and body["choices"][0]["finish_reason"] == "stop"


def test_fallback_on_incomplete_answers(live, scheme):
    live.scripted.script(ban_eos=True)
    scheme.grpo_max_tokens = 6  # the GRPO model is cut at its cap: truncated
    body = _answer(live.chat(max_tokens=30))
    assert (body["answered_by"], body["answer_reason"]) == ("base", "token_cap")
    assert body["choices"][0]["message"]["content"].endswith(scheme.notes["en"])
    scheme.grpo_max_tokens = 512
    live.scripted.script(eos_after=4)  # it ends, but says no closing word of its language
    scheme.markers = {"en": ("therefore-never-said",), "zh": ("因此",)}
    body = _answer(live.chat(max_tokens=30))
    assert body["answer_reason"] == "no_closing_marker" and body["usage"]["completion_tokens"] <= 30
    scheme.completeness, scheme.verifier = "verifier", (lambda completion, sample: 0.0)  # a verifier that refuses
    assert _answer(live.chat(max_tokens=30))["answer_reason"] == "verifier_rejected"


def test_entropy_early_stop_falls_back_after_three_certain_tokens(live, scheme):
    live.scripted.script(peak_token=70)
    gen = live.state.grpo.submit(live.state.engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True), cap=30, deadline=None)
    out = gen.result(timeout=30)
    assert (out.finish, out.tokens) == ("entropy", 3)
    assert _answer(live.chat(max_tokens=30))["answer_reason"] == "early_stop"


def test_fallback_on_deadline_and_the_grpo_row_leaves_at_its_deadline(live, scheme):
    scheme.deadline_s = 0.3
    live.scripted.script(prefill_delay=0.6, eos_after=3)  # in time it would be complete
    engine = live.state.grpo.engine
    body = _answer(live.chat(max_tokens=10))
    assert (body["answered_by"], body["answer_reason"]) == ("base", "deadline")
    assert live.state.grpo.depth() == 0 and not engine.rows  # dropped at its deadline, not decoded on
    live.scripted.script(step_delay=0.05, ban_eos=True)  # slow steps: stopped at the deadline, not at its cap
    steps = engine.steps
    body = _answer(live.chat(max_tokens=60))
    assert body["answer_reason"] == "deadline" and engine.steps - steps < 30


def test_a_failing_grpo_model_falls_back(live, scheme):
    live.scripted.script(fail=True)
    assert _answer(live.chat(max_tokens=5))["answer_reason"] == "grpo_error"
    live.scripted.script(eos_after=2)
    assert _answer(live.chat(max_tokens=5))["answered_by"] == "grpo"


def test_openai_client_unchanged(live, scheme):
    import openai

    live.scripted.script(eos_after=4, ban_eos=True)
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["grpo", "base"]
    chat = client.chat.completions.create(model="grpo", messages=[{"role": "user", "content": "hello"}], max_tokens=8)
    assert chat.model_extra["answered_by"] == "grpo" and chat.usage.completion_tokens == 3 + 1
    assert isinstance(chat.choices[0].message.content, str)
    comp = client.completions.create(model="base", prompt="Once upon", max_tokens=5)
    assert comp.model_extra["answered_by"] == "base" and comp.usage.completion_tokens <= 5
    with pytest.raises(openai.NotFoundError, match="model"):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    live.state.api_key = "s3cret"
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    keyed = openai.OpenAI(base_url=f"{live.url}/v1", api_key="s3cret", max_retries=0)
    assert len(keyed.models.list().data) == 2


def test_the_openai_client_streams_both_routes_as_it_reads_plain_answers(live, scheme):
    import openai

    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "hello"}]
    live.scripted.script(eos_after=4, ban_eos=True)
    plain = client.chat.completions.create(model="grpo", messages=msgs, max_tokens=8)
    raw = client.chat.completions.with_raw_response.create(model="grpo", messages=msgs, max_tokens=8, stream=True,
                                                           stream_options={"include_usage": True})
    assert raw.headers["x-grpo-answered-by"] == "grpo" and raw.headers["content-type"].startswith("text/event-stream")
    chunks = list(raw.parse())
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    end = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert end.choices[0].finish_reason == "stop" and end.model_extra["answered_by"] == "grpo"
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens == 4
    live.scripted.script(ban_eos=True)
    scheme.grpo_max_tokens = 2  # the GRPO model hits its cap: the fallback's answer streams, then the note
    plain = client.chat.completions.create(model="grpo", messages=msgs, max_tokens=8)
    raw = client.chat.completions.with_raw_response.create(model="grpo", messages=msgs, max_tokens=8, stream=True)
    assert (raw.headers["x-grpo-answered-by"], raw.headers["x-grpo-reason"]) == ("base", "token_cap")
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content and text.endswith("\n\n" + scheme.notes["en"])
    assert chunks[-1].model_extra["answer_reason"] == "token_cap"
    plain = client.completions.create(model="base", prompt="Once upon", max_tokens=5)
    streamed = client.completions.create(model="base", prompt="Once upon", max_tokens=5, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == plain.choices[0].text  # model=base: no note
    live.state.api_key = "s3cret"
    with pytest.raises(openai.AuthenticationError):  # refused before any event
        client.chat.completions.create(model="grpo", messages=msgs, max_tokens=8, stream=True)


def test_a_stream_is_server_sent_events_ending_in_done_and_a_client_gone_stops_its_row(live, scheme):
    body = {"model": "base", "max_tokens": 40, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with live.http.stream("POST", "/v1/chat/completions", json=body) as r:
        lines = [ln for ln in r.iter_lines() if ln]
    assert r.status_code == 200 and lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in lines)
    engine = live.state.fallback.engine
    step, seen = engine._step, []
    # slowed steps, so an answer decoded to its cap (60 tokens) takes 60 steps of 0.2 s at least; the server
    # notices a client gone when it next writes to it, so the row should leave within a few steps of it
    engine._step = lambda: (seen.append(len(engine.rows)), time.sleep(0.2), step())[2]
    try:
        lane = live.state.fallback
        with live.http.stream("POST", "/v1/chat/completions", json={**body, "max_tokens": 60}) as r:
            next(r.iter_lines())  # the role chunk: the row is queued or decoding now
            assert lane.pending or engine.rows
        left = engine.steps
        # the server saw the client go: the row left (on a loaded machine, perhaps before its first step)
        _until(lambda: not lane.pending and not engine.rows)
        assert engine.steps - left <= 20, engine.steps - left  # it left, not decoded to its cap
    finally:
        del engine._step


def test_the_fallbacks_stream_arrives_as_it_is_decoded(live, scheme):
    """Each of the fallback's tokens goes out as it is decoded: the first text arrives while its row
    still decodes, and the text comes in several events (not held until the answer is complete)."""
    engine = live.state.fallback.engine
    step = engine._step
    engine._step = lambda: (time.sleep(0.05), step())[1]  # 40 tokens take 2 s at least
    try:
        body = {"model": "base", "max_tokens": 40, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        decoding_at_first_text, texts = None, 0
        with live.http.stream("POST", "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    texts += 1
                    if decoding_at_first_text is None:
                        decoding_at_first_text = bool(engine.rows)
    finally:
        del engine._step
    assert decoding_at_first_text is True and texts >= 2, (decoding_at_first_text, texts)


def _until(condition, limit_s: float = 120.0) -> None:
    """Wait for ``condition`` (a state the server reaches, however loaded the machine); the limit only
    ends a test that would otherwise hang."""
    end = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < end, "the server never reached the state waited for"
        time.sleep(0.01)


BAD = [  # (raw body or JSON, status, field named)
    (b"{not json", 400, "body"),
    ([1, 2], 400, "body"),
    ({"messages": [{"role": "user", "content": "x"}]}, 400, "model"),
    ({"model": 3, "messages": [{"role": "user", "content": "x"}]}, 400, "model"),
    ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model"),
    ({"model": "grpo"}, 400, "messages"),
    ({"model": "grpo", "messages": "hi"}, 400, "messages"),
    ({"model": "grpo", "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ({"model": "grpo", "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ({"model": "grpo", "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}, 400, "max_tokens"),
    ({"model": "grpo", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "grpo", "messages": [{"role": "user", "content": "x"}], "max_tokens": 65}, 400, "max_tokens"),
    ({"model": "grpo", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400, "temperature"),
    ({"model": "grpo", "messages": [{"role": "user", "content": "x"}], "top_p": 2}, 400, "top_p"),
    ({"model": "grpo", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400, "stream"),
    ({"model": "grpo", "messages": [{"role": "user", "content": "x"}], "stream_options": {}}, 400, "stream_options"),
    ({"model": "grpo", "messages": [{"role": "user", "content": "x"}], "stream": True, "stream_options": {
        "include_usage": 1}}, 400, "stream_options.include_usage"),
    ({"model": "grpo", "messages": [{"role": "user", "content": "x" * 300}], "stream": True}, 400, "messages"),
    ({"model": "grpo", "messages": [{"role": "user", "content": "x"}], "n": 3}, 400, "n"),
    ({"model": "grpo", "messages": [{"role": "user", "content": "x" * 300}]}, 400, "messages"),  # prompt tokens
    ({"model": "grpo", "messages": [{"role": "user", "content": "x" * 5000}]}, 413, "content-length"),  # request size
    (b'{"model": "grpo", "messages": [{"role": "user", "content": "a\\ud800b"}]}', 400, "messages[0].content"),
    ({"model": "grpo", "messages": [{"role": "user", "content": "x"}],
      "logit_bias": {"15": 100, "16": -100}}, 400, "logit_bias"),  # nothing would be applied: refused
]


@pytest.mark.parametrize("i", range(len(BAD)))
def test_bad_input_is_a_4xx_naming_the_field_and_the_server_keeps_serving(live, scheme, i):
    body, status, field = BAD[i]
    kw = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) else {"json": body}
    r = live.http.post("/v1/chat/completions", **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == field and field.split("[")[0] in err["message"]
    live.scripted.script(eos_after=2)
    assert live.chat(max_tokens=3).status_code == 200


def test_completions_prompt_type_checked(live, scheme):
    r = live.http.post("/v1/completions", json={"model": "grpo", "prompt": {"a": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = live.http.post("/v1/completions", content=b'{"model": "grpo", "prompt": "\\udfff"}',
                       headers={"content-type": "application/json"})
    assert r.status_code == 400 and "lone surrogate" in r.json()["error"]["message"]
    live.scripted.script(eos_after=2)  # an empty logit_bias, as clients send by default, asks for nothing
    assert live.chat(max_tokens=3, logit_bias={}).status_code == 200


def test_overload_is_429_and_a_failure_of_both_models_is_a_500_for_that_request_only(live, scheme):
    scheme.deadline_s = None  # every request admitted is answered by the GRPO model, however slowly
    live.scripted.script(prefill_delay=0.6, eos_after=2)
    live.state.grpo.max_queue = 1

    async def burst():
        async with httpx.AsyncClient(base_url=live.url, timeout=30) as c:
            return await asyncio.gather(*(c.post("/v1/chat/completions", json={
                "model": "grpo", "max_tokens": 3, "messages": [{"role": "user", "content": f"q{i}"}]})
                for i in range(6)))

    codes = sorted(r.status_code for r in asyncio.run(burst()))
    assert 200 in codes and 429 in codes and set(codes) <= {200, 429}
    metrics = live.http.get("/metrics").text
    assert 'grpo_serve_errors_total{status="429"}' in metrics and "grpo_serve_queue_depth" in metrics
    assert 'grpo_serve_requests_total{answered_by="grpo"}' in metrics and "grpo_serve_request_seconds_bucket" in metrics
    live.state.grpo.max_queue = 8
    live.scripted.script(fail=True)
    engine = live.state.fallback.engine
    engine._step = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("fallback down"))
    try:
        r = live.chat(max_tokens=3)
    finally:
        del engine._step
    assert r.status_code == 500 and "fallback down" in r.json()["error"]["message"]
    live.scripted.script(eos_after=2)
    assert _answer(live.chat(max_tokens=3))["answered_by"] == "grpo"
    assert live.http.get("/health").json()["status"] == "ok"


def test_sigterm_drains_in_flight_requests():
    """A real SIGTERM to this process: uvicorn (in the main thread) stops accepting, the request in
    flight is answered, then the server returns."""
    tok, plain, scripted = _models()
    state = _state(tok, plain, scripted)
    state.scheme.deadline_s = None  # the GRPO model answers, however long the (loaded) machine takes
    scripted.script(prefill_delay=1.0, eos_after=2)
    server = make_server(state, host="127.0.0.1", port=0)
    results = {}

    def client():
        while not server.started:
            time.sleep(0.02)
        url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
        def streamed():
            with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=30, json={
                    "model": "base", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "x"}]}) as r:
                results["stream"] = [ln for ln in r.iter_lines() if ln]

        with httpx.Client(base_url=url, timeout=30) as c:
            sent = threading.Thread(target=lambda: results.update(first=c.post("/v1/chat/completions", json={
                "model": "grpo", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})))
            sent.start()
            while state.grpo.depth() == 0:
                time.sleep(0.01)
            stream = threading.Thread(target=streamed)  # waits behind the GRPO prefill: in flight at the signal
            stream.start()
            while state.fallback.depth() == 0:
                time.sleep(0.01)
            signal.raise_signal(signal.SIGTERM)
            sent.join()
            stream.join()
        try:
            results["after"] = httpx.post(f"{url}/v1/chat/completions", json={}, timeout=2).status_code
        except httpx.HTTPError as e:
            results["after"] = type(e).__name__

    previous = signal.signal(signal.SIGTERM, lambda *a: None)  # uvicorn re-raises the signal it caught
    try:
        th = threading.Thread(target=client)
        th.start()
        server.run()
        th.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert results["first"].status_code == 200 and results["first"].json()["answered_by"] == "grpo"
    assert results["stream"][-1] == "data: [DONE]" and len(results["stream"]) >= 3  # the stream in flight finished
    # After the drain: a 503 while uvicorn still listens, a refused connection once it has closed, or (a
    # connection the kernel accepted as uvicorn closed its sockets) one closed without an answer.
    assert results["after"] in ("ConnectError", 503, "RemoteProtocolError")
    assert not state.scheduler.thread.is_alive()


def test_flags_parse_and_unknown_engine_lists_the_valid_ones():
    from grpo.errors import ConfigError
    from grpo.serve.engines import make_serve_engine
    from grpo.serve.server import parse_markers

    assert parse_markers(["none"]) == {}
    got = parse_markers(["en=finally, so"])
    assert got["en"] == ("finally", "so") and got["zh"] == ("因此", "综上", "所以", "答案是")
    with pytest.raises(ConfigError, match="LANG=word"):
        parse_markers(["therefore"])
    tok, plain, _ = _models()
    with pytest.raises(ConfigError, match="valid: auto, fast, hf, vllm"):
        make_serve_engine("vllm-not-here", plain, tok)


def test_serve_bench_counts_who_answered_and_their_tokens(live, scheme):
    from grpo.serve.bench import percentile, run_level

    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0 and percentile([3.0, 1.0, 2.0, 4.0], 99) == 4.0
    live.scripted.script(eos_after=4, ban_eos=True)  # complete answers of 3 tokens
    r = asyncio.run(run_level(live.url, ["What is 2 + 3?", "What is 1 + 1?"], concurrency=2, requests=4, model="grpo",
                              max_tokens=8, api_key=None, timeout=30))
    assert (r.ok, r.grpo_share, r.fallback_reasons, r.errors) == (4, 1.0, {}, {})
    assert r.mean_tokens == {"grpo": 4.0} and r.p50_ms <= r.p95_ms <= r.p99_ms
    live.scripted.script(ban_eos=True)
    scheme.grpo_max_tokens = 2  # every GRPO answer hits its cap: the fallback answers
    r = asyncio.run(run_level(live.url, ["hi"], concurrency=1, requests=2, model="grpo", max_tokens=3, api_key=None,
                              timeout=30))
    assert (r.grpo_share, r.fallback_reasons) == (0.0, {"token_cap": 2}) and set(r.mean_tokens) == {"base"}
