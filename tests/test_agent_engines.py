"""Multi-turn episodes on the real engines over a tiny random model: the fast and hf engines draw the
same episode for the same keys (they declare same_tokens_for_keys), and the tool tokens the episode
holds in its context carry no gradient (the loss equals the one with their terms removed by hand).

A call format for random text (a call is the text up to its first ASCII letter or digit, which a
random model writes within a few tokens) makes every turn end in a call, so episodes have many turns.

Dimension letters: N sequences, T completion tokens.
"""

from __future__ import annotations

import pytest
import torch

from grpo import core
from grpo.agent import AgentSampler, make_tool
from grpo.agent.call_base import Block
from grpo.agent.episodes import result_turn_ids
from grpo.agent.formats import Call, CallFormat
from grpo.rollout import ROLLOUT_ENGINES, make_engine
from grpo.rollout.engine import SamplingSettings
from grpo.rollout.keys import row_keys
from grpo.train.forwards import Forwards
from tests.conftest import TEST_SEED, build_tiny_model, build_tokenizer
from tests.test_packing import _one_by_one


class FirstAlnum(CallFormat):
    name = "first_alnum"

    def describe(self, tools):
        return "Tools: echo."

    def find_call(self, text):
        # the first letter or digit at the start or after blank text: a call (the untrained model writes one
        # in most turns; a chat template's role names and markers are not calls)
        for i, c in enumerate(text):
            if c.isascii() and c.isalnum() and (i == 0 or text[i - 1].isspace()):
                return i, i + 1
        return None

    def block(self, text):  # one call per turn
        span = self.find_call(text)
        return None if span is None else Block([span], open=False)

    def render_call(self, name, arguments):
        return arguments["text"]

    def parse(self, text, tools):
        return Call("echo", {"text": text[-1]}, text)

    def result_messages(self, call, result):
        return [{"role": "tool", "content": result}]


def echo(text: str) -> str:
    """Echo a character.

    Args:
        text: the character
    """
    return f"<{text}>"


@pytest.fixture(scope="module")
def setup():
    tok = build_tokenizer()
    model = build_tiny_model(len(tok), seed=TEST_SEED, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    model.generation_config.eos_token_id = tok.eos_token_id
    sampler = AgentSampler(tok, tools=[make_tool(echo)], fmt=FirstAlnum(), max_turns=4, tool_timeout=5.0)
    samples = [{"prompt": "Say something.", "answer": "x"}, {"prompt": "Go on.", "answer": "y"}]
    sampling = SamplingSettings(max_new_tokens=64, temperature=1.0, max_prompt_length=512)
    keys = row_keys(TEST_SEED, 3, 0, 4)
    runs = {}
    for name in ("hf", "fast", "hf_cut"):
        engine = make_engine(name.removesuffix("_cut"), model, tok, kernels="mkl")  # no kernel measurement
        engine.supports_stop = not name.endswith("_cut")  # hf_cut: decodes past the call; the runner cuts
        runs[name] = sampler.generate(engine, samples, group_size=2, sampling=sampling, keys=keys, with_logprobs=True)
        engine.close()
    return tok, model, runs


def test_fast_and_hf_draw_the_same_episodes(setup):
    assert ROLLOUT_ENGINES["fast"].same_tokens_for_keys and ROLLOUT_ENGINES["hf"].same_tokens_for_keys
    _, _, runs = setup
    hf, fast, cut = runs["hf"], runs["fast"], runs["hf_cut"]
    # stopping a row at its call's end draws what decoding on and cutting there draws
    assert torch.equal(hf.completion_ids, cut.completion_ids) and torch.equal(hf.loss_mask, cut.loss_mask)
    hf.check()
    assert max(e["turns"] for e in hf.episodes) >= 2  # the episodes are multi-turn
    assert torch.equal(hf.completion_ids, fast.completion_ids) and torch.equal(hf.loss_mask, fast.loss_mask)
    assert torch.equal(hf.completion_mask, fast.completion_mask) and hf.texts == fast.texts
    assert [e["tool_calls"] for e in hf.episodes] == [e["tool_calls"] for e in fast.episodes]
    torch.testing.assert_close(hf.sampling_logp, fast.sampling_logp, atol=1e-4, rtol=0)
    assert (hf.sampling_logp[hf.loss_mask == 0] == 0).all()


def _tool_positions(tok, ro) -> torch.Tensor:
    """[N, T] 1 on each result turn's tokens, found by hand: each tool message's rendered turn,
    searched for in the row after the previous one."""
    hole = torch.zeros_like(ro.completion_mask)
    for i, info in enumerate(ro.episodes):
        c_len = int(ro.completion_mask[i].sum())
        row = ro.completion_ids[i, :c_len].tolist()
        at = 0
        for m in [m for m in info["transcript"] if m["role"] == "tool"]:
            ids = result_turn_ids(tok, FirstAlnum(), [Call("echo", {"text": m["content"][1]}, "")], [m["content"]])
            while row[at:at + len(ids)] != ids[:c_len - at]:  # the budget may cut the last one
                at += 1
                assert at < c_len, "a tool turn is missing from the row"
            n = min(len(ids), c_len - at)
            hole[i, at:at + n] = 1
            at += n
    return hole


def test_tool_tokens_carry_no_gradient(setup):
    tok, model, runs = setup
    ro = runs["hf"]
    hole = _tool_positions(tok, ro)
    assert hole.sum() > 0 and torch.equal(ro.loss_mask, ro.completion_mask * (1 - hole))
    n = ro.completion_ids.shape[0]
    adv = torch.linspace(-1.0, 1.0, n)[:, None].expand_as(ro.loss_mask).contiguous()  # [N, T]
    fw = Forwards(group_size=2, share_prompt=False, attn_implementation="sdpa", autocast=False, max_tokens=0,
                  sharded=False, tied_grad_in_place=False)
    logp = fw.logprobs(model, ro, torch.arange(n), temperature=1.0)["logp"]  # [N, T]
    out = core.policy_loss(logp, logp.detach(), adv, ro.loss_mask, aggregation="token_mean",
                           total=float(ro.loss_mask.sum()))
    out["loss"].backward()
    got = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    # by hand: every row's whole context (tool tokens included) through the model, the tool tokens'
    # terms removed
    ref_logp, _ = _one_by_one(model, (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask), 1.0)
    keep = (ro.completion_mask * (1 - hole)).float()  # [N, T]
    ref = (-adv * torch.exp(ref_logp - ref_logp.detach()) * keep).sum() / keep.sum()
    ref.backward()
    want = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch.testing.assert_close(out["loss"].detach(), ref.detach(), atol=1e-6, rtol=0)
    for k, g in want.items():
        torch.testing.assert_close(got[k], g, atol=1e-5 * max(1.0, float(g.abs().max())), rtol=0, msg=k)
