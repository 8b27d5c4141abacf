"""A run's Config as the settings of each component that reads it: the one place, with the config
package, the trainer, the CLI (and its commands) and the Python API, where Config fields are read.
Each component declares what it reads (a frozen dataclass beside it) and is built from that alone, so
a test builds one without a Config. ``run_settings`` builds them all at once, for the trainer; values
the knobs move (epsilon, beta, temperature, ...) are the components' per step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace

from grpo import core
from grpo.agent import AgentSettings
from grpo.config import Config
from grpo.config.mixture_settings import eval_task_specs, mixture_of, source_specs
from grpo.config.judge import judge_settings
from grpo.config.validate import trains_prm
from grpo.data.tasks import Task, TaskLoading, load_task
from grpo.eval.evaluate import EvalSettings
from grpo.rewards.reward import RewardOptions
from grpo.rollout import SamplingSettings, engine_class
from grpo.rollout.producer import EngineProcessSettings
from grpo.train.async_rollouts import AsyncSettings
from grpo.train.batch import BatchSettings, RewardShaping, correction_mode
from grpo.train.collect import CollectSettings
from grpo.train.critic import CriticSettings
from grpo.train.knobs import KnobSettings
from grpo.train.logic_consistency import LogicConsistencySettings
from grpo.train.optim import Schedule
from grpo.train.placement import PlacementSettings
from grpo.train.process_reward import ProcessRewardTrainSettings
from grpo.train.reward_model import RewardModelTrainSettings
from grpo.train.sources import SamplerSettings, SourcesSettings
from grpo.train.update import UpdateSettings


def _band(value) -> tuple[float, float] | None:
    return None if value is None else (float(value[0]), float(value[1]))


def task_loading(cfg: Config) -> TaskLoading:
    return TaskLoading(max_operand=cfg.arithmetic_max_operand, ops=cfg.arithmetic_ops, prompt_field=cfg.prompt_field,
                       answer_field=cfg.answer_field, split=cfg.task_split)


def task_of(cfg: Config) -> Task:
    """The task a config names (task, eval_prompts, the arithmetic knobs, a dataset's fields and split)."""
    return load_task(cfg.task, eval_size=cfg.eval_prompts, loading=task_loading(cfg))


@dataclass(frozen=True)
class RunRecord:
    """What serving a run's model reads of the run's config."""

    model: str  # model: the base its checkpoints were trained from
    system_prompt: str
    max_prompt_length: int
    rewards: str  # rewards, as configured ('' : the task's own)
    reward_options: RewardOptions  # the run's reward_* and judge_* fields


def run_record(cfg: Config) -> RunRecord:
    return RunRecord(model=cfg.model, system_prompt=cfg.system_prompt, max_prompt_length=cfg.max_prompt_length,
                     rewards=cfg.rewards, reward_options=reward_options(cfg))


def held_out_prompts(cfg: Config, count: int) -> tuple:
    """The first ``count`` held-out prompts of the run's task; none for a mixture."""
    if mixture_of(cfg) is not None:
        return ()
    return tuple(row["prompt"] for row in task_of(cfg).eval[:count])


def reward_options(cfg: Config) -> RewardOptions:
    """What resolving a reward takes from the run's config (its fields of the same names; the judge's,
    its judge_* fields)."""
    return RewardOptions(timeout=cfg.reward_timeout, retries=cfg.reward_retries, concurrency=cfg.reward_concurrency,
                         workers=cfg.reward_workers, reward_model=cfg.reward_model, reward_model_transform=cfg.reward_model_transform,
                         judge=judge_settings(cfg))


def engine_options(cfg: Config, name: str):
    """The options of the rollout engine ``name``: each field ``x`` of its ``Options`` from the Config
    field ``<name>_x`` (whose default is the field's own)."""
    options = engine_class(name).Options
    return options(**{f.name: getattr(cfg, f"{name}_{f.name}") for f in dataclasses.fields(options)})


def sampling_settings(cfg: Config, *, max_new_tokens: int | None = None) -> SamplingSettings:
    """The run's sampling: its warpers and prompt cut at the configured temperature (the knob's, per
    step, replaces it in training); ``max_new_tokens``: max_completion_length unless given."""
    return SamplingSettings(max_new_tokens=cfg.max_completion_length if max_new_tokens is None else max_new_tokens,
                            temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, min_p=cfg.min_p,
                            repetition_penalty=cfg.repetition_penalty, max_prompt_length=cfg.max_prompt_length)


def q_processing(cfg: Config) -> dict | None:
    """The sampling settings beside the temperature with which the trainer computes log q for the importance
    corrections (grpo.core.sampling), where the run corrects and its q is not pi_T; else None."""
    kw = {"top_k": cfg.top_k, "top_p": cfg.top_p, "min_p": cfg.min_p, "repetition_penalty": cfg.repetition_penalty}
    corrects = rollout_correction(cfg) != "none" or cfg.async_rollouts
    return kw if corrects and core.truncates(**kw) else None


def rollout_correction(cfg: Config) -> str:
    """The train/inference mismatch correction the run applies (auto resolved for its engine)."""
    return correction_mode(cfg.rollout_correction, cfg.rollout_engine)


def loss_settings(cfg: Config) -> core.LossSettings:
    """The policy loss's settings at the knobs' starting values (the Updater sets each step's)."""
    return core.LossSettings(
        eps_low=cfg.epsilon, eps_high=cfg.eps_high, dual_clip=cfg.dual_clip, ratio_level=cfg.importance_sampling_level,
        kl_coef=cfg.beta, kl_estimator=cfg.kl_estimator, aggregation=cfg.aggregation,
        norm_length=cfg.max_completion_length, entropy_coef=cfg.entropy_coef, cov_mode=cfg.cov_mode,
        cov_fraction=cfg.cov_fraction, kl_cov_coef=cfg.kl_cov_coef, clip_delta=cfg.clip_delta,
        cispo_ratio_max=cfg.cispo_ratio_max, sapo_tau_pos=cfg.sapo_temperature_pos,
        sapo_tau_neg=cfg.sapo_temperature_neg, top_entropy_quantile=cfg.top_entropy_quantile,
        off_policy_mask_threshold=cfg.off_policy_mask_threshold, distill_grpo_weight=cfg.distill_grpo_weight,
        vespo_k_pos=cfg.vespo_k_pos, vespo_lambda_pos=cfg.vespo_lambda_pos, vespo_k_neg=cfg.vespo_k_neg,
        vespo_lambda_neg=cfg.vespo_lambda_neg)


def update_settings(cfg: Config) -> UpdateSettings:
    return UpdateSettings(
        policy_loss=cfg.policy_loss, loss=loss_settings(cfg), group_size=cfg.num_generations,
        num_iterations=cfg.num_iterations, mini_batches=cfg.mini_batches, micro_batch=cfg.per_device_train_batch_size,
        skip_zero_advantage=cfg.skip_zero_advantage, entropy_target=cfg.entropy_target_band is not None,
        learning_rate=cfg.learning_rate, adam_betas=(cfg.adam_beta1, cfg.adam_beta2), weight_decay=cfg.weight_decay,
        schedule=Schedule(lr_scheduler_type=cfg.lr_scheduler_type, warmup_steps=cfg.warmup_steps,
                          max_steps=cfg.max_steps),
        max_grad_norm=cfg.max_grad_norm, max_consecutive_skips=cfg.max_consecutive_skips,
        torch_compile=cfg.torch_compile)


def batch_settings(cfg: Config) -> BatchSettings:
    return BatchSettings(
        group_size=cfg.num_generations, old_logp=cfg.num_iterations > 1 or cfg.mini_batches > 1,
        reference=cfg.beta > 0 or bool(cfg.teacher), micro_batch=cfg.per_device_train_batch_size,
        shaping=RewardShaping(overlong_buffer=cfg.overlong_buffer, overlong_penalty_coef=cfg.overlong_penalty_coef,
                              max_completion_length=cfg.max_completion_length, overlong_filter=cfg.overlong_filter,
                              policy_filter=cfg.policy_filter, policy_filter_min_std=cfg.policy_filter_min_std),
        process_supervision=cfg.supervision == "process", advantage_estimator=cfg.advantage_estimator,
        std_eps=cfg.std_eps, unbiased_std=cfg.scale_rewards_unbiased,
        multi_objective_aggregation=cfg.multi_objective_aggregation,
        reward_weights=None if cfg.reward_weights is None else tuple(cfg.reward_weights),
        gamma=cfg.gamma, lam=cfg.lam, correct_threshold=cfg.correct_threshold,
        token_weight_gamma=cfg.token_weight_gamma, correction=rollout_correction(cfg),
        correction_level=cfg.rollout_correction_level, correction_low=cfg.rollout_correction_low,
        correction_high=cfg.rollout_correction_high, torch_compile=cfg.torch_compile)


def consistency_settings(cfg: Config) -> LogicConsistencySettings | None:
    """The logic-consistency regulariser's settings, or None when logic_consistency is off."""
    if not cfg.logic_consistency:
        return None
    return LogicConsistencySettings(coef=cfg.logic_consistency_coef, model=cfg.logic_consistency_model,
                               group_size=cfg.num_generations)


def collect_settings(cfg: Config) -> CollectSettings:
    return CollectSettings(
        seed=cfg.seed, prompts_per_step=cfg.prompts_per_step, group_size=cfg.num_generations,
        system_prompt=cfg.system_prompt, sampling=sampling_settings(cfg),
        with_logprobs=rollout_correction(cfg) != "none" or cfg.async_rollouts, dynamic_sampling=cfg.dynamic_sampling,
        dynamic_sampling_rounds=cfg.dynamic_sampling_rounds, mini_batches=cfg.mini_batches,
        resample_invalid_rounds=cfg.resample_invalid_rounds, max_reward_failure_share=cfg.max_reward_failure_share,
        max_steps=cfg.max_steps)


def async_turns(cfg: Config, *, cpu_alone: bool) -> bool:
    """async_rollouts: whether the trainer and the engine process take turns on the cores (async_turns,
    where both compute on this machine's CPU on one process: ``cpu_alone``)."""
    return cfg.async_rollouts and cfg.async_turns and cpu_alone


def engine_threads(cfg: Config, cores: int, *, turns: bool) -> int:
    """async_rollouts: torch threads of the engine process: async_engine_threads, else every one of the
    ``cores`` when it takes turns with the trainer, half of them when both compute at once. Measured on
    2 cores (the embedded model, a reward that waits 5 s): the engine on both cores beside a trainer on
    both ran the trainer's forwards up to 8x slower; the engine on one and the trainer on both gave 1.2x
    the steps per hour of each on one core."""
    return cfg.async_engine_threads or (cores if turns else max(1, cores // 2))


def engine_process_settings(cfg: Config, cores: int, *, turns: bool) -> EngineProcessSettings | None:
    """async_rollouts: the training engine's process (rollout/producer.py) on engine_threads of the
    machine's ``cores``; None: it samples here."""
    if not cfg.async_rollouts:
        return None
    return EngineProcessSettings(engine=cfg.rollout_engine, kernels=cfg.decode_kernels,
                                 options=engine_options(cfg, cfg.rollout_engine),
                                 threads=engine_threads(cfg, cores, turns=turns),
                                 segment_tokens=cfg.partial_rollout_tokens if cfg.partial_rollouts else 0)


def async_settings(cfg: Config, *, turns: bool = False) -> AsyncSettings | None:
    """async_rollouts: the producer, the queue and the staleness bound; None: the synchronous loop."""
    if not cfg.async_rollouts:
        return None
    return AsyncSettings(max_staleness=cfg.max_staleness, prompts_per_step=cfg.prompts_per_step,
                         group_size=cfg.num_generations, correction=cfg.async_correction,
                         correction_level=cfg.rollout_correction_level, correction_low=cfg.rollout_correction_low,
                         correction_high=cfg.rollout_correction_high,
                         run_corrects_all=rollout_correction(cfg) != "none", dynamic_sampling=cfg.dynamic_sampling,
                         dynamic_sampling_rounds=cfg.dynamic_sampling_rounds, mini_batches=cfg.mini_batches,
                         turns=turns)


def knob_settings(cfg: Config) -> KnobSettings:
    return KnobSettings(
        epsilon=cfg.epsilon, eps_high=cfg.eps_high, beta=cfg.beta, entropy_coef=cfg.entropy_coef,
        temperature=cfg.temperature, clip_target_band=_band(cfg.clip_target_band),
        clip_step_band=_band(cfg.clip_step_band), clip_step_size=cfg.clip_step_size,
        clip_step_patience=cfg.clip_step_patience, clip_epsilon_min=cfg.clip_epsilon_min,
        clip_epsilon_max=cfg.clip_epsilon_max, controller_factor=cfg.controller_factor,
        entropy_target_band=_band(cfg.entropy_target_band), entropy_target_knob=cfg.entropy_target_knob,
        kl_target=cfg.kl_target, kl_adapt_rate=cfg.kl_adapt_rate, consistency_steps=cfg.consistency_steps,
        consistency_converging=cfg.consistency_converging, consistency_guessing=cfg.consistency_guessing,
        consistency_plateau=cfg.consistency_plateau, fuse_metric=cfg.fuse_metric, fuse_min=cfg.fuse_min,
        fuse_max=cfg.fuse_max, fuse_patience=cfg.fuse_patience)


def eval_settings(cfg: Config) -> EvalSettings:
    """Evaluation as configured (for the trainer and ``grpo eval``): greedy on eval_max_new_tokens,
    pass@k with the run's warpers at the configured temperature."""
    return EvalSettings(system_prompt=cfg.system_prompt,
                        sampling=sampling_settings(cfg, max_new_tokens=cfg.eval_max_new_tokens),
                        batch_size=cfg.eval_batch_size, pass_k=cfg.eval_pass_k, pass_prompts=cfg.eval_pass_prompts,
                        verifier_name=next(iter(cfg.reward_names), "verifier"),  # a mixture: each suite's own
                        max_failure_share=cfg.max_reward_failure_share)


def agent_settings(cfg: Config) -> AgentSettings:
    return AgentSettings(tools=cfg.tools, environment_factory=cfg.environment_factory, tool_format=cfg.tool_format,
                         max_turns=cfg.max_turns, tool_timeout=cfg.tool_timeout, example_call=cfg.tool_example_call,
                         example_question=cfg.tool_example_question, environment_column=cfg.environment_column,
                         program=cfg.agent, program_timeout=cfg.agent_timeout)


def sources_settings(cfg: Config) -> SourcesSettings:
    """The run's task or mixture (each source's settings resolved: config/mixture_settings.py), its
    evaluation suites, prompt stream, reward runners and agent."""
    return SourcesSettings(
        task=cfg.task, eval_prompts=cfg.eval_prompts, rewards=tuple(cfg.reward_names),
        reward_weights=None if cfg.reward_weights is None else tuple(cfg.reward_weights),
        mixture=source_specs(cfg), eval_tasks=eval_task_specs(cfg),
        sampler=SamplerSettings(seed=cfg.seed, difficulty=cfg.difficulty_sampling, memory=cfg.difficulty_memory,
                                floor=cfg.difficulty_floor),
        reward_options=reward_options(cfg),
        loading=task_loading(cfg),
        agent=agent_settings(cfg))


def reward_model_settings(cfg: Config) -> RewardModelTrainSettings:
    return RewardModelTrainSettings(
        model=cfg.reward_model, teacher=cfg.reward_model_teacher, verifier=cfg.reward_model_verifier,
        objective=cfg.reward_model_objective, train_steps=cfg.reward_model_train_steps,
        batch_size=cfg.reward_model_batch_size, replay=cfg.reward_model_replay,
        buffer_size=cfg.reward_model_buffer_size, learning_rate=cfg.reward_model_lr, heldout=cfg.reward_model_heldout,
        distill_temperature=cfg.reward_model_distill_temperature, warmup_draws=cfg.reward_model_warmup_draws,
        group_size=cfg.num_generations, seed=cfg.seed, reward_options=reward_options(cfg))


def process_reward_settings(cfg: Config) -> ProcessRewardTrainSettings | None:
    """The PRM trained during the run (reward_model_train_steps with step_reward=prm:<folder>), else None."""
    if not trains_prm(cfg):
        return None
    return ProcessRewardTrainSettings(
        train_steps=cfg.reward_model_train_steps, batch_size=cfg.reward_model_batch_size, replay=cfg.reward_model_replay,
        buffer_size=cfg.reward_model_buffer_size, learning_rate=cfg.reward_model_lr, heldout=cfg.reward_model_heldout,
        verifier=cfg.reward_model_verifier, solutions=cfg.prm_label_solutions,
        continuations=cfg.prm_label_continuations, label=cfg.prm_label,
        rows_per_call=cfg.prompts_per_step * cfg.num_generations, seed=cfg.seed,
        reward_options=reward_options(cfg))


def placement_settings(cfg: Config) -> PlacementSettings:
    return PlacementSettings(load_in_4bit=cfg.load_in_4bit, bf16=cfg.bf16, dtype=cfg.dtype,
                             shared_prefix=cfg.shared_prefix, gradient_checkpointing=cfg.gradient_checkpointing,
                             strategy=cfg.distributed_strategy, group_size=cfg.num_generations,
                             max_tokens_per_forward=cfg.max_tokens_per_forward, processing=q_processing(cfg))


def critic_settings(cfg: Config) -> CriticSettings | None:
    """PPO's learned value model (advantage_estimator=gae), else None."""
    if not core.ESTIMATORS[cfg.advantage_estimator].critic:
        return None
    return CriticSettings(estimator=cfg.advantage_estimator, learning_rate=cfg.critic_learning_rate, clip_range=cfg.cliprange_value,
                          max_grad_norm=cfg.max_grad_norm, divergence_factor=cfg.critic_divergence_factor,
                          vf_coef=cfg.vf_coef, shared_trunk=cfg.critic_shared_trunk, strategy=cfg.distributed_strategy,
                          dtype=cfg.dtype)


@dataclass(frozen=True)
class EngineSettings:
    """The run's rollout engine: its ROLLOUT_ENGINES name (rollout_engine), kernels (decode_kernels),
    options (its ``<name>_*`` fields) and, with async_rollouts, its own process."""

    name: str
    kernels: str
    options: object
    process: EngineProcessSettings | None


@dataclass(frozen=True)
class RunSettings:
    """Every component's settings of one run, built once from its Config (``run_settings``)."""

    model: str  # model: as configured (a checkpoint records it; a resume onto another is refused)
    use_peft: bool  # use_peft: the policy's trained weights are LoRA adapters
    sources: SourcesSettings
    placement: PlacementSettings
    knobs: KnobSettings
    engine: EngineSettings
    agent: AgentSettings
    collect: CollectSettings
    asynchronous: AsyncSettings | None  # async_rollouts
    reward_model: RewardModelTrainSettings | None  # reward_model_train_steps > 0 with a reward_model
    process_reward: ProcessRewardTrainSettings | None  # reward_model_train_steps > 0 with step_reward=prm:
    batch: BatchSettings
    logic_consistency: LogicConsistencySettings | None
    update: UpdateSettings
    eval: EvalSettings
    critic: CriticSettings | None

    def with_max_steps(self, max_steps: int) -> RunSettings:
        """The same run counted to ``max_steps`` (num_train_epochs resolved, or max_steps raised to
        train further): the schedule and the rewards' trainer_state follow it."""
        schedule = replace(self.update.schedule, max_steps=max_steps)
        return replace(self, collect=replace(self.collect, max_steps=max_steps),
                       update=replace(self.update, schedule=schedule))


def run_settings(cfg: Config, *, cores: int, cpu_alone: bool = True) -> RunSettings:
    """Every component's settings for a run of ``cfg`` on ``cores`` CPU threads; ``cpu_alone``: on
    this machine's CPU, one process (no GPU, no torchrun)."""
    turns = async_turns(cfg, cpu_alone=cpu_alone)
    return RunSettings(
        model=cfg.model, use_peft=cfg.use_peft, sources=sources_settings(cfg), placement=placement_settings(cfg), knobs=knob_settings(cfg),
        engine=EngineSettings(name=cfg.rollout_engine, kernels=cfg.decode_kernels,
                              options=engine_options(cfg, cfg.rollout_engine),
                              process=engine_process_settings(cfg, cores, turns=turns)),
        agent=agent_settings(cfg), collect=collect_settings(cfg), asynchronous=async_settings(cfg, turns=turns),
        reward_model=reward_model_settings(cfg) if cfg.reward_model_train_steps and cfg.reward_model else None,
        process_reward=process_reward_settings(cfg),
        batch=batch_settings(cfg), logic_consistency=consistency_settings(cfg), update=update_settings(cfg),
        eval=eval_settings(cfg), critic=critic_settings(cfg))


@dataclass(frozen=True)
class ClusterSettings:
    """launcher=ray: what the driver places, on what, and how often it brings the run back (Config ray_*)."""

    address: str  # ray_address
    trainers: int
    rollout_workers: int
    reward_workers: int
    trainer_cpus: float
    rollout_cpus: float
    reward_cpus: float
    trainer_gpus: float
    rollout_gpus: float
    max_restarts: int
    start_timeout: float
    call_timeout: float  # ray_call_timeout
    trainer_threads: int  # num_threads, else the whole CPUs a rank reserves
    run_dir: str  # output_dir made absolute (runs/<date-time> where empty): every rank's, on every attempt
    working_dir: str  # working_dir, else the driver's folder
    env_names: tuple[str, ...]  # the environment variables the config names (its *_env fields)

    @property
    def cpus(self) -> float:
        """The CPUs every part of the run reserves together."""
        return (self.trainers * self.trainer_cpus + self.rollout_workers * self.rollout_cpus
                + self.reward_workers * self.reward_cpus)


def cluster_settings(cfg: Config, *, cwd: str, stamp: str) -> ClusterSettings:
    """The driver's settings; ``cwd``: the folder it runs in, ``stamp``: the date-time naming a run folder."""
    import os

    run_dir = os.path.abspath(os.path.join(cwd, cfg.output_dir or f"runs/{stamp}"))
    return ClusterSettings(
        address=cfg.ray_address, trainers=cfg.ray_trainers, rollout_workers=cfg.ray_rollout_workers,
        reward_workers=cfg.ray_reward_workers, trainer_cpus=cfg.ray_trainer_cpus, rollout_cpus=cfg.ray_rollout_cpus,
        reward_cpus=cfg.ray_reward_cpus, trainer_gpus=cfg.ray_trainer_gpus, rollout_gpus=cfg.ray_rollout_gpus,
        max_restarts=cfg.ray_max_restarts, start_timeout=cfg.ray_start_timeout, call_timeout=cfg.ray_call_timeout,
        trainer_threads=cfg.num_threads or max(1, int(cfg.ray_trainer_cpus)), run_dir=run_dir,
        working_dir=cfg.working_dir or cwd,
        env_names=tuple(sorted({str(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.name.endswith("_env")})))
