"""A rollout's two masks: completion_mask (the context, a prefix mask) and loss_mask (the tokens
trained on, holes allowed, e.g. a tool's output). A hole is read by the model and left out of the
loss: the loss and gradient equal a by-hand computation on the remaining tokens, packing and
micro-batching do not change the log-probs, and a malformed mask is a clear error.

Dimension letters: N sequences, P prompt tokens, T completion tokens.
"""

import pytest
import torch

from grpo import core
from grpo.models.logprobs import completion_logprobs
from grpo.models.packing import check_masks, pack_sequences
from grpo.rollout import Rollout
from grpo.rollout.types import concat_rollouts, rollout_to, select_rollout
from grpo.train.forwards import Forwards
from tests.conftest import build_tiny_model
from tests.test_packing import _batch, _one_by_one

GROUPS = ((3, 4), (5, 4))  # two groups of 4: prompts of 3 and 5 tokens


def _holed_rollout(seed: int = 0) -> Rollout:
    """Two groups of 4 sequences (completions of up to 8 tokens, the first of each full length) whose
    loss_mask leaves out tokens 3-5 of row 0 and 2-3 of row 4 (tool output), and token 0 of row 5."""
    prompt_ids, prompt_mask, comp_ids, comp_mask = _batch(seed, groups=GROUPS, t=8)
    loss = comp_mask.clone()  # [N, T]
    loss[0, 3:6] = 0
    loss[4, 2:4] = 0
    loss[5, 0] = 0
    n = len(prompt_ids)
    return Rollout(prompt_ids, prompt_mask, comp_ids, comp_mask, torch.zeros(n, dtype=torch.bool), None,
                   [""] * n, "test", 0.0, loss_mask=loss)


def _forwards(share: bool, max_tokens: int = 0) -> Forwards:
    return Forwards(group_size=4, share_prompt=share, attn_implementation="sdpa", autocast=False,
                    max_tokens=max_tokens, sharded=False, tied_grad_in_place=False)


def _grads(model) -> dict:
    out = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize("share", [False, True])
def test_a_hole_gives_the_loss_and_gradient_of_the_tokens_left_by_hand(aggregation, share):
    model = build_tiny_model(40, seed=3)
    ro = _holed_rollout()
    n = ro.completion_ids.shape[0]
    adv = torch.linspace(-1.0, 1.5, n)[:, None].expand_as(ro.loss_mask).contiguous()  # [N, T]
    # the real path: the batch's counted mask starts from loss_mask
    logp = _forwards(share).logprobs(model, ro, torch.arange(n), temperature=0.8)["logp"]  # [N, T]
    total = float(ro.loss_mask.sum()) if aggregation == "token_mean" else None
    out = core.policy_loss(logp, logp.detach(), adv, ro.loss_mask, aggregation=aggregation, total=total)
    out["loss"].backward()
    got = _grads(model)
    # by hand: each sequence's whole context through the plain model, the loss on the remaining tokens
    ref_logp, _ = _one_by_one(model, (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask), 0.8)
    keep = ro.completion_mask.clone().float()  # [N, T]
    keep[0, 3:6] = 0
    keep[4, 2:4] = 0
    keep[5, 0] = 0
    surrogate = -adv * torch.exp(ref_logp - ref_logp.detach()) * keep  # [N, T] ratio 1
    if aggregation == "token_mean":
        ref = surrogate.sum() / keep.sum()
    else:
        ref = (surrogate.sum(1) / keep.sum(1)).mean()
    ref.backward()
    want = _grads(model)
    torch.testing.assert_close(out["loss"].detach(), ref.detach(), atol=1e-6, rtol=0)
    assert got.keys() == want.keys() and got
    for k, g in want.items():
        torch.testing.assert_close(got[k], g, atol=1e-5 * max(1.0, float(g.abs().max())), rtol=0, msg=k)
    # the hole's tokens carry no log-prob; the others are those of the whole context
    hole = (ro.completion_mask > 0) & (ro.loss_mask == 0)  # [N, T]
    assert (logp.detach()[hole] == 0).all()
    torch.testing.assert_close(logp.detach()[~hole], ref_logp.detach()[~hole], atol=1e-5, rtol=0)


@pytest.mark.parametrize("share,max_row_tokens", [(False, 0), (True, 0), (True, 14)])
def test_packing_and_micro_batches_give_the_same_logprobs_with_holes(share, max_row_tokens):
    model = build_tiny_model(40, seed=4)
    ro = _holed_rollout(seed=1)
    args = (ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask)
    with torch.no_grad():
        full = completion_logprobs(model, *args, temperature=1.0, share_prompt=share,
                                   max_row_tokens=max_row_tokens)  # every context token
        holed = completion_logprobs(model, *args, temperature=1.0, share_prompt=share,
                                    max_row_tokens=max_row_tokens, loss_mask=ro.loss_mask)
        ref, _ = _one_by_one(model, args, 1.0)
        # the same layout with and without a loss mask: exactly the context's numbers, zeroed off it
        assert torch.equal(holed["logp"], full["logp"] * ro.loss_mask)
        assert torch.equal(holed["entropy"], full["entropy"] * ro.loss_mask)
        torch.testing.assert_close(holed["logp"], ref * ro.loss_mask, atol=1e-5, rtol=0)
        # micro-batches cut into forward chunks by a token budget: the same log-probs row by row
        fw = _forwards(share, max_tokens=max_row_tokens)
        rows = torch.arange(ro.completion_ids.shape[0])
        parts = [fw.logprobs(model, ro, idx, temperature=1.0)["logp"] for mb in rows.split(3)
                 for idx in fw.chunks(ro, mb)]
        torch.testing.assert_close(torch.cat(parts), holed["logp"], atol=1e-5, rtol=0)


def test_chunks_count_context_tokens_not_loss_tokens():
    ro = _holed_rollout()
    c1 = int(ro.completion_mask[1].sum())
    # rows 0 and 1 share a 3-token prompt: 3 + 8 + c1 context tokens, 3 fewer in the loss
    fw = _forwards(True, max_tokens=3 + 8 + c1 - 1)
    assert [c.tolist() for c in fw.chunks(ro, torch.arange(2))] == [[0], [1]]


def test_malformed_masks_are_clear_errors():
    prompt_ids, prompt_mask, comp_ids, comp_mask = _batch(groups=((3, 2),), t=4)
    holed = comp_mask.clone()
    holed[0] = torch.tensor([1, 0, 1, 1])
    with pytest.raises(ValueError, match="completion_mask: must be 1 up to .*belong in loss_mask"):
        check_masks(holed)
    with pytest.raises(ValueError, match="completion_mask"):
        pack_sequences(prompt_ids, prompt_mask, comp_ids, holed, share_prompt=False, loss_mask=holed)
    outside = comp_mask.clone()
    outside[1, -1] = 1
    comp_mask[1, -1] = 0
    with pytest.raises(ValueError, match="loss_mask: 1 on a token outside completion_mask"):
        pack_sequences(prompt_ids, prompt_mask, comp_ids, comp_mask, share_prompt=False, loss_mask=outside)
    ro = Rollout(prompt_ids, prompt_mask, comp_ids, holed, torch.zeros(2, dtype=torch.bool), None, ["", ""], "t", 0.0)
    with pytest.raises(ValueError, match="completion_mask"):
        ro.check()
    with pytest.raises(ValueError, match="loss_mask: shape"):
        Rollout(prompt_ids, prompt_mask, comp_ids, comp_mask, torch.zeros(2, dtype=torch.bool), None, ["", ""],
                "t", 0.0, loss_mask=comp_mask[:, :2])


def test_loss_mask_defaults_to_the_context_and_follows_select_concat_and_device():
    ro = _holed_rollout()
    plain = Rollout(ro.prompt_ids, ro.prompt_mask, ro.completion_ids, ro.completion_mask, ro.truncated, None,
                    ro.texts, "test", 0.0)
    assert plain.loss_mask is plain.completion_mask
    ro.check()
    assert torch.equal(ro.lengths, ro.completion_mask.sum(1))  # lengths: the context's
    idx = torch.tensor([4, 0])
    sel = select_rollout(ro, idx)
    assert torch.equal(sel.loss_mask, ro.loss_mask[idx])
    short = select_rollout(ro, torch.tensor([1, 2]))
    short.completion_ids, short.completion_mask = short.completion_ids[:, :5], short.completion_mask[:, :5]
    short.loss_mask = short.loss_mask[:, :5].clone()
    short.loss_mask[0, 1] = 0
    both = concat_rollouts([sel, short], pad_id=0)
    assert torch.equal(both.loss_mask[:2], sel.loss_mask)
    assert torch.equal(both.loss_mask[2:, :5], short.loss_mask) and not both.loss_mask[2:, 5:].any()
    both.check()
    assert torch.equal(rollout_to(ro, "cpu").loss_mask, ro.loss_mask)


def test_ppo_outcome_score_sits_on_the_last_loss_token():
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]])  # [N, T] a hole in row 0
    zeros = torch.zeros(3, 6)
    rewards = core.kl_shaped_rewards(torch.tensor([2.0, 3.0, 5.0]), zeros, None, mask, kl_coef=0.1)  # [N, T]
    assert rewards.tolist() == [[0, 0, 0, 0, 2.0, 0], [0, 0, 3.0, 0, 0, 0], [0] * 6]
    # GAE steps over the hole: the advantage before it bootstraps from the value after it
    values = torch.arange(1.0, 7.0).expand(3, 6)  # [N, T]
    est = core.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert est["advantages"][0].tolist() == [1.0, 0.0, 0.0, 0.0, -3.0, 0.0]


def _hole_in_longest_row(ro: Rollout) -> torch.Tensor:
    """Put a hole (tokens 1-2) in the loss_mask of the rollout's longest row; returns the hole [N, T]."""
    row = int(ro.lengths.argmax())
    assert int(ro.lengths[row]) >= 4, "the tiny model wrote too short a completion for the test"
    ro.loss_mask = ro.completion_mask.clone()
    ro.loss_mask[row, 1:3] = 0
    return (ro.completion_mask > 0) & (ro.loss_mask == 0)


@pytest.mark.parametrize("ppo", [False, True])
def test_the_trainer_counts_loss_tokens_and_trains_through_a_hole(tmp_path, tiny_model_dir, tiny_dataset, ppo):
    from grpo.infra.logger import NullLogger
    from grpo.train.trainer import Trainer
    from tests.test_trainer import make_cfg

    kw = dict(advantage_estimator="gae", beta=0.05, critic_learning_rate=1e-2) if ppo else {}
    t = Trainer(make_cfg(tmp_path, tiny_model_dir, tiny_dataset, eval_prompts=0, max_completion_length=8, **kw))
    t.logger = NullLogger()
    samples, ro = t.collector.sample(step=t.step, temperature=t.knobs.temperature)
    hole = _hole_in_longest_row(ro)
    rewards, _ = t.collector.score(samples, ro, step=t.step)
    batch, metrics = t.prepare(ro, rewards)
    assert not batch.mask[hole].any() and (batch.mask <= ro.loss_mask).all()
    assert metrics["completion_length_max"] == float(ro.lengths.max())  # lengths: the context's
    if ppo:
        # GAE and whitening on loss tokens only (GRPO broadcasts its advantages to every column)
        assert not batch.advantages[hole].any() and not batch.returns[hole].any()
    out = t.update(batch)
    assert all(v == v for v in out.values() if isinstance(v, float))  # finite, not NaN
