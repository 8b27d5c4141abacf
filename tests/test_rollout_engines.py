"""The rollout engines' contract, checked on every registry entry: one constructor, keyed sampling
that agrees across the engines declaring ``same_tokens_for_keys``, the weights of the last
``sync_weights`` sampled, an idempotent ``close``, and unknown names refused with the valid ones."""

import copy
import inspect

import pytest
import torch

from grpo.config import Config
from grpo.errors import ConfigError
from grpo.infra.process_cache import ProcessCache
from grpo.models import load_models
from grpo.rollout import ROLLOUT_ENGINES, AutoEngine, RolloutEngine, SamplingSettings, make_engine, tuning
from grpo.rollout.keys import row_keys

PROMPTS = ["What is 1 + 1?", "Hi", "What is 12 + 30? Answer with a number."]
# in-process engines, built many times below; vllm (an engine process, ~20 s to start) runs the same
# contract on one shared engine in tests/test_vllm.py
IN_PROCESS = [n for n in ROLLOUT_ENGINES if not ROLLOUT_ENGINES[n].own_kernels]
SAMPLING = SamplingSettings(max_new_tokens=10, temperature=0.9, top_k=20, top_p=0.95, max_prompt_length=1024)
# the fast loop's products where tokens are compared: pinned, not timed (test_rollout_fast runs each product)
KERNELS = "mkl"


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    """auto's speed probe measures into a cache folder of this test's own."""
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    monkeypatch.setattr(tuning, "MEASURED", ProcessCache("this test's", stale_when="the test ends"))


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    m = load_models(str(tiny_model_dir), need_reference=False)
    return m.policy, m.tokenizer


def test_the_registry_holds_every_backend_with_one_constructor():
    assert set(ROLLOUT_ENGINES) == {"hf", "fast", "auto", "vllm", "vllm_server"}
    params = {name: list(inspect.signature(cls.__init__).parameters) for name, cls in ROLLOUT_ENGINES.items()}
    assert all(p == ["self", "model", "tokenizer", "synced", "kernels", "options"] for p in params.values()), params
    for name, cls in ROLLOUT_ENGINES.items():
        assert issubclass(cls, RolloutEngine) and cls.name == name
        assert isinstance(cls.same_tokens_for_keys, bool) and isinstance(cls.returns_sampling_logprobs, bool)
        assert isinstance(cls.own_kernels, bool) and isinstance(cls.serves_evaluation, bool)
        assert cls.unavailable_reason() is None or "pip install" in cls.unavailable_reason()


@pytest.mark.parametrize("name", [n for n, cls in ROLLOUT_ENGINES.items() if cls.same_tokens_for_keys])
def test_engines_declaring_it_draw_the_same_tokens_for_the_same_keys(tiny, name):
    model, tok = tiny
    keys = row_keys(3, 5, 0, len(PROMPTS) * 2)
    ref = make_engine("hf", model, tok).generate(PROMPTS, group_size=2, sampling=SAMPLING, keys=keys)
    engine = make_engine(name, model, tok, kernels=KERNELS)
    ro = engine.generate(PROMPTS, group_size=2, sampling=SAMPLING, keys=keys)
    assert torch.equal(ro.completion_ids, ref.completion_ids) and ro.texts == ref.texts
    assert torch.equal(ro.prompt_ids, ref.prompt_ids) and torch.equal(ro.completion_mask, ref.completion_mask)
    other = make_engine(name, model, tok, kernels=KERNELS).generate(PROMPTS, group_size=2, sampling=SAMPLING,
                                                                    keys=row_keys(4, 5, 0, len(PROMPTS) * 2))
    assert other.texts != ro.texts  # the keys decide the tokens
    as_tensor = make_engine(name, model, tok, kernels=KERNELS).generate(PROMPTS, group_size=2, sampling=SAMPLING,
                                                                        keys=torch.tensor(keys))  # [N] int64
    assert torch.equal(as_tensor.completion_ids, ref.completion_ids)


@pytest.mark.parametrize("name", IN_PROCESS)
def test_each_engine_samples_greedy_and_unkeyed(tiny, name):
    model, tok = tiny
    engine = make_engine(name, model, tok, kernels=KERNELS)
    greedy = engine.generate(PROMPTS, group_size=2, sampling=SAMPLING, greedy=True)
    ref = make_engine("hf", model, tok).generate(PROMPTS, group_size=2, sampling=SAMPLING, greedy=True)
    assert torch.equal(greedy.completion_ids, ref.completion_ids)
    free = engine.generate(PROMPTS[:1], group_size=3, sampling=SAMPLING)  # the global RNG, no keys
    assert free.completion_ids.shape[0] == 3 and free.sampling_logp is None  # with_logprobs defaults off
    keyed = engine.generate(PROMPTS[:1], group_size=3, sampling=SAMPLING, keys=row_keys(0, 0, 0, 3),
                            with_logprobs=True)
    assert (keyed.sampling_logp is not None) == type(engine).returns_sampling_logprobs
    assert keyed.engine in ("hf", "fast") and (name == "auto" or keyed.engine == name)
    with pytest.raises(ValueError, match="keys: 2 given for 3 rows"):
        engine.generate(PROMPTS[:1], group_size=3, sampling=SAMPLING, keys=row_keys(0, 0, 0, 2))


def test_an_unknown_engine_lists_the_valid_ones(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="unknown rollout engine 'sglang'; valid: hf, fast, auto, vllm, vllm_server"):
        make_engine("sglang", model, tok)
    with pytest.raises(ConfigError, match="rollout_engine: 'sglang' is not valid; choose one of"):
        Config(rollout_engine="sglang")
    for name in IN_PROCESS:
        assert Config(rollout_engine=name).rollout_engine == name


@pytest.mark.parametrize("name", IN_PROCESS)
def test_generate_after_sync_weights_samples_the_new_weights(tiny, name):
    model, tok = tiny
    model = copy.deepcopy(model)
    engine = make_engine(name, model, tok, kernels=KERNELS)
    before = engine.generate(PROMPTS, group_size=1, sampling=SAMPLING, greedy=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    engine.sync_weights(model)
    after = engine.generate(PROMPTS, group_size=1, sampling=SAMPLING, greedy=True)
    fresh = make_engine(name, model, tok, kernels=KERNELS).generate(PROMPTS, group_size=1, sampling=SAMPLING,
                                                                    greedy=True)
    assert torch.equal(after.completion_ids, fresh.completion_ids)
    assert after.texts != before.texts
    with pytest.raises(ValueError, match="samples from the model it was built on"):
        engine.sync_weights(tiny[0])


@pytest.mark.parametrize("name", IN_PROCESS)
def test_close_is_idempotent_and_ends_sampling(tiny, name):
    model, tok = tiny
    engine = make_engine(name, model, tok)
    engine.close()
    engine.close()
    with pytest.raises(RuntimeError, match="after close"):
        engine.generate(PROMPTS, group_size=1, sampling=SAMPLING, greedy=True)
    if isinstance(engine, AutoEngine):
        assert all(e.closed for e in engine.engines.values())


def test_synced_generation_runs_on_generate_only(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="rollout_engine fast: synced"):
        make_engine("fast", model, tok, synced=True)
    auto = make_engine("auto", model, tok, synced=True)
    assert list(auto.engines) == ["hf"] and auto.choose(rows=4, group_size=2) is auto.engines["hf"]
