"""The GRPO loop, top to bottom (DeepSeekMath Algorithm 1).

    every ref_reset_steps steps: reference <- policy                          (iterative GRPO)
    each step: collect   sample B prompts, G completions each; rewards [B, G]   (train/collect.py)
               batch     advantages, old and reference log-probs               (train/batch.py)
               update    mu epochs x mini-batches x micro-batches of the clipped
                         objective + beta * KL, one optimizer step per mini-batch (train/update.py)
               after     controllers move the next step's knobs; the fuse     (train/knobs.py)
               log / save

Dimension letters: B prompts, G group size, N = B*G sequences, T completion tokens.
The trainer builds the components and runs the loop; each component gets explicit inputs and owns
its state, and a checkpoint is the union of their states (train/state.py). Every formula comes
from grpo.core.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import torch

from grpo.config import Config
from grpo.config.validate import validate_world
from grpo.data import render_prompt
from grpo.errors import DataError, EngineError, FuseError, RewardError
from grpo.eval.probe import consistency, probe_prompts
from grpo.eval.evaluate import Interrupt, evaluate
from grpo.eval.suites import evaluate_suites
from grpo.infra.checkpoint import partial_folders, save_checkpoint
from grpo.infra import distributed
from grpo.infra.logger import NullLogger, RunLogger
from grpo.infra.machine import machine_record
from grpo.infra.trackers import tracker_names
from grpo.infra.timing import STAGES, StageTimer, stage_key
from grpo.infra.runtime import import_from, keep_freed_memory, make_run_dir, seed_everything
from grpo.infra.stop import StopFlag
from grpo.models import load_models, reset_reference, resolve_model_path
from grpo.models.teacher import load_teacher
from grpo.rewards.steps import resolve_step_reward
from grpo.rollout import Rollout
from grpo.train.settings import RunSettings, run_settings
from grpo.train import state as run_state
from grpo.train.async_rollouts import AsyncRollouts
from grpo.train.batch import Batch, BatchMaker
from grpo.train.collect import Collector
from grpo.train.critic import Critic, CriticSettings
from grpo.train.engines import Engines
from grpo.train.evals import eval_notes, periodic_eval
from grpo.train.knobs import Knobs
from grpo.train.logic_consistency import make_consistency
from grpo.train.placement import place_models
from grpo.train.process_reward import ProcessRewardTrainer
from grpo.train.reward_model import make_reward_model_trainer, warm_up
from grpo.train.optim import epoch_steps
from grpo.train.update import Updater
from grpo.train.best import BestCheckpoint
from grpo.train.sources import plan_sources

AFTER_STEP = ("eval", "checkpoint")  # stages after the step proper, still in its metrics line
IN_STEP = tuple(s for s in STAGES if s not in AFTER_STEP)
DRAW_END_SECONDS = 600.0  # at the end of an asynchronous run on several processes: the longest wait for a draw


def _start_process(cfg: Config) -> distributed.World:
    """This process set up for the run (threads, seeds, the torchrun world, the allocator, the folder
    ``module:name`` references import from); what cannot run on the world's size is refused here."""
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    seed_everything(cfg.seed)
    world = distributed.init_world()  # torchrun's environment, or one process
    validate_world(cfg, world.size)  # before anything loads
    if cfg.reuse_freed_memory and world.device.type == "cpu":
        keep_freed_memory()
    import_from(cfg.working_dir, os.getcwd())
    return world


def _own_copy(cfg: Config, **changes) -> Config:
    """The trainer's copy of ``cfg`` with ``changes`` (values already validated); the caller's object
    is left as it was."""
    mine = copy.copy(cfg)
    for name, value in changes.items():
        setattr(mine, name, value)
    return mine


def _load_models(cfg: Config, path: str, world: distributed.World):
    """The policy (LoRA adapters or 4-bit base as configured), the reference where beta > 0, the
    tokenizer. A distillation teacher, where one is named, is the reference whatever beta is: loaded
    once, frozen, read by the same forward as the KL's reference (models/teacher.py)."""
    models = load_models(path, dtype=cfg.dtype, need_reference=cfg.beta > 0 and not cfg.teacher,
                         lora_r=cfg.lora_r if cfg.use_peft else 0, lora_alpha=cfg.lora_alpha,
                         lora_dropout=cfg.lora_dropout, lora_target_modules=cfg.lora_target_modules,
                         load_in_4bit=cfg.load_in_4bit, device=world.device,
                         chat_template_kwargs=cfg.chat_template_kwargs)
    if cfg.teacher:
        models.reference = load_teacher(cfg.teacher, dtype=cfg.dtype, student_tokenizer=models.tokenizer)
    return models


class Trainer:
    def __init__(self, cfg: Config, *, models=None, task=None, reward_fns: dict | None = None, cluster=None):
        # working_dir recorded in config.yaml: a resume imports from it too
        self.cfg = cfg = _own_copy(cfg, working_dir=cfg.working_dir or os.getcwd())
        self.world = world = _start_process(cfg)
        self.settings = s = run_settings(cfg, cores=torch.get_num_threads(),  # every component's, once
                                         cpu_alone=world.device.type == "cpu" and not world.distributed and cluster is None)
        # Everything that can be wrong with the input is checked before the model loads.
        # the task (or a mixture's sources), rewards (given: callables handed over by the Python API),
        # prompt stream and evaluation suites (train/sources.py)
        self.sources = plan_sources(s.sources, task=task, given=reward_fns)
        self.rewards, self.task = self.sources.rewards, self.sources.task
        self.cluster = cluster  # launcher=ray: the run's rollout and reward workers (grpo/cluster/launch.Workers)
        if cluster is not None:
            cluster.attach_rewards(self.rewards)
        step_reward = (resolve_step_reward(cfg.step_reward, s.sources.reward_options)
                       if cfg.supervision == "process" else None)
        if not self.task.train:
            raise DataError(f"task {cfg.task!r} has no training prompts")
        if cfg.num_train_epochs is not None:  # recorded in config.yaml as the run's max_steps alone: a resume's
            steps = epoch_steps(cfg.num_train_epochs, len(self.task.train), cfg.prompts_per_step)
            self.cfg = cfg = _own_copy(cfg, max_steps=steps, num_train_epochs=None)  # max_steps=N continues it
            self.settings = s = s.with_max_steps(steps)
        model_path = resolve_model_path(cfg.model) if models is None else None  # a bad path: before the run folder
        self.run_dir = distributed.broadcast_object(
            make_run_dir(cfg.output_dir, cfg.resume_from_checkpoint) if world.is_main else None, world)
        resume_from = run_state.resume_path(cfg.resume_from_checkpoint, self.run_dir)
        if resume_from is not None:
            run_state.check_resumable(resume_from, cfg.to_dict())  # before anything is written or loaded
        elif world.is_main:
            cfg.save(self.run_dir / "config.yaml")
        self.models = models or _load_models(cfg, model_path, world)
        self.policy, self.tok = self.models.policy, self.models.tokenizer
        self._build_components(s, step_reward)
        self.eval_settings = s.eval
        self.step = 0
        self.ref_reset_at = 0  # step at which the reference last became a copy of the policy
        self.stop = StopFlag()  # SIGINT / SIGTERM during train()
        self.fuse_reason: str | None = None
        self._last_eval = None  # (step, result) of the latest evaluation during training
        self.resumed_from = None  # the checkpoint this run continues, set by state.restore
        if resume_from is not None:
            self._resume(resume_from)
            if world.is_main:  # a refused resume leaves the run's config.yaml as it was
                cfg.save(self.run_dir / "config.yaml")

    def _build_components(self, s: RunSettings, step_reward) -> None:
        """The loop's components on the loaded models, each from its part of the run's settings ``s``."""
        world = self.world
        # the device, autocast, DDP/FSDP2 wrapper and forward layout the components run the models with
        self.placement = place_models(self.policy, self.models.reference, world, s.placement)
        forwards, self.sharded = self.placement.forwards, self.placement.sharded
        self.logger = NullLogger()  # train() replaces it with the run's logger on rank 0
        self.critic = self._make_critic(s.critic)
        self.knobs = Knobs(s.knobs)  # the step's knobs (eps, beta, temperature, ...) and controllers
        # the training sampler and evaluation's, opened here (their set-up errors come before the run) and again
        # after close(); every one hears of new weights and is closed at the end of train(); with async_rollouts
        # the training sampler runs in an engine process of its own
        self.engines = Engines(self.policy, self.tok, name=s.engine.name, kernels=s.engine.kernels,
                               options=s.engine.options, synced=self.sharded, process=s.engine.process,
                               remote=None if self.cluster is None else self.cluster.rollouts(world))
        self.engines.open()
        self.timer = StageTimer(next(self.policy.parameters()).device)  # seconds per stage, in every metrics line
        # tools / environment_factory (a row's own, where routed): multi-turn episodes
        self.agent, routed = self.sources.agents(s.agent, self.tok)
        self.sources.assign_agents(self.agent, routed)
        self.collector = Collector(s.collect, world=world, train=self.task.train,
                                   engines=self.engines, tokenizer=self.tok, rewards=self.rewards,
                                   note=lambda text, style=None: self.logger.note(text, style), timer=self.timer,
                                   agent=self.agent, sampler=self.sources.sampler, sources=self.sources)
        self.best = BestCheckpoint(self.cfg.best_checkpoint_metric, mode=self.cfg.best_checkpoint_mode)
        # async_rollouts: a producer and a scorer draw the collector's prompt stream into a queue of groups
        self.async_rollouts = None if s.asynchronous is None else \
            AsyncRollouts(s.asynchronous, collector=self.collector, world=world)
        # seed 001 Algorithm 1 step 4: the reward model learns at iteration boundaries (train/reward_model.py)
        self.rm_trainer = (None if s.reward_model is None else
                           make_reward_model_trainer(s.reward_model, reward=self.rewards.reward_model(), world=world))
        # the same step 4 for the process reward model of step_reward=prm: (train/process_reward.py)
        self.prm_trainer = (None if s.process_reward is None else
                            ProcessRewardTrainer(s.process_reward, step_reward, world=world))
        self.batches = BatchMaker(s.batch, world=world, forwards=forwards, policy=self.policy,
                                  reference=self.models.reference, critic=self.critic, step_reward=step_reward,
                                  tokenizer=self.tok, timer=self.timer,
                                  consistency=make_consistency(s.logic_consistency))
        self.updater = Updater(s.update, world=world, policy=self.policy,
                               module=self.placement.module, forwards=forwards, critic=self.critic,
                               checkpoint_dir=self.run_dir / "checkpoints")

    def _resume(self, path: Path) -> None:
        """Every component's state from the checkpoint at ``path``; the engines then sample its weights."""
        try:
            run_state.restore(self, path)
        except BaseException:  # a trainer that cannot start releases what it opened
            self.close()
            raise
        self._sync(self.step)

    def _make_critic(self, settings: CriticSettings | None) -> Critic | None:
        """PPO's learned value model (advantage_estimator=gae), else None."""
        if settings is None:
            return None
        return Critic(settings, self.models.path, autocast=self.placement.amp,
                      shared_policy=self.policy if settings.shared_trunk else None,
                      device=next(self.policy.parameters()).device, world=self.world)

    def components(self) -> dict:
        """The parts whose state the next step depends on, by name (a checkpoint holds each one's)."""
        parts = {"collector": self.collector, "updater": self.updater, "knobs": self.knobs}
        if self.async_rollouts is not None:  # after the collector: it sets the prompt stream back
            parts["async_rollouts"] = self.async_rollouts
        if self.best.metric:
            parts["best_checkpoint"] = self.best
        if self.critic is not None:
            parts["critic"] = self.critic
        if self.rm_trainer is not None:
            parts["reward_model_trainer"] = self.rm_trainer
        if self.prm_trainer is not None:
            parts["process_reward_trainer"] = self.prm_trainer
        return parts

    # ---- one step (Algorithm 1) ------------------------------------------------------------------
    def train_step(self) -> dict:
        cfg, k, s_collect = self.cfg, self.knobs, self.settings.collect
        t0, cut_before, rm_metrics = time.perf_counter(), self.collector.prompts_truncated, {}
        if cfg.ref_reset_steps and self.step and self.step % cfg.ref_reset_steps == 0:
            reset_reference(self.models.reference, self.policy)
            self.ref_reset_at = self.step
            if self.rm_trainer is not None:  # the reward model learns from the iteration that ended
                rm_metrics = self.rm_trainer.update()
            if self.prm_trainer is not None:  # the PRM: that iteration's completions, labelled by this policy
                rm_metrics.update(self.prm_trainer.update(
                    self.engines.train, dataclasses.replace(s_collect.sampling, temperature=k.temperature),
                    lambda row: render_prompt(self.tok, row["prompt"], s_collect.system_prompt)))
        if self.rm_trainer is not None and cfg.reward_model_warmup_draws and self.step == self.rm_trainer.iteration == 0:
            rm_metrics = warm_up(self.rm_trainer, self.collector, temperature=k.temperature)  # trained before use
        source = self.collector if self.async_rollouts is None else self.async_rollouts  # B queued groups
        got = source.collect(step=self.step, temperature=k.temperature)
        metrics = {**got.metrics, **k.values()}  # the knob values this step trains with
        if self.rm_trainer is not None:
            metrics.update(self.rm_trainer.observe(got.samples, got.rollout.texts))
        if self.prm_trainer is not None:
            self.prm_trainer.observe(got.samples, got.rollout.texts, group_size=s_collect.group_size)
        metrics.update(rm_metrics)
        batch, batch_metrics = self.prepare(got.rollout, got.rewards, got.samples, per_reward=got.per_reward)
        metrics.update(batch_metrics)
        if self.async_rollouts is not None:  # tokens of older weights: pi_train / pi_version
            batch, async_metrics = self.async_rollouts.correct(batch, step=self.step)
            metrics.update(async_metrics)
        metrics.update(self.update(batch))
        self.step += 1
        ro = got.rollout
        metrics.update(generation_seconds=ro.seconds, rollout_engine=ro.engine,
                       tokens_per_second=float(ro.lengths.sum()) * self.world.size / max(ro.seconds, 1e-9),
                       step_seconds=time.perf_counter() - t0,
                       prompts_truncated=self.collector.prompts_truncated - cut_before)
        metrics.update(self.timer.take(IN_STEP))  # what follows the step adds its own (after_step)
        if cfg.consistency_steps and self.step % cfg.consistency_steps == 0:
            metrics.update(self._consistency())
        after = k.after_step(metrics)  # controllers move the next step's knobs
        metrics.update(after.metrics)
        self.fuse_reason = after.fuse_reason
        if distributed.all_max(int(bool(self.fuse_reason)), self.world) and not self.fuse_reason:
            self.fuse_reason = "the fuse blew on another process"  # every process stops at the same step
        if cfg.log_completions_steps and (self.step % cfg.log_completions_steps == 0 or self.step in (1, cfg.max_steps)):
            self._log_samples(got)  # the first and last steps too, so a short run shows its completions
        return metrics

    def prepare(self, ro: Rollout, rewards: torch.Tensor, samples: list[dict] | None = None, *,
                per_reward: torch.Tensor | None = None) -> tuple[Batch, dict]:
        """This step's batch (BatchMaker.make) with this step's knobs; ``per_reward`` [B, G, K] (GDPO)."""
        return self.batches.make(ro, rewards, samples, temperature=self.knobs.temperature, beta=self.knobs.beta,
                                 per_reward=per_reward)

    def update(self, batch: Batch) -> dict:
        """The step's optimizer steps (Updater.update); the engines then sample the new weights."""
        with self.timer.stage("update"):
            metrics = self.updater.update(batch, self.knobs, step=self.step)
        with self.timer.stage("sync"):
            return {**metrics, **self._sync(self.step + 1)}

    def _sync(self, version: int) -> dict:
        """The engines sample the policy's current weights next, those after ``version`` optimizer steps;
        with async_rollouts the producer may start the draws they admit. The engines' sync metrics."""
        out = self.engines.sync(version=version)
        if self.async_rollouts is not None:
            self.async_rollouts.new_weights(version=version, temperature=self.knobs.temperature)
        return out

    def _log_samples(self, got) -> None:
        self.logger.log_samples(self.step, got.logged_rows(self.cfg.num_generations))

    def _consistency(self) -> dict:
        cfg = self.cfg
        pool = self.task.eval or self.task.train
        sampling = replace(self.collector.settings.sampling, temperature=self.knobs.temperature)  # the step's
        chosen = probe_prompts(pool, cfg.consistency_prompts, randomly=cfg.consistency_random, seed=cfg.seed,
                               step=self.step)
        return consistency(self.engines.eval, chosen, self.rewards, system_prompt=cfg.system_prompt,
                           group_size=cfg.consistency_group_size or cfg.num_generations, sampling=sampling)

    # ---- the run --------------------------------------------------------------------------------
    def evaluate(self) -> dict:
        # every process evaluates the same prompts (FSDP2 needs them all in each sharded forward)
        # a signal ends the running batch at its next token (this process's flag) and the evaluation
        # at the next batch (every process's, as the loop's)
        # and inside one generate call (a prefill) by raising, where no other process waits on this one
        interrupt = Interrupt(requested=lambda: self.stop.signal is not None, agreed=self._should_stop,
                              abortable=None if self.world.distributed else self.stop.abortable)
        if self.sources.suites:  # several suites (a mixture's sources, eval_tasks), each under its name
            result = evaluate_suites(self.engines.eval, self.sources.suites, self.eval_settings, interrupt=interrupt)
        else:
            # a reward model that is still learning is no judge of correctness: its verifier is
            verifier = next(iter(self.rm_trainer.verifier.values())) if self.rm_trainer is not None \
                else self.rewards.fns[self.rewards.names[0]]
            result = evaluate(self.engines.eval, self.task.eval, verifier, self.eval_settings, agent=self.agent,
                              interrupt=interrupt)
        for text in eval_notes(result, step=self.step):
            self.logger.note(text, "yellow")
        return result

    # ---- checkpoints (train/state.py) -------------------------------------------------------------
    def state(self) -> dict:
        return run_state.trainer_state(self)

    def save(self) -> Path:
        """Every process gathers its part (a collective under FSDP2); rank 0 writes one checkpoint
        that resumes on any number of processes."""
        state = self.state()
        weights = self._full_weights()
        if self.world.is_main:
            save_checkpoint(self.run_dir, self.step, self.policy, self.tok, state,
                                    keep=self.cfg.save_total_limit, weights=weights)
        distributed.barrier(self.world)
        return self.run_dir / "checkpoints" / f"step-{self.step}"

    def _full_weights(self) -> dict | None:
        """The gathered full weights of a policy sharded by FSDP2 (a collective), else None."""
        if not self.sharded:
            return None
        # tied weights (lm_head = embeddings) once, as save_pretrained writes them
        names = {n for n, _ in self.policy.named_parameters()} | {n for n, _ in self.policy.named_buffers()}
        return {k: v for k, v in distributed.full_model_state(self.policy).items() if k in names}

    def train(self) -> dict:
        cfg = self.cfg
        main = self.world.is_main
        self._follow_max_steps()
        self.engines.open()  # closed at the end of an earlier train()
        self.stop = StopFlag()  # an earlier train() may have stopped on one
        self._last_eval = None  # (step, result) of the latest evaluation during training
        self.timer.take()  # stage seconds of collector or evaluation calls made before train()
        self.logger = RunLogger(self.run_dir, total_steps=cfg.max_steps, start_step=self.step,
                                report_to=tuple(tracker_names(cfg.report_to)), params=cfg.to_dict(),
                                progress=cfg.progress) if main else NullLogger()
        for p in partial_folders(self.run_dir):
            self.logger.note(f"ignoring {p}: a checkpoint write that did not finish", "yellow")
        eval_path = self.run_dir / "eval.json"
        result: dict = {"n_prompts": len(self.task.eval)}
        if self.step and eval_path.is_file():
            result.update({k: v for k, v in json.loads(eval_path.read_text()).items() if k == "before"})
        handlers = {s: signal.signal(s, self.stop.handler) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            if self.task.eval and "before" not in result:
                self.logger.note(f"evaluating the untrained policy on {len(self.task.eval)} held-out prompts ...")
                result["before"] = {**self.evaluate(), "measured_on": machine_record()}
                if main:
                    eval_path.write_text(json.dumps(result, indent=2))
                if not result["before"].get("interrupted"):  # else eval_notes said what it scored
                    self.logger.note(f"before: accuracy {result['before']['accuracy']:.3f}")
            self._loop(result)
        except RewardError as e:  # rewards that cannot score: the last finished step is kept
            raise RewardError(f"{e}; {self._keep_last_step()}") from e
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
            self.logger.close()
            self.close()
        if main:
            eval_path.write_text(json.dumps(result, indent=2))
        return result

    def _follow_max_steps(self) -> None:
        """A max_steps raised after the trainer was built (to train further): the schedule and the
        rewards' trainer_state count to it, as a resume with that max_steps would."""
        n = self.cfg.max_steps
        if n != self.collector.settings.max_steps:
            self.collector.settings = replace(self.collector.settings, max_steps=n)
            self.updater.reschedule(replace(self.updater.settings.schedule, max_steps=n))

    def _loop(self, result: dict) -> None:
        """The steps until max_steps or a stop signal, the final checkpoint, and the evaluation of the
        final weights (into ``result``)."""
        cfg = self.cfg
        while self.step < cfg.max_steps and not self._should_stop():
            try:
                metrics = self.train_step()
            except EngineError as e:  # the engine's process died: the last finished step is saved
                raise EngineError(f"{e}; stopped at step {self.step}, checkpoint {self.save()}") from e
            if self.fuse_reason:
                self.logger.log_step(self.step, {**metrics, **self.timer.take(AFTER_STEP)})
                raise FuseError(f"{self.fuse_reason} (step {self.step}); stopped, checkpoint "
                                 f"{self.save()}")
            metrics.update(self.after_step(metrics))
            if self.step % cfg.logging_steps == 0 or self.step == cfg.max_steps or "eval/accuracy" in metrics:
                self.logger.log_step(self.step, metrics)
        result["checkpoint"] = str(self.save())
        if self.stop.signal is not None:
            result["interrupted"] = self.stop.signal
            self.logger.note(f"{self.stop.signal}: saved {result['checkpoint']}; continue with "
                             f"grpo train --resume {self.run_dir}")
        elif self.task.eval:  # an evaluation at the last step (eval_steps) already measured these weights
            last = self._last_eval
            after = last[1] if last is not None and last[0] == self.step else self.evaluate()
            result["after"] = {**after, "measured_on": machine_record()}  # the model card states where and when
            if self.stop.signal is not None:  # during that evaluation: its partial result is marked
                result["interrupted"] = self.stop.signal

    def _keep_last_step(self) -> str:
        """After an error inside a step: the last finished step's checkpoint, written unless there is
        one already (a periodic save, the checkpoint resumed from) or no step finished."""
        if self.step == 0:
            return "stopped before the first step finished (no checkpoint written)"
        done = self.run_dir / "checkpoints" / f"step-{self.step}"
        return f"stopped after step {self.step}, checkpoint {done if done.is_dir() else self.save()}"

    def after_step(self, metrics: dict) -> dict:
        """What follows a step within its metrics line: the periodic evaluation (eval_steps) and the
        periodic checkpoint (save_steps), each timed; step_seconds then counts them too (as verl's step timer)."""
        cfg, out = self.cfg, {}
        if cfg.eval_steps and self.step % cfg.eval_steps == 0 and self.task.eval:
            with self.timer.stage("eval"):
                self._last_eval = (self.step, self.evaluate())
                out.update(periodic_eval(self._last_eval[1], step=self.step, logger=self.logger))
            if self.best.offer(self.step, out):  # best_checkpoint_metric improved: these weights kept
                self.best.write(self.run_dir, self.policy, self.tok, weights=self._full_weights(),
                                is_main=self.world.is_main)
        if cfg.save_steps and self.step % cfg.save_steps == 0 and self.step < cfg.max_steps:
            with self.timer.stage("checkpoint"):
                self.save()
        out.update(self.timer.take(AFTER_STEP))
        out["step_seconds"] = metrics["step_seconds"] + sum(out[stage_key(s)] for s in AFTER_STEP)
        return out

    def close(self) -> None:
        """Release the rollout engines and the reward workers (train() does this at its end; a
        later train() or evaluate() opens them again). The producer and the scorer stop
        first: one waiting on the engine process is freed as the engines close. On several processes
        a draw under way is finished first (its counts are collectives every process must meet)."""
        if self.async_rollouts is not None:
            self.async_rollouts.stop()
            if self.world.distributed and self.async_rollouts.error is None:
                self.async_rollouts.join(timeout=DRAW_END_SECONDS)
        self.engines.close()
        if self.async_rollouts is not None:
            self.async_rollouts.join()
        self.rewards.close()
        self.sources.close()
        step_reward = self.batches.step_reward if hasattr(self, "batches") else None
        if hasattr(step_reward, "close"):  # a step reward's worker processes
            step_reward.close()
        if self.agent is not None:
            self.agent.close()

    def _should_stop(self) -> bool:
        """A signal stops every process at the same step (one that stopped alone would leave the
        others waiting in a collective)."""
        flag = distributed.all_max(int(self.stop.signal is not None), self.world)
        if flag and self.stop.signal is None:
            self.stop.signal = "SIGTERM"
        return bool(flag)
