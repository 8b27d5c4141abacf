"""Token log-probabilities as the serving engines record them (``TokenLogprob``, ``top_token_logprobs``)
and in OpenAI's response forms: the chat form (``choices[i].logprobs.content``:
one object per token with its text, log-prob, UTF-8 bytes and ``top_logprobs``) and the legacy
completions form (``tokens``, ``token_logprobs``, ``top_logprobs`` as {text: log-prob}, ``text_offset``).
A token's text is that token decoded alone (a token holding part of a character decodes to U+FFFD,
its bytes then say what it holds only approximately, as in vLLM's responses)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model's raw next-token distribution (before
    temperature and top_p, as vLLM's default), and the ``top`` most likely tokens' (id, log-prob),
    most likely first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def top_token_logprobs(scores: torch.Tensor, tokens: list[int], top: list[int]) -> list[TokenLogprob]:
    """One TokenLogprob per row: scores [n, V] (raw logits), the token each row made, how many
    alternatives each row asks for."""
    logp = torch.log_softmax(scores.float(), -1)  # [n, V]
    k = max(top, default=0)
    best = logp.topk(k, -1) if k else None
    out = []
    for i, (tok, want) in enumerate(zip(tokens, top)):
        alts = tuple(zip(best.indices[i, :want].tolist(), best.values[i, :want].tolist())) if want else ()
        out.append(TokenLogprob(tok, float(logp[i, tok]), alts))
    return out


def _text(tokenizer, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


def chat_logprobs(logprobs: list[TokenLogprob], tokenizer) -> dict:
    """The chat completion's ``logprobs`` object."""
    def entry(token: int, logprob: float) -> dict:
        text = _text(tokenizer, token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [{**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in logprobs], "refusal": None}


def completion_logprobs(logprobs: list[TokenLogprob], tokenizer) -> dict:
    """The text completion's ``logprobs`` object."""
    tokens = [_text(tokenizer, lp.token) for lp in logprobs]
    offsets, at = [], 0
    for text in tokens:
        offsets.append(at)
        at += len(text)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{_text(tokenizer, t): v for t, v in lp.top} for lp in logprobs],
            "text_offset": offsets}
