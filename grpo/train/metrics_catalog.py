"""Every key a line of ``metrics.jsonl`` can hold, with its meaning and unit.

The documentation's metrics reference is generated from ``METRICS``; tests/test_metrics_catalog.py
trains a tiny model with the features on and fails on any key this catalog does not name. A key
with ``<...>`` stands for a family: ``rewards/<reward>`` is one key per reward in ``rewards``,
``time/<stage>_seconds`` one per stage of ``grpo.infra.timing.STAGES``, ``async/staleness_<k>`` one
per staleness 0 ... max_staleness, ``share/<source>`` one per source of a mixture,
``eval/<suite>/accuracy`` one per evaluation suite. Besides these, a reward in
TRL's form may log keys of its own (``log_metric``); they are the reward author's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from grpo.infra.timing import STAGES


@dataclass(frozen=True)
class Metric:
    key: str  # the key, or a family with one <placeholder>
    unit: str
    meaning: str
    when: str  # which runs log it
    topic: str


# the placeholders of family keys and what each stands for (a regular expression)
PLACEHOLDERS = {"<reward>": ".+", "<stage>": "(?:" + "|".join(STAGES) + ")", "<k>": "[0-9]+", "<source>": ".+",
                "<suite>": ".+"}

EVERY = "every step"


def _m(topic: str, when: str, rows: list[tuple[str, str, str]]) -> list[Metric]:
    return [Metric(key, unit, meaning, when, topic) for key, unit, meaning in rows]


_TOOLS = [
    ("tools/call_rate", "share", "episodes with at least one well-formed tool call"),
    ("tools/calls_per_episode", "calls", "tool calls per episode, mean"),
    ("tools/turns", "turns", "model turns per episode, mean"),
    ("tools/errors", "count", "tool calls answered with an error (malformed, unknown tool, bad arguments, raised)"),
    ("tools/timeouts", "count", "tool calls past `tool_timeout`"),
    ("tools/max_turns_share", "share", "episodes ended by `max_turns` (also counted as truncated)"),
]

METRICS: tuple[Metric, ...] = tuple(
    _m("step", EVERY, [
        ("step", "step", "the training step this line belongs to (1 after the first optimizer update)"),
        ("step_seconds", "s", "wall time of the step, its periodic evaluation and checkpoint included"),
        ("generation_seconds", "s", "time the rollout engine took to sample the step's completions"),
        ("tokens_per_second", "tokens/s", "completion tokens sampled per second, all processes together"),
        ("rollout_engine", "name", "the engine that sampled (hf, fast, vllm, vllm_server)"),
        ("time/<stage>_seconds", "s", "seconds spent in one stage of the step: sampling, rewards, old_logp, "
         "reference, update, sync, eval, checkpoint; 0.0 where the stage did not run"),
        ("prompts_truncated", "count", "prompts of this step cut to `max_prompt_length` (from the middle: the system message and tools kept)"),
        ("nonfinite_count", "count", "metrics of this step that are NaN or infinite"),
    ])
    + _m("rewards", EVERY, [
        ("reward_mean", "reward", "mean reward of the step's scored completions (after reward shaping)"),
        ("reward_std", "reward", "population standard deviation of those rewards"),
        ("reward_group_std", "reward", "standard deviation of the rewards inside each group, averaged over groups"),
        ("rewards/<reward>", "reward", "mean of one reward function's raw scores (one key per entry of `rewards`)"),
        ("accuracy", "share", "completions whose first reward is at least 1.0"),
        ("zero_variance_share", "share", "groups whose rewards are all equal: they carry no group-relative signal"),
        ("all_correct_share", "share", "groups whose completions all reach `correct_threshold`"),
        ("all_wrong_share", "share", "groups whose completions all stay below `correct_threshold`"),
        ("reward_failures", "count", "completions of this step no reward could score (left out of the loss)"),
        ("reward_failures_total", "count", "reward failures since the run started"),
        ("reward_timeouts_total", "count", "reward calls past `reward_timeout` since the run started"),
        ("grading_seconds", "s", "wall time of the step's reward calls (the slowest process)"),
    ])
    + _m("rewards", "resample_invalid_rounds > 0 with a reward that declares which completions it can grade", [
        ("resample_rounds", "rounds", "extra sampling rounds spent on completions no reward could grade"),
        ("resampled_completions", "count", "completions sampled again because they could not be graded"),
        ("invalid_after_resampling", "count", "completions still ungradable after the last round"),
    ])
    + _m("rewards", "supervision=process", [
        ("step_reward_mean", "reward", "mean step reward over the reasoning steps found"),
        ("steps_per_completion", "steps", "reasoning steps scored per completion, mean"),
        ("step_reward_failures", "count", "completions whose step reward raised or returned malformed steps"),
    ])
    + _m("completions", EVERY, [
        ("completion_length_mean", "tokens", "mean completion length"),
        ("completion_length_max", "tokens", "longest completion"),
        ("truncated_share", "share", "completions cut at `max_completion_length` (or, with tools, `max_turns`)"),
        ("distinct_1", "share", "distinct unigrams / all unigrams of the step's completions (diversity)"),
        ("distinct_2", "share", "distinct bigrams / all bigrams"),
        ("loop_share", "share", "completions in which a span of up to 8 tokens repeats 4 times back to back"),
    ])
    + _m("advantages", "every step with an outcome reward (not with supervision=process)", [
        ("advantage_variance", "advantage^2", "variance of the advantages inside each group, averaged over groups"),
    ])
    + _m("advantages", EVERY, [
        ("gav", "reward", "group advantage variance: the std inside each group of r_i minus the mean of the "
         "other rewards, averaged over groups (0.15-0.25 is a healthy range for 0/1 rewards)"),
    ])
    + _m("advantages", "multi_objective_aggregation=normalize_then_sum", [
        ("advantage_batch_std", "advantage", "standard deviation of the summed per-reward advantages over the batch"),
    ])
    + _m("advantages", "token_weight_gamma != 1", [
        ("weighted_token_share", "share", "counted tokens whose advantage `token_weight_gamma` multiplies"),
    ])
    + _m("advantages", "logic_consistency=true", [
        ("logic_consistency_penalty", "penalty", "the regulariser's penalty c per completion (the sum over its "
         "connectives of 1 - cos(connective, the step after it)), mean"),
        ("logic_consistency_loss", "loss", "logic_consistency_coef times logic_consistency_penalty"),
        ("logic_connectives_mean", "connectives", "connectives per completion, mean"),
        ("logic_consistency_advantage_abs", "advantage", "|A_cons|, the regulariser's advantage per completion, mean"),
    ])
    + _m("advantages", "logic_consistency=true, steps where a completion holds a connective", [
        ("logic_consistency_cos_mean", "cosine", "mean cosine of a completion's (connective, step) pairs, mean over "
         "the completions with a connective"),
    ])
    + _m("loss", EVERY, [
        ("loss", "loss", "the optimised loss, mean over the step's optimizer steps"),
        ("policy_loss", "loss", "its policy-gradient part (without the KL and entropy terms)"),
        ("kl", "nats", "per-token KL to the reference (the estimator `kl_estimator`), mean over counted tokens"),
        ("entropy", "nats", "per-token entropy of the policy, mean over counted tokens"),
        ("ratio_mean", "ratio", "mean importance ratio pi_theta / pi_old over counted tokens"),
        ("clip_fraction", "share", "tokens whose gradient the clip removed (ratio above 1 + eps with A > 0, "
         "below 1 - eps with A < 0)"),
        ("clip_fraction_low", "share", "of those, clipped below (A < 0)"),
        ("clip_fraction_high", "share", "of those, clipped above (A > 0)"),
    ])
    + _m("loss", "clip_delta set", [
        ("clip_fraction_delta", "share", "negative-advantage tokens whose ratio the two-sided clip capped at delta"),
    ])
    + _m("loss", "cov_mode set", [
        ("cov_token_share", "share", "tokens Clip-Cov detached or KL-Cov penalised"),
    ])
    + _m("loss", "policy_loss=distill", [
        ("distill_reverse_kl", "nats", "the mean sampled per-token reverse KL of the student to the teacher (detached)"),
    ])
    + _m("loss", "policy_loss=sapo", [
        ("sapo_gate_mean", "weight", "mean of SAPO's soft gate weight (1 on-policy)"),
    ])
    + _m("loss", "top_entropy_quantile < 1", [
        ("entropy_mask_share", "share", "counted tokens the high-entropy mask keeps in the policy gradient"),
    ])
    + _m("loss", "off_policy_mask_threshold set", [
        ("off_policy_masked_share", "share", "counted tokens of sequences the off-policy mask removed"),
    ])
    + _m("optimisation", EVERY, [
        ("grad_norm", "norm", "global gradient norm before clipping, at the step's last optimizer step"),
        ("grad_norm_max", "norm", "the largest of the step's gradient norms"),
        ("learning_rate", "lr", "the learning rate after the step's scheduler steps"),
        ("optimizer_steps", "count", "optimizer steps taken this step (num_iterations x mini_batches with data)"),
        ("trained_sequence_share", "share", "sequences that ran the forward and backward pass (the others have "
         "zero advantage and no gradient: skip_zero_advantage)"),
        ("skipped_updates", "count", "optimizer steps skipped for a non-finite loss or gradient norm since the start"),
    ])
    + _m("knobs", EVERY, [
        ("epsilon", "ratio", "the lower clip range this step trained with"),
        ("epsilon_high", "ratio", "the upper clip range this step trained with"),
        ("beta", "coefficient", "the KL coefficient this step trained with"),
        ("entropy_coef", "coefficient", "the entropy bonus weight this step trained with"),
        ("temperature", "temperature", "the sampling (and loss) temperature this step used"),
    ])
    + _m("filters", "dynamic_sampling=true", [
        ("dynamic_sampling_rounds", "rounds", "sampling rounds this step drew"),
        ("dynamic_sampling_dropped_share", "share", "sampled groups dropped because their rewards were all equal"),
        ("dynamic_sampling_empty", "0/1", "1 when no round kept a group (the step trained on the last draw)"),
        ("trained_groups", "groups", "groups the step trained on"),
    ])
    + _m("filters", "overlong_buffer > 0", [
        ("overlong_penalty_mean", "reward", "mean soft overlong penalty added to the rewards"),
    ])
    + _m("filters", "policy_filter set", [
        ("policy_filter_kept_share", "share", "completions PF-PPO kept in the loss"),
    ])
    + _m("controllers", "fuse_metric set", [
        ("fuse_strikes", "steps", "consecutive steps the fused metric has been outside its band"),
    ])
    + _m("controllers", "clip_step_band set", [
        ("clip_fraction_state", "name", "where the clip fraction is against the band: below, inside or above"),
        ("clip_fraction_strikes", "steps", "consecutive steps on that side of the band"),
    ])
    + _m("monitors", "steps with a consistency probe (consistency_steps)", [
        ("consistency_cv", "ratio", "coefficient of variation of G rewards on fixed held-out prompts, mean over prompts"),
        ("consistency_reward_mean", "reward", "mean reward of the probe's samples"),
    ])
    + _m("monitors", "consistency_steps > 0, every step", [
        ("consistency_state", "name", "the probe's reading: converging, between or guessing (unprobed before the first)"),
        ("consistency_plateau_step", "step", "the first probe step whose coefficient of variation fell below "
         "`consistency_plateau` (null until then)"),
    ])
    + _m("critic", "advantage_estimator=gae", [
        ("value_loss", "loss", "clipped value loss, mean over the step's critic updates"),
        ("value_clip_fraction", "share", "tokens whose value the value clip held back"),
        ("value_grad_norm", "norm", "the critic's gradient norm, mean over its updates"),
        ("value_grad_norm_max", "norm", "the largest of those"),
        ("value_mean", "return", "mean predicted value over counted tokens"),
        ("explained_variance", "ratio", "1 - Var[returns - values] / Var[returns]: 1 a perfect critic, 0 a constant"),
        ("critic_diverged", "0/1", "1 when the value loss exceeded critic_divergence_factor x its lowest so far"),
        ("critic_divergence_events", "count", "such steps since the run started"),
    ])
    + _m("rollout correction", "rollout_correction active (vllm engines by default)", [
        ("mismatch_kl_k1", "nats", "k1 estimate of KL(pi_engine || pi_train) on the sampled tokens"),
        ("mismatch_kl_k3", "nats", "k3 estimate of the same"),
        ("rollout_is_weight_mean", "ratio", "mean importance weight pi_train / pi_engine"),
        ("rollout_is_weight_min", "ratio", "smallest weight"),
        ("rollout_is_weight_max", "ratio", "largest weight"),
        ("rollout_is_masked_share", "share", "tokens whose weight fell outside the band and was zeroed (mask)"),
        ("rollout_is_clipped_share", "share", "tokens whose weight was clamped into the band (truncate)"),
        ("rollout_is_sequences", "sequences", "sequences the metrics above cover: all of the step's when the old "
         "policy's log-probs are computed (num_iterations or mini_batches above 1), else those the update trained "
         "(with skip_zero_advantage: groups with a reward signal, or one group when none has)"),
    ])
    + _m("asynchronous rollouts", "async_rollouts=true", [
        ("async/staleness_<k>", "groups", "groups taken this step at staleness k (the step minus the oldest policy "
         "version among a group's tokens), one key per k from 0 to `max_staleness`"),
        ("async/staleness_over", "groups", "groups taken this step over `max_staleness` (dropped)"),
        ("async/staleness_mean", "steps", "mean staleness of the step's trained groups"),
        ("async/staleness_max", "steps", "largest staleness of a trained group"),
        ("async/dropped_groups", "groups", "groups over the bound dropped this step"),
        ("async/dropped_share", "share", "dropped groups / (dropped + trained) this step"),
        ("async/dropped_total", "groups", "groups dropped since the run started"),
        ("async/stale_token_share", "share", "trained tokens drawn by weights older than the step's"),
        ("async/wait_seconds", "s", "time the trainer waited for the queue of scored groups (the longest wait "
         "of any process)"),
        ("async/queued_groups", "groups", "scored groups left in the queue after the step took its own (summed "
         "over processes)"),
        ("async/oldest_draw", "draw", "the oldest draw (prompt-stream position, in steps) of a trained group"),
        ("async/publish_bytes", "bytes", "bytes this step's weights copied to the engine process (the trainable "
         "ones: with LoRA, the adapters)"),
        ("async/full_publish_bytes", "bytes", "bytes a copy of every weight to the engine process moves (its first)"),
    ])
    + _m("cluster", "launcher=ray", [
        ("cluster/weight_sync_bytes", "bytes", "bytes of this step's weights put in Ray's object store for the rollout "
         "workers, per trainer rank (the trainable ones: with LoRA, the adapters)"),
        ("cluster/weight_sync_seconds", "s", "seconds from gathering this step's weights to every rollout worker of "
         "the rank holding them"),
        ("cluster/rollout_restarts", "count", "rollout workers Ray restarted after a death since the run (or its "
         "trainer ranks) started; their groups were drawn again from the same keys"),
    ])
    + _m("cluster", "launcher=ray, ray_reward_workers > 0", [
        ("cluster/reward_restarts", "count", "reward workers Ray restarted after a death since the run (or its "
         "trainer ranks) started; their completions were scored again"),
    ])
    + _m("asynchronous rollouts", "async_rollouts=true, steps with stale tokens, rollout_correction none", [
        ("async/mismatch_kl_k1", "nats", "k1 estimate of KL(pi_version || pi_train) on the stale tokens"),
        ("async/mismatch_kl_k3", "nats", "k3 estimate of the same"),
        ("async/rollout_is_weight_mean", "ratio", "mean importance weight pi_train / pi_version of the stale tokens"),
        ("async/rollout_is_weight_min", "ratio", "smallest weight"),
        ("async/rollout_is_weight_max", "ratio", "largest weight"),
        ("async/rollout_is_masked_share", "share", "stale units whose weight fell outside the band and was zeroed "
         "(async_correction=mask)"),
        ("async/rollout_is_clipped_share", "share", "stale units whose weight was clamped into the band "
         "(async_correction=truncate)"),
        ("async/rollout_is_sequences", "sequences", "sequences the stale-token metrics cover (as rollout_is_sequences)"),
    ])
    + _m("reward-model training", "reward_model_train_steps > 0", [
        ("rm_verifier_reward", "reward", "the verifier's mean on the policy's samples (what the learned reward achieves)"),
    ])
    + _m("reward-model training", "reward_model_train_steps > 0, at each iteration boundary (ref_reset_steps)", [
        ("rm_iteration", "count", "iterations the reward model has finished"),
        ("rm_loss", "loss", "the reward model's training loss, mean over the update's optimizer steps"),
        ("rm_buffer_size", "examples", "examples in the replay buffer"),
        ("rm_buffer_age_mean", "iterations", "mean age of the buffer's examples"),
        ("rm_replay_share", "share", "examples of the update drawn from earlier iterations (the replay buffer)"),
        ("rm_heldout_accuracy_before", "share", "held-out accuracy of the reward model before the update"),
        ("rm_heldout_accuracy_after", "share", "the same after it"),
        ("rm_heldout_ranking_before", "share", "held-out within-group (better, worse) pairs ordered as the verifier "
         "orders them, before the update"),
        ("rm_heldout_ranking_after", "share", "the same after it"),
        ("rm_agreement_new", "share", "agreement with the verifier on the iteration's new samples"),
    ])
    + _m("process-reward-model training", "reward_model_train_steps > 0 with step_reward=prm:, at each iteration "
         "boundary", [
        ("prm_iteration", "count", "iterations the process reward model has finished"),
        ("prm_labelled_solutions", "solutions", "the ended iteration's completions labelled and trained on (held-out "
         "ones aside)"),
        ("prm_label_mean", "share", "mean soft label of the steps just labelled (their continuations' success share)"),
        ("prm_loss", "loss", "the PRM's step cross-entropy, mean over the update's optimizer steps"),
        ("prm_buffer_size", "solutions", "labelled solutions in the replay buffer"),
        ("prm_replay_share", "share", "solutions of the update drawn from earlier iterations (the replay buffer)"),
        ("prm_heldout_step_accuracy_before", "share", "held-out step accuracy of the PRM before the update"),
        ("prm_heldout_step_accuracy_after", "share", "the same after it"),
    ])
    + _m("reward-model training", "reward_model_warmup_draws > 0, first step", [
        ("rm_warmup_completions", "count", "completions the reward model trained on before the policy's first step"),
    ])
    + _m("tools", "tools or environment_factory set", [(k, u, m) for k, u, m in _TOOLS])
    + _m("evaluation", "steps with an evaluation (eval_steps)", [
        ("eval/accuracy", "share", "greedy accuracy on the held-out prompts"),
        ("eval/pass@k", "share", "pass@k on the first eval_pass_prompts (k = eval_pass_k)"),
        ("eval/mean_length", "tokens", "mean greedy completion length"),
        ("eval/truncated_share", "share", "greedy completions cut at eval_max_new_tokens"),
        ("eval/interrupted", "0/1", "1 when a stop signal cut the evaluation short"),
        ("eval/prompts_scored", "count", "prompts scored before the interruption"),
    ])
    + _m("evaluation", "steps with an evaluation, tools or environment_factory set",
         [(f"eval/{k}", u, f"{m}, in the evaluation's greedy episodes") for k, u, m in _TOOLS])
    + _m("mixtures", "a mixture of tasks, or environment_factory in TRL's dict form (one key per source)", [
        ("share/<source>", "share", "the source's share of the step's prompts"),
        ("reward/<source>", "reward", "mean total reward of the source's completions (steps where it has some)"),
        ("accuracy/<source>", "share", "the source's completions its own verifier judges correct"),
    ])
    + _m("evaluation", "steps with an evaluation of several suites (a mixture's sources, eval_tasks; one key per suite)", [
        ("eval/<suite>/accuracy", "share", "greedy accuracy on the suite's held-out prompts"),
        ("eval/<suite>/pass@k", "share", "pass@k on the suite's first eval_pass_prompts"),
        ("eval/<suite>/mean_length", "tokens", "mean greedy completion length on the suite"),
        ("eval/<suite>/truncated_share", "share", "the suite's greedy completions cut at eval_max_new_tokens"),
        ("eval/<suite>/prompts_scored", "count", "the suite's prompts scored before an interruption"),
    ])
    + _m("evaluation", "steps with an evaluation of several suites, the suite sampled with tools or an environment",
         [(f"eval/<suite>/{k}", u, f"{m}, in the suite's greedy episodes") for k, u, m in _TOOLS])
)


def _pattern(key: str) -> re.Pattern:
    out = re.escape(key)
    for name, rx in PLACEHOLDERS.items():
        out = out.replace(re.escape(name), rx)
    return re.compile(out + r"\Z")


_EXACT = {m.key: m for m in METRICS if "<" not in m.key}
_FAMILIES = [(m, _pattern(m.key)) for m in METRICS if "<" in m.key]


def lookup(key: str) -> Metric | None:
    """The catalog's entry for a logged key (an exact key first, then the families), or None."""
    if key in _EXACT:
        return _EXACT[key]
    return next((m for m, rx in _FAMILIES if rx.match(key)), None)


def markdown() -> str:
    """The metrics reference's body: one table per topic, in the catalog's order."""
    out: list[str] = []
    topic = None
    for m in METRICS:
        if m.topic != topic:
            topic = m.topic
            out += ["", f"## {topic.capitalize()}", "", "| key | unit | meaning | logged |", "| --- | --- | --- | --- |"]
        out.append(f"| `{m.key}` | {m.unit} | {m.meaning} | {m.when} |")
    return "\n".join(out).lstrip("\n") + "\n"
