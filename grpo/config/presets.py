"""Presets: one key sets a group of fields (a published monitor recipe, a published learning-rate
schedule, a built-in task's needs and rewards)."""

from __future__ import annotations

from dataclasses import fields

from grpo.data.mixture import parse_mixture
from grpo.data.tasks import TASKS, VERIFIERS, task_rewards
from grpo.registry import Registry

VERIFIERS_MAX_CALLS = 32  # a verifiers environment's episodes: model calls allowed (its own max_turns decides first)

MONITOR_PRESETS: Registry[dict] = Registry("monitor preset", field="monitor_preset")
MONITOR_PRESETS.register("none", {}, doc="No monitor settings.")
# A published monitoring recipe for GRPO runs: the clip rate held in a band by
# small steps on epsilon, a fuse on the gradient-alignment variance, the consistency probe
_CLIP_GAV_PROBE = {
    "clip_step_band": [0.30, 0.50], "clip_step_size": 0.02, "clip_step_patience": 10,
    "fuse_metric": "gav", "fuse_max": 0.45, "fuse_patience": 5,
    "consistency_steps": 100, "consistency_prompts": 10, "consistency_group_size": 4,
    "consistency_random": True,
}
_CLIP_GAV_PROBE_DOC = ("The clip rate held in 35-45% by +-0.02 on epsilon after 10 steps below 30% or above "
                       "50%; a fuse when GAV stays above 0.45 for 5 steps; the consistency probe every 100 "
                       "steps on 10 random prompts x 4 samples.")
MONITOR_PRESETS.register("clip_gav_probe", _CLIP_GAV_PROBE, doc=_CLIP_GAV_PROBE_DOC)
MONITOR_PRESETS.register("seed003", _CLIP_GAV_PROBE, doc="clip_gav_probe under the name configs written before it use.")


# "GRPO: not an upgrade of PPO but a scalpel for LLM reasoning" (Towards AI, 2025, section 3.4): GRPO's
# token-level updates want a smaller rate than PPO's usual 3e-6; linear warm-up over 100 steps, cosine
# decay, peak 1.2e-6 was the steadiest there
LR_PRESETS: Registry[dict] = Registry("learning-rate preset", field="lr_preset")
LR_PRESETS.register("none", {}, doc="No learning-rate settings.")
LR_PRESETS.register("warmup100_cosine", {"learning_rate": 1.2e-6, "warmup_steps": 100, "lr_scheduler_type": "cosine"},
                    doc="Linear warm-up over 100 steps to a peak learning rate of 1.2e-6, then cosine decay to 0 "
                        "at max_steps.")


# Published recipes by name: the objective each paper trains with (how advantages, the loss, its clip and
# aggregation, the KL term and the filters are computed). The papers' scale (model, learning rate, batch,
# group size, lengths) belongs to their hardware and is listed in each entry's text, not set.
RECIPES: Registry[dict] = Registry("recipe", field="recipe")
RECIPES.register("none", {}, doc="No recipe: grpo's defaults.")
RECIPES.register("deepseekmath_grpo", {
    "advantage_estimator": "grpo", "policy_loss": "clip", "aggregation": "seq_mean_token_mean",
    "importance_sampling_level": "token", "epsilon": 0.2, "beta": 0.04, "kl_estimator": "k3", "num_iterations": 1,
}, doc="GRPO as DeepSeekMath trains with it (Shao et al. 2024, arXiv 2402.03300, section 4.1 and eq. 3): "
       "group-normalised outcome advantages (mean and std of the group), PPO's clip at 0.2 on token ratios, "
       "each completion's loss averaged over its tokens then over completions, the KL to the reference as its own "
       "loss term with the unbiased k3 estimator and beta 0.04, one policy update per exploration stage. The "
       "paper's scale: G = 64 samples a question, batch 1024, max length 1024, learning rate 1e-6.")
RECIPES.register("dapo", {
    "advantage_estimator": "grpo", "policy_loss": "clip", "aggregation": "token_mean", "epsilon": 0.2,
    "epsilon_high": 0.28, "beta": 0.0, "dynamic_sampling": True, "overlong_buffer": "max_completion_length / 5",
    "overlong_penalty_coef": 1.0,
}, doc="DAPO (Yu et al. 2025, arXiv 2503.14476): clip-higher (epsilon 0.2 low, 0.28 high), dynamic sampling "
       "(groups whose rewards are all equal are dropped and more are drawn), the token-level loss (every token of "
       "the batch weighs the same), soft overlong punishment over the last fifth of the length (the paper's 4096 "
       "of 20480 tokens), no KL term. The paper's scale: 512 prompts x 16 responses a step, 16 gradient updates a "
       "step, learning rate 1e-6 with 20 warm-up steps, max length 20480.")
RECIPES.register("dr_grpo", {
    "advantage_estimator": "dr_grpo", "policy_loss": "clip", "aggregation": "seq_mean_token_sum_norm", "beta": 0.0,
}, doc="Dr. GRPO (Liu et al. 2025, arXiv 2503.20783, 'GRPO done right'): the group's mean subtracted but no "
       "division by its std, each completion's token sum divided by a fixed length (max_completion_length) "
       "instead of its own length, so neither the question's difficulty nor the answer's length biases the "
       "update; no KL term.")
RECIPES.register("gspo", {
    "advantage_estimator": "grpo", "policy_loss": "clip", "importance_sampling_level": "sequence",
    "aggregation": "seq_mean_token_mean", "epsilon": 3e-4, "epsilon_high": 4e-4, "beta": 0.0, "mini_batches": 4,
}, doc="GSPO (Zheng et al. 2025, arXiv 2507.18071, section 5.1 of v2): the importance ratio of a whole "
       "sequence (the geometric mean of its token ratios) clipped to [1 - 3e-4, 1 + 4e-4], no KL term, each "
       "step's batch split into 4 mini-batches (4 updates, so the later ones are off-policy and the ratio acts).")


def apply_recipe(c) -> None:
    """Fill the fields of ``c.recipe`` still at their defaults (an explicit setting wins); a value written
    as "max_completion_length / 5" is that share of the run's completion length. An unknown recipe lists
    the valid ones."""
    values = dict(RECIPES[c.recipe])
    if isinstance(values.get("overlong_buffer"), str):
        values["overlong_buffer"] = max(1, c.max_completion_length // 5)
    _fill_defaults(c, values)


def _fill_defaults(c, values: dict) -> None:
    """Set each of ``values`` on ``c`` where its caller did not set that key (Config records them) and the
    field still holds its default (an earlier preset's value stays)."""
    defaults = {f.name: f.default for f in fields(c)}
    given = getattr(c, "_given", frozenset())
    for key, value in values.items():
        if key not in given and getattr(c, key) == defaults[key]:
            setattr(c, key, value)


def apply_task_preset(c) -> None:
    """Fill what the task needs where the config leaves it: a built-in task's presets (fields still at
    their defaults; an explicit setting wins) and, when ``rewards`` is not set, the task's rewards, so
    the saved config records the rewards the run is scored with. A mixture's ``rewards`` stay as given:
    unset, each source is scored with its own (grpo.config.mixture_settings)."""
    if c.task in TASKS:
        _fill_defaults(c, dict(TASKS[c.task].presets))
    if c.task.startswith(VERIFIERS):  # the environment's own protocol runs each episode as an agent program
        _fill_defaults(c, {"agent": c.task, "max_turns": VERIFIERS_MAX_CALLS})
    if not c.rewards.strip() and parse_mixture(c.task) is None:
        c.rewards = task_rewards(c.task)


def apply_monitor_preset(c) -> None:
    """Fill the fields of ``c.monitor_preset`` that are still at their defaults (an explicit setting
    wins); an unknown preset lists the valid ones."""
    _fill_defaults(c, MONITOR_PRESETS[c.monitor_preset])


def apply_lr_preset(c) -> None:
    """Fill the fields of ``c.lr_preset`` still at their defaults (an explicit setting wins); an unknown
    preset lists the valid ones."""
    _fill_defaults(c, LR_PRESETS[c.lr_preset])


# generation_kwargs (TRL's name): the keys grpo's engines and trainer honour, each also a field of its own
GENERATION_KEYS = ("top_p", "top_k", "min_p", "repetition_penalty")
GENERATION_REFUSED = {
    "temperature": "use the temperature field (its schedule and the loss read it)",
    "do_sample": "grpo samples (greedy only for evaluation)",
    "max_new_tokens": "use max_completion_length", "max_tokens": "use max_completion_length",
    "stop": "a completion ends at the model's end of turn (rewards see the whole completion)",
    "stop_token_ids": "a completion ends at the model's end of turn (rewards see the whole completion)",
}


def apply_generation_kwargs(c) -> None:
    """generation_kwargs' entries as the fields of their names (a field set to another value is an error);
    a key no engine can honour with right log-probs is refused, naming it and why."""
    from grpo.errors import ConfigError

    for key, value in (c.generation_kwargs or {}).items():
        if key not in GENERATION_KEYS:
            why = GENERATION_REFUSED.get(key, "the trainer cannot recompute the sampling distribution's log-probs "
                                              "under it, so the importance corrections would be biased")
            raise ConfigError(f"generation_kwargs.{key}: not honoured: {why}; grpo takes {', '.join(GENERATION_KEYS)}")
        default = type(c).__dataclass_fields__[key].default
        current = getattr(c, key)
        try:
            value = type(default)(value)
        except (TypeError, ValueError):
            raise ConfigError(f"generation_kwargs.{key}: expected a {type(default).__name__}, got {value!r}") from None
        if current != default and current != value:
            raise ConfigError(f"generation_kwargs.{key}: {value} differs from {key}={current}; set one of them")
        setattr(c, key, value)
