"""The metric catalog (grpo/train/metrics_catalog.py) names every key metrics.jsonl can hold: tiny
trainings with the features on (two steps each) log no key the catalog lacks, and every catalog entry
is logged by one of them (but the few that need a sandbox or a signal, listed below)."""

from __future__ import annotations

import json

import pytest

from grpo.config import Config
from grpo.train.metrics_catalog import METRICS, lookup
from grpo.train.trainer import Trainer
from tests.conftest import TEST_SEED, build_tiny_model, build_tiny_reward_model, build_tokenizer

DIGITS = "tests.rewards_for_tests:digit_share"
RUNS = {
    "default": dict(eval_steps=1, eval_prompts=2, consistency_steps=1, rewards=f"numeric,{DIGITS}"),
    "ppo": dict(advantage_estimator="gae", cov_mode="kl_cov", num_iterations=2, dual_clip=3.0, clip_delta=4.0,
                importance_sampling_level="sequence", save_steps=1),
    "ppo_shared_trunk": dict(advantage_estimator="gae", critic_shared_trunk=True),
    "filters_and_controllers": dict(
        dynamic_sampling=True, overlong_buffer=4, overlong_filter=True, policy_filter="best_worst",
        cov_mode="clip_cov", entropy_target_band=[0.5, 1.0], clip_target_band=[0.05, 0.2], kl_target=0.01,
        fuse_metric="reward_mean", fuse_max=100.0, num_iterations=2),
    "monitors": dict(monitor_preset="clip_gav_probe", num_iterations=2, consistency_steps=1, consistency_prompts=1,
                     consistency_group_size=2, top_entropy_quantile=0.5, off_policy_mask_threshold=0.5),
    "process_supervision": dict(task="arithmetic", rewards="numeric", supervision="process"),
    # held-out ranking needs a group whose verifier scores differ: odd_length splits a random model's
    # completions about half and half, and 3 held-out groups all tied is about 1 in 500 seeds
    "reward_model_training": dict(rewards="reward_model", reward_model_train_steps=1, ref_reset_steps=1,
                                  reward_model_heldout=3, reward_model_verifier="tests.rewards_for_tests:odd_length",
                                  reward_model_warmup_draws=2, reward_model_transform="sigmoid", max_steps=2),
    "prm_training": dict(supervision="process", step_reward="prm:{prm}", reward_model_train_steps=1, ref_reset_steps=1,
                         reward_model_heldout=1, prm_label_solutions=3, prm_label_continuations=2,
                         reward_model_verifier=DIGITS, max_steps=2),
    "tools": dict(task="calculator", tools="builtin:calculator", max_turns=2, max_completion_length=12,
                  eval_prompts=1, eval_max_new_tokens=12, rollout_engine="hf", eval_steps=1),
    "mixture": dict(task="arithmetic:0.5,calculator:0.5", max_turns=2, eval_prompts=1, eval_steps=1,
                    rollout_engine="hf", difficulty_sampling=True),
    "gdpo_cispo": dict(policy_loss="cispo", rewards=f"numeric,{DIGITS}", multi_objective_aggregation="normalize_then_sum",
                       logic_consistency=True),
    "sapo_rollout_mask": dict(policy_loss="sapo", rollout_correction="mask", rollout_engine="fast"),
    "gmpo_rollout_truncate": dict(policy_loss="gmpo", num_iterations=2, mini_batches=2, entropy_coef=0.01,
                                  token_weight_gamma=2.0, rollout_correction="truncate", rollout_engine="hf"),
}
# logged only where a run cannot be made here in seconds: the code rewards' resampling needs the
# sandbox and a code task, an interrupted evaluation a signal in the middle of one; the asynchronous
# rollouts' keys are checked against the catalog by tests/test_async_rollouts.py's runs (each with an
# engine process, and stale tokens only where a reward waits); the tiny random model writes no
# connective, whose pairs' mean cosine the regulariser logs; the distill loss needs a teacher model
# (tests/test_distill_training.py trains with one); launcher=ray's keys are checked by tests/test_cluster.py's runs
# on a Ray cluster
NOT_EXERCISED = {"resample_rounds", "resampled_completions", "invalid_after_resampling", "eval/interrupted",
                 "eval/prompts_scored", "eval/<suite>/prompts_scored", "logic_consistency_cos_mean", "distill_reverse_kl",
                 *(m.key for m in METRICS if m.key.startswith(("async/", "cluster/")))}


def build_tiny_prm(path):
    """A tiny random Llama over the byte-level test tokenizer, read as a PRM (tag '#', words '+' and '-')."""
    from grpo.rewards.prm import PRMSpec

    tok = build_tokenizer()
    build_tiny_model(len(tok), seed=1, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id).save_pretrained(path)
    tok.save_pretrained(path)
    PRMSpec(step_tag="#", good="+", bad="-").write(path)
    return path


@pytest.fixture(scope="module")
def logged_keys(tmp_path_factory, tiny_model_dir):
    """{run name: the keys of its metrics.jsonl}."""
    base = tmp_path_factory.mktemp("catalog")
    data = base / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                            for a in range(1, 7) for b in range(1, 5)))
    rm = build_tiny_reward_model(base / "rm")
    prm = build_tiny_prm(base / "prm")
    out = {}
    for name, extra in RUNS.items():
        extra = {k: v.format(prm=prm) if isinstance(v, str) else v for k, v in extra.items()}
        cfg = Config(**{**dict(model=str(tiny_model_dir), task=str(data), max_steps=1, num_generations=4,
                               prompts_per_step=2, max_completion_length=8, eval_prompts=0, eval_max_new_tokens=6,
                               eval_pass_k=2, eval_pass_prompts=1, rewards=DIGITS, learning_rate=1e-2,
                               temperature=1.0, progress=False, report_to="none", reward_timeout=0.0, bf16=False,
                               seed=TEST_SEED, reward_model=str(rm), output_dir=str(base / name)), **extra})
        Trainer(cfg).train()
        lines = (base / name / "metrics.jsonl").read_text().splitlines()
        out[name] = {k for line in lines for k in json.loads(line)}
    return out


def test_every_logged_key_is_in_the_catalog(logged_keys):
    unknown = {name: sorted(k for k in keys if lookup(k) is None) for name, keys in logged_keys.items()}
    unknown = {name: keys for name, keys in unknown.items() if keys}
    assert not unknown, f"metrics.jsonl keys missing from grpo/train/metrics_catalog.py: {unknown}"


def test_every_catalog_entry_is_logged_by_a_run(logged_keys):
    seen = {lookup(k).key for keys in logged_keys.values() for k in keys}
    never = sorted(m.key for m in METRICS if m.key not in seen and m.key not in NOT_EXERCISED)
    assert not never, f"catalog entries no run logged (a renamed or removed metric?): {never}"


def test_families_and_unknown_keys():
    assert lookup("rewards/my_rewards:exact").key == "rewards/<reward>"
    assert lookup("rewards/http://127.0.0.1:8000/score").key == "rewards/<reward>"
    assert lookup("time/sync_seconds").key == "time/<stage>_seconds"
    assert lookup("time/lunch_seconds") is None and lookup("no_such_metric") is None
    assert len({m.key for m in METRICS}) == len(METRICS), "a key is in the catalog twice"
