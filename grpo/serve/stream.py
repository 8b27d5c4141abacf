"""Streaming (``stream: true``): an answer as server-sent events, in the form OpenAI's clients read
(``chat.completion.chunk`` / ``text_completion`` objects, then ``data: [DONE]``).

The scheme decides between two models, so the stream is defined as follows. The GRPO model's answer
is held until it is accepted (in time and complete): a client never receives text that is then
withdrawn. Its wait is bounded by the deadline (0.8 s by default), and the response starts once the
verdict is known, so its headers say who answers (``X-Grpo-Answered-By``, ``X-Grpo-Reason``). An
accepted answer is sent at once; otherwise the fallback's answer is streamed token by token as it is
decoded (it has no deadline, and its answers are the long ones), followed by the note when it is
another model. The last chunk carries ``finish_reason`` and grpo's ``answered_by`` and
``answer_reason``; with ``stream_options: {"include_usage": true}`` a final chunk carries the usage.
A client that disconnects stops its fallback row at the next step. A failure after the response
began is an ``error`` event (OpenAI's clients raise it), then ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi.responses import StreamingResponse

from grpo.serve.scheme import openai_finish


def _event(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class Chunks:
    """The chunk objects of one streamed answer."""

    def __init__(self, model: str, *, chat: bool):
        self.chat, self.model = chat, model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())

    def _wrap(self, choices: list, **extra) -> dict:
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices, **extra}

    def start(self) -> str | None:
        """The chat stream's first chunk (the role); completions have none."""
        if not self.chat:
            return None
        return _event(self._wrap([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                                   "logprobs": None}]))

    def text(self, delta: str) -> str:
        if self.chat:
            choice = {"index": 0, "delta": {"content": delta}, "finish_reason": None, "logprobs": None}
        else:
            choice = {"index": 0, "text": delta, "finish_reason": None, "logprobs": None}
        return _event(self._wrap([choice]))

    def end(self, finish_reason: str, answered_by: str, reason: str) -> str:
        choice = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        choice.update({"delta": {}} if self.chat else {"text": ""})
        return _event(self._wrap([choice], answered_by=answered_by, answer_reason=reason))

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        return _event(self._wrap([], usage={"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                            "total_tokens": prompt_tokens + completion_tokens}))


async def stream_answer(state, router, metrics, p, *, chat: bool, start: float) -> StreamingResponse:
    """The streamed answer of the prepared request ``p`` (grpo.serve.app.Prepared). Overloaded (and
    any error) before the response begins propagates: the caller answers it with its status."""
    kw = dict(max_tokens=p.req.max_tokens, temperature=p.temperature, top_p=p.req.top_p)
    gen, reason = (None, "requested") if p.req.model == "base" else \
        await router.grpo_answer(p.prompt, p.sample, **kw)
    chunks = Chunks(p.req.model, chat=chat)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    if reason is None:
        headers.update({"X-Grpo-Answered-By": "grpo", "X-Grpo-Reason": "complete"})

        async def accepted():
            for part in (chunks.start(), chunks.text(gen.text), chunks.end(openai_finish(gen), "grpo", "complete")):
                if part:
                    yield part
            if p.req.include_usage:
                yield chunks.usage(p.n_prompt, gen.tokens)
            yield "data: [DONE]\n\n"
            metrics.answered("grpo", "complete", time.monotonic() - start)

        return StreamingResponse(accepted(), media_type="text/event-stream", headers=headers)
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()
    fut = router.submit_fallback(p.prompt, on_tokens=lambda ids: loop.call_soon_threadsafe(queue.put_nowait, ids), **kw)
    fut.add_done_callback(lambda f: loop.call_soon_threadsafe(queue.put_nowait, None))
    headers.update({"X-Grpo-Answered-By": "base", "X-Grpo-Reason": reason})
    tokenizer = router.fallback.engine.tokenizer
    return StreamingResponse(_fallback_events(chunks, queue, fut, tokenizer, router, p, reason, metrics, start),
                             media_type="text/event-stream", headers=headers)


async def _fallback_events(chunks: Chunks, queue: asyncio.Queue, fut, tokenizer, router, p, reason: str, metrics,
                           start: float):
    sent = ""
    try:
        if (first := chunks.start()) is not None:
            yield first
        while True:
            ids = await queue.get()
            while not queue.empty() and ids is not None:  # only the newest state matters
                ids = queue.get_nowait()
            if ids is None:
                break
            text = tokenizer.decode(ids, skip_special_tokens=True)
            if text.endswith("\ufffd") or not text.startswith(sent):  # a character still incomplete
                continue
            if len(text) > len(sent):
                yield chunks.text(text[len(sent):])
                sent = text
        try:
            fb = fut.result()
        except Exception as e:
            yield _event({"error": {"message": f"internal error: {type(e).__name__}: {e}", "type": "server_error",
                                    "param": None, "code": "internal"}})
            yield "data: [DONE]\n\n"
            return
        rest = fb.text[len(sent):] if fb.text.startswith(sent) else ""
        note = router.note(fb.text) if reason != "requested" else ""  # model=base asked for it: no note
        if rest:
            yield chunks.text(rest)
        if note:
            yield chunks.text(f"\n\n{note}")
        yield chunks.end(openai_finish(fb), "base", reason)
        if p.req.include_usage:
            yield chunks.usage(p.n_prompt, fb.tokens)
        yield "data: [DONE]\n\n"
        metrics.answered("base", reason, time.monotonic() - start)
    finally:
        fut.cancel()  # a client gone mid-stream: the engine drops the row at its next step
