"""Token log-probs from `grpo serve` (OpenAI's ``logprobs`` / ``top_logprobs``) on a live loopback
server, against the model's own next-token distribution computed here; and the judge reward's
``yes_prob`` score read from them (P(yes) / (P(yes) + P(no)) of the judge's one token)."""

from __future__ import annotations

import math
import threading
import time

import httpx
import pytest
import torch
from transformers import LlamaForCausalLM

from grpo.data.tasks import render_prompt
from grpo.errors import ConfigError
from grpo.rewards.judge import JudgeReward, JudgeSettings, yes_probability
from grpo.serve.app import ServerState
from grpo.serve.batcher import Lane, Scheduler
from grpo.serve.engines import FastServeEngine, HFServeEngine
from grpo.serve.protocol import Limits
from grpo.serve.scheme import Scheme
from grpo.serve.server import make_server
from tests.conftest import TEST_SEED, build_tiny_model, build_tokenizer

BOOST = 8.0  # added to the logits of 'y' and 'n': both among the likeliest tokens, their ratio the model's


class Judging(LlamaForCausalLM):
    """A real tiny Llama whose next-token logits of 'y' and 'n' are raised by BOOST."""

    boosted: tuple[int, ...] = ()

    def forward(self, *args, **kw):
        out = super().forward(*args, **kw)
        out.logits[..., list(self.boosted)] += BOOST
        return out


def _serve(grpo_engine, base_engine):
    """A live loopback server: the scheme over ``grpo_engine``, ``base_engine`` as the fallback."""
    grpo = Lane(grpo_engine, max_rows=4, max_queue=8)
    base = Lane(base_engine, name="base", max_rows=4, max_queue=8)
    state = ServerState(grpo=grpo, fallback=base, scheme=Scheme(markers={}, deadline_s=None),
                        limits=Limits(max_prompt_tokens=300, max_tokens=32), scheduler=Scheduler([grpo, base]))
    srv = make_server(state, host="127.0.0.1", port=0)
    srv.thread = threading.Thread(target=srv.run, daemon=True)
    srv.thread.start()
    while not srv.started:
        time.sleep(0.02)
    srv.url, srv.state = f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}", state
    srv.http = httpx.Client(base_url=srv.url, timeout=60)
    return srv


class Servers:
    """Two servers on the same weights: ``fast`` answers base requests with our decode loop and grpo
    requests with Judging (whose capped answers fall back to the base model); ``judge`` answers base
    requests with Judging through transformers' forward."""

    def __init__(self):
        self.tok = tok = build_tokenizer()
        self.plain = build_tiny_model(len(tok), seed=TEST_SEED, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
        self.judging = Judging(self.plain.config)
        self.judging.load_state_dict(self.plain.state_dict())
        self.judging.boosted = tuple(tok.encode(c, add_special_tokens=False)[0] for c in "yn")
        for m in (self.plain, self.judging):
            m.generation_config.eos_token_id = tok.eos_token_id
            m.eval()
        self.fast = _serve(HFServeEngine(self.judging, tok, max_rows=4),
                           FastServeEngine(self.plain, tok, kernels="mkl", max_rows=4, max_len=512))
        self.judge = _serve(FastServeEngine(self.plain, tok, kernels="mkl", max_rows=4, max_len=512),
                            HFServeEngine(self.judging, tok, max_rows=4))


@pytest.fixture(scope="module")
def servers():
    both = Servers()
    yield both
    for srv in (both.fast, both.judge):
        srv.should_exit = True
        srv.thread.join(timeout=30)


def _greedy(model, prompt_ids: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """``steps`` greedy tokens by full forwards of transformers, and the log-probs [V] before each."""
    tokens, logps = [], []
    with torch.no_grad():
        for _ in range(steps):
            logp = torch.log_softmax(model(input_ids=torch.tensor([prompt_ids + tokens])).logits[0, -1].float(), -1)
            logps.append(logp)
            tokens.append(int(logp.argmax()))
    return tokens, logps


def test_chat_logprobs_are_those_of_the_model_that_answered(servers):
    """Greedy chat, the GRPO model capped so that the base model answers, on our decode loop: each
    token's log-prob and its 5 likeliest alternatives, in order, equal transformers' forward of the
    base model's weights (not the GRPO model's); the token is the likeliest one."""
    tok, server = servers.tok, servers.fast
    for content in ("What is 2 + 3?", "Say hi", "Count to three"):
        r = server.http.post("/v1/chat/completions", json={"model": "grpo", "max_tokens": 4, "temperature": 0,
                                                           "logprobs": True, "top_logprobs": 5,
                                                           "messages": [{"role": "user", "content": content}]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["answered_by"] == "base" and body["answer_reason"] == "token_cap"
        got = body["choices"][0]["logprobs"]["content"]
        if got:
            break
    assert got, "no prompt gave a token before the end of sequence"
    prompt = render_prompt(tok, [{"role": "user", "content": content}], server.state.system_prompt)
    tokens, logps = _greedy(servers.plain, tok(prompt, add_special_tokens=False)["input_ids"], len(got))
    text = body["choices"][0]["message"]["content"]
    assert text.startswith(tok.decode(tokens, skip_special_tokens=True) + "\n\n")  # then the note: no log-probs
    for e, token, ref in zip(got, tokens, logps):
        assert e["token"] == tok.decode([token])
        top = ref.topk(5)
        assert [a["token"] for a in e["top_logprobs"]] == [tok.decode([i]) for i in top.indices.tolist()]
        assert [a["logprob"] for a in e["top_logprobs"]] == pytest.approx(top.values.tolist(), abs=1e-3)
        assert e["logprob"] == pytest.approx(float(ref.max()), abs=1e-3)
        assert e["bytes"] == list(e["token"].encode())


def test_completions_logprobs_in_the_legacy_form(servers):
    """/v1/completions, model=base (transformers' forward): tokens, their log-probs, {text: log-prob}
    of the 3 likeliest and the text offsets."""
    tok, server = servers.tok, servers.judge
    prompt = "Once upon"
    r = server.http.post("/v1/completions", json={"model": "base", "prompt": prompt, "max_tokens": 3,
                                                  "temperature": 0, "logprobs": 3})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert lp["tokens"]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    tokens, logps = _greedy(servers.judging, tok(prompt, add_special_tokens=False)["input_ids"], len(lp["tokens"]))
    assert lp["tokens"] == [tok.decode([t]) for t in tokens]
    assert tok.decode(tokens, skip_special_tokens=True) == choice["text"]
    for k, ref in enumerate(logps):
        top = ref.topk(3)
        assert lp["top_logprobs"][k] == pytest.approx(
            {tok.decode([i]): v for i, v in zip(top.indices.tolist(), top.values.tolist())}, abs=1e-4)
        assert lp["token_logprobs"][k] == pytest.approx(float(ref[tokens[k]]), abs=1e-4)


@pytest.mark.parametrize("body, field", [
    ({"logprobs": "yes"}, "logprobs"), ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"), ({"logprobs": True, "stream": True}, "logprobs")])
def test_bad_logprobs_requests_are_400_naming_the_field(servers, body, field):
    server = servers.judge
    r = server.http.post("/v1/chat/completions", json={"model": "grpo", "messages": [{"role": "user", "content": "x"}],
                                                       "max_tokens": 2, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    r = server.http.post("/v1/completions", json={"model": "grpo", "prompt": "x", "max_tokens": 2, "logprobs": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs", r.text
    r = server.http.post("/v1/completions", json={"model": "base", "prompt": "x", "max_tokens": 2, "logprobs": 1})
    assert r.status_code == 200 and len(r.json()["choices"][0]["logprobs"]["tokens"]) >= 1  # still serving


def test_yes_probability_by_hand():
    top = [{"token": " Yes", "logprob": math.log(0.3)}, {"token": "maybe", "logprob": math.log(0.5)},
           {"token": "no", "logprob": math.log(0.1)}, {"token": " ", "logprob": math.log(0.05)},
           {"token": "Y", "logprob": math.log(0.03)}]
    assert yes_probability(top) == pytest.approx(0.33 / 0.43)
    with pytest.raises(ValueError, match="neither yes nor no"):
        yes_probability([{"token": "maybe", "logprob": 0.0}])
    with pytest.raises(ConfigError, match="yes_prob.*pointwise"):
        JudgeSettings(url="http://127.0.0.1:1/v1", score="yes_prob", mode="group").check()


def test_the_yes_prob_judge_scores_by_the_served_models_probabilities(servers):
    """rewards=judge with judge_score=yes_prob against the live server: each completion's score is
    P(y) / (P(y) + P(n)) of the judge model's next token after the rendered prompt."""
    tok, server = servers.tok, servers.judge
    judge = JudgeReward(JudgeSettings(url=f"{server.url}/v1", model="base", score="yes_prob",
                                      template="Reference {answer}. Reply {completion}. Equal?"), timeout=60)
    samples = [{"prompt": "What is 2 + 3?", "answer": "5"}] * 4
    completions = ["2 + 3 = 5", "2 + 3 = 6", "five", "I do not know"]
    scores = judge(completions, samples)
    y, n = servers.judging.boosted
    for c, s, score in zip(completions, samples, scores):
        text = render_prompt(tok, [{"role": "user", "content": judge.render(s, completion=c)}],
                             server.state.system_prompt)
        ref = _greedy(servers.judging, tok(text, add_special_tokens=False)["input_ids"], 1)[1][0]
        want = float(torch.softmax(ref[[y, n]], -1)[0])
        assert isinstance(score, float) and score == pytest.approx(want, abs=2e-3), (c, score, want)
    assert max(scores) - min(scores) > 1e-6, "the judge's scores do not depend on the completion"


def test_vllm_alternatives_are_taken_by_rank():
    """vLLM's {token id: Logprob} of a position holds the sampled token with its true rank beside the
    most likely ones (ranks 1..k, in any order); the alternatives returned are the ``top`` likeliest
    in rank order, and the sampled token keeps its own log-prob when it ranks below them."""
    from types import SimpleNamespace as Lp

    from grpo.serve.vllm_lanes import from_vllm, vllm_logprobs
    from grpo.serve.engines import Job

    alts = {7: Lp(logprob=-4.0, rank=9), 3: Lp(logprob=-0.5, rank=2), 1: Lp(logprob=-0.2, rank=1),
            5: Lp(logprob=-1.5, rank=3)}
    got = from_vllm(7, alts, 2)
    assert (got.token, got.logprob, got.top) == (7, -4.0, ((1, -0.2), (3, -0.5)))
    assert from_vllm(1, alts, 0).top == ()
    assert vllm_logprobs(Job("x", 4, entropy_run=3, top_logprobs=5)) == 20  # the entropy stop reads 20
    assert vllm_logprobs(Job("x", 4, top_logprobs=5)) == 5
    assert vllm_logprobs(Job("x", 4, top_logprobs=0)) == 0 and vllm_logprobs(Job("x", 4)) is None
