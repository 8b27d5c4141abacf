"""The fast backend draws exactly the tokens of the HF backend with the same keys (and greedy),
with sampling log-probs that match, while prefilling each prompt once and dropping ended rows."""

import copy

import pytest
import torch

from grpo.models import load_models
from grpo.rollout import generate_rollout, resolve_engine
from grpo.rollout.fast import fast_rollout, fast_unsupported_reason
from grpo.rollout.keys import row_keys
from tests.conftest import need_native, runnable_kernels

PROMPTS = ["What is 1 + 1?", "Hi", "What is 12 + 30? Answer with a number.", "x"]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    m = load_models(str(tiny_model_dir), need_reference=False)
    return m.policy, m.tokenizer


def _eos_biased(model, tok, bias: float):
    """The tiny model with its EOS logit raised so completions end at different, early steps."""
    model = copy.deepcopy(model)
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    head.weight = model.lm_head.weight
    with torch.no_grad():
        head.bias.zero_()
        head.bias[tok.eos_token_id] = bias
    model.lm_head = head
    return model


# each case's products are pinned, not timed (the tokens must not depend on which product measured
# fastest under the machine's load); together the cases run every product
@pytest.mark.parametrize("prompts,g,temperature,top_k,top_p,eos_bias,kernels", [
    (PROMPTS, 3, 1.0, 0, 1.0, 0.0, "mkl"),
    (PROMPTS[:2], 4, 0.7, 5, 1.0, 1.0, "onednn"),
    (PROMPTS[1:], 2, 1.3, 0, 0.8, 4.5, "panel"),
    (PROMPTS[2:3], 8, 0.9, 20, 0.95, 2.5, "qkv=panel,o=onednn,gate_up=mkl,down=panel,head=onednn"),
])
@pytest.mark.parametrize("use_native", [True, False])
def test_fast_tokens_equal_hf_tokens(tiny, prompts, g, temperature, top_k, top_p, eos_bias, kernels, use_native):
    if use_native:  # without a compiler the loop would step TorchDecoder: the case is skipped, not run as the other
        need_native()
    model, tok = tiny
    if eos_bias:
        model = _eos_biased(model, tok, eos_bias)
    kw = dict(group_size=g, max_new_tokens=12, temperature=temperature, top_k=top_k, top_p=top_p,
              keys=row_keys(3, 5, 0, len(prompts) * g))
    ref = generate_rollout(model, tok, prompts, **kw)
    fast = fast_rollout(model, tok, prompts, use_native=use_native, kernels=runnable_kernels(kernels), **kw)
    assert fast.engine == "fast"
    assert torch.equal(fast.completion_ids, ref.completion_ids)
    assert torch.equal(fast.completion_mask, ref.completion_mask)
    assert torch.equal(fast.truncated, ref.truncated)
    assert torch.equal(fast.prompt_ids, ref.prompt_ids) and torch.equal(fast.prompt_mask, ref.prompt_mask)
    assert fast.texts == ref.texts
    torch.testing.assert_close(fast.sampling_logp, ref.sampling_logp, atol=1e-4, rtol=0)
    if eos_bias:  # the case is only meaningful if some rows ended early and others went on
        lengths = ref.lengths
        assert int(lengths.min()) < int(lengths.max()), lengths.tolist()


def test_fast_greedy_equals_hf_greedy(tiny):
    model, tok = tiny
    kw = dict(group_size=2, max_new_tokens=10, greedy=True)
    ref = generate_rollout(model, tok, PROMPTS, **kw)
    fast = fast_rollout(model, tok, PROMPTS, kernels="mkl", **kw)  # pinned, not timed
    assert torch.equal(fast.completion_ids, ref.completion_ids) and fast.texts == ref.texts
    assert fast.sampling_logp is None and ref.sampling_logp is None


def test_fast_refuses_what_it_cannot_run(tiny):
    model, tok = tiny
    assert fast_unsupported_reason(model) is None
    assert "synced" in fast_unsupported_reason(model, synced=True)
    with pytest.raises(ValueError, match="rollout_engine fast"):
        fast_rollout(model, tok, PROMPTS, group_size=2, max_new_tokens=4, synced=True)


@pytest.mark.parametrize("use_native", [True, False])
def test_fast_prefills_each_prompt_once_and_drops_ended_rows(tiny, monkeypatch, use_native):
    """The forward batch sizes, read by a hook on the real model's decoder (the prefill) and on the
    fused decode step: the prefill sees B = 2 prompts (not N = 8 rows), the first decode step all 8
    rows, and later steps only the rows still going, so the batch never grows and ends as small as
    the number of rows of maximal length."""
    from grpo.rollout.decoder import TorchDecoder
    from grpo.rollout.native import NativeDecoder

    if use_native:
        need_native()
    cls = NativeDecoder if use_native else TorchDecoder
    model, tok = tiny
    model = _eos_biased(model, tok, 1.0)
    sizes = []
    handle = model.get_decoder().register_forward_pre_hook(lambda mod, args, kwargs: sizes.append(kwargs["input_ids"].shape),
                                             with_kwargs=True)
    step = cls.step
    monkeypatch.setattr(cls, "step", lambda self, tokens, *a: sizes.append(tokens[:, None].shape)
                        or step(self, tokens, *a))
    try:
        ro = fast_rollout(model, tok, PROMPTS[:2], group_size=4, max_new_tokens=12, temperature=0.7, top_k=5,
                          keys=row_keys(3, 5, 0, 8), use_native=use_native)
    finally:
        handle.remove()
    lengths = ro.lengths.tolist()
    assert sizes[0][0] == 2 and sizes[0][1] == ro.prompt_ids.shape[1]  # [B, P] prefill
    batch = [s[0] for s in sizes[1:]]
    assert batch == sorted(batch, reverse=True) and batch[0] == sum(1 for n in lengths if n > 1)
    # step t (1-based) decodes the rows whose completion is longer than t tokens
    assert batch == [sum(1 for n in lengths if n > t) for t in range(1, max(lengths))], (batch, lengths)


def test_auto_backend_falls_back_to_generate(tiny):
    model, _ = tiny
    assert resolve_engine("auto", model) == "fast"
    assert resolve_engine("auto", model, synced=True) == "hf"  # FSDP2 generation is a collective
    assert resolve_engine("hf", model) == "hf"
    with pytest.raises(ValueError, match="valid: hf, fast, auto, vllm"):
        resolve_engine("no-such-engine", model)


def test_a_decoder_that_ignores_the_cache_is_a_clear_error(tiny, monkeypatch):
    """A decoder that drops the cache it is given (as transformers 5.17 dropped an unknown 'cache'
    keyword) would leave the decode loop reading an empty cache: it is refused after the prefill."""
    from grpo.rollout import fast

    model, tok = tiny
    monkeypatch.setattr(fast, "cache_keyword", lambda decoder: "unused_keyword")
    with pytest.raises(RuntimeError, match="ignored the cache"):
        fast_rollout(model, tok, PROMPTS[:1], group_size=2, max_new_tokens=3, keys=row_keys(0, 0, 0, 2))
