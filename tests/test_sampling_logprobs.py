"""Which distribution each log-prob uses under top-k, top-p, min-p and the repetition penalty
(grpo.core.sampling): the engines report log q of the drawn token, the trainer computes log q of the same
token for the importance corrections, and a run's correction weights are 1 where sampler and trainer are
one model (comparing log q with pi_T instead leaves the kept mass in every weight: TRL's 1.17 fix)."""

from __future__ import annotations

import json

import pytest
import torch

from grpo.config import Config
from grpo.rollout.fast import fast_rollout
from grpo.rollout.hf import generate_rollout
from grpo.rollout.keys import row_keys
from grpo.train.forwards import Forwards
from grpo.train.trainer import Trainer
from tests.conftest import TEST_SEED, build_tiny_model, build_tokenizer

SETTINGS = dict(temperature=0.9, top_k=40, top_p=0.85, min_p=0.05, repetition_penalty=1.3)
PROMPTS = ["What is 1 + 1?", "Say hi", "Count: 1 2 3"]


def _rollouts():
    tok = build_tokenizer()
    model = build_tiny_model(len(tok), seed=TEST_SEED, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    model.generation_config.eos_token_id = tok.eos_token_id
    kw = dict(group_size=2, max_new_tokens=16, keys=row_keys(TEST_SEED, 2, 0, 6), **SETTINGS)
    return tok, model, generate_rollout(model, tok, PROMPTS, **kw), fast_rollout(model, tok, PROMPTS, kernels="mkl", **kw)


def test_the_engines_draw_alike_and_report_log_q_which_the_trainer_recomputes():
    tok, model, hf, fast = _rollouts()
    assert torch.equal(hf.completion_ids, fast.completion_ids)
    mask = hf.completion_mask.bool()
    torch.testing.assert_close(fast.sampling_logp[mask], hf.sampling_logp[mask], atol=1e-4, rtol=0)
    fw = Forwards(group_size=2, share_prompt=False, attn_implementation="sdpa", autocast=False, max_tokens=0,
                  sharded=False, tied_grad_in_place=False,
                  processing={k: v for k, v in SETTINGS.items() if k != "temperature"})
    with torch.no_grad():
        out = fw.logprobs(model, hf, torch.arange(6), temperature=SETTINGS["temperature"], with_q=True)
    torch.testing.assert_close(out["qlogp"][mask], hf.sampling_logp[mask], atol=1e-4, rtol=0)
    # against pi_T the engine's numbers are higher by the kept mass: the bias the corrections must not see
    kept = torch.exp(out["logp"] - hf.sampling_logp)[mask]  # pi_T / q = the kept mass, <= 1
    assert float(kept.mean()) < 0.99 and bool((kept <= 1 + 1e-4).all())


@pytest.mark.parametrize("iterations", [1, 2])  # 1: weights in the update's forward; 2: from the old policy's pass
def test_a_corrected_run_under_truncation_weighs_its_own_tokens_by_one(tmp_path, tiny_model_dir, iterations):
    """The sampler is the trainer's own model: with log q on both sides every weight is 1 (to the kernels'
    rounding); with pi_T on the trainer's side they would be the kept mass."""
    cfg = Config(model=str(tiny_model_dir), task="arithmetic", output_dir=str(tmp_path / "run"), max_steps=2,
                 num_generations=2, prompts_per_step=2, per_device_train_batch_size=4, max_completion_length=12,
                 eval_prompts=0, learning_rate=1e-2, progress=False, report_to="none", seed=TEST_SEED,
                 rewards="tests.rewards_for_tests:digit_share", rollout_engine="fast", rollout_correction="truncate",
                 rollout_correction_high=100.0, num_iterations=iterations,
                 generation_kwargs={"top_p": 0.8, "min_p": 0.05}, top_k=30, repetition_penalty=1.2)
    assert (cfg.top_p, cfg.min_p) == (0.8, 0.05)
    Trainer(cfg).train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        assert abs(line["rollout_is_weight_mean"] - 1.0) < 1e-3 and line["rollout_is_weight_min"] > 0.99, line


def test_a_models_own_generation_config_does_not_change_what_the_engines_draw():
    """A Hub model may ship a repetition penalty or min_p in its generation_config (Qwen2.5-Instruct ships
    1.05): generate must not apply them beside the run's q, so hf draws what fast draws."""
    tok = build_tokenizer()
    model = build_tiny_model(len(tok), seed=TEST_SEED, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    model.generation_config.repetition_penalty, model.generation_config.min_p = 50.0, 0.3
    kw = dict(group_size=2, max_new_tokens=10, keys=row_keys(TEST_SEED, 1, 0, 6), temperature=1.0)
    hf, fast = generate_rollout(model, tok, PROMPTS, **kw), fast_rollout(model, tok, PROMPTS, kernels="mkl", **kw)
    assert torch.equal(hf.completion_ids, fast.completion_ids)
