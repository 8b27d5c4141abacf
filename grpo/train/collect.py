"""Collection, the first half of a step: this step's prompts sampled (G completions each) and scored,
and with DAPO's dynamic sampling kept to the groups that carry a signal.

Dimension letters: B prompts, G group size, N = B*G sequences (n on this process), T completion tokens.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import torch
from grpo import core
from grpo.data import PromptSampler, fit_prompt, render_prompt
from grpo.data.prompt_fit import chat_messages, check_prompt_room, prompt_lengths
from grpo.errors import RewardError
from grpo.agent import AgentSampler, episode_counts, episode_metrics
from grpo.infra import distributed
from grpo.infra.timing import NullTimer, StageTimer
from grpo.rewards.forms import StepPosition
from grpo.rewards.runner import RewardRunner
from grpo.rollout import Rollout, SamplingSettings
from grpo.rollout.types import concat_rollouts, rollout_to, select_rollout
from grpo.rollout.keys import row_keys
from grpo.rollout.tuning import take_messages
from grpo.train.async_queue import kept_share
from grpo.train.resample import RESAMPLE_ROW_BASE, resample_invalid, validity_checks
from grpo.train.source_rewards import source_metrics


def failure_message(parts: list[dict], *, n: int, n_failed: int, share: float) -> str:
    """One line: how many of the step's ``n`` completions could not be scored, each failing reward with
    its failure count and first exception, and the rows no reward applied to. ``parts``: every
    process's {"failures", "first_errors", "unscorable"}, rank 0 first."""
    failures: dict[str, int] = {}
    for part in parts:
        for name, count in part["failures"].items():
            failures[name] = failures.get(name, 0) + count
    reasons = []
    for name, count in failures.items():
        if count:
            error = next((p["first_errors"][name] for p in parts if name in p["first_errors"]), "no message")
            reasons.append(f"reward {name!r} failed on {count} ({error})")
    unscorable = sum(p["unscorable"] for p in parts)
    if unscorable:
        reasons.append(f"no reward applied to {unscorable} (every reward returned None)")
    return (f"{n_failed} of the step's {n} completions could not be scored (max_reward_failure_share="
            f"{share:g}): {'; '.join(reasons)}")


PROMPT_ROOM_ROWS = 32  # rows rendered at start-up to check max_prompt_length (the system head is the run's)

@dataclass
class Collected:
    """What a step trains on."""

    samples: list[dict]  # this process's b prompts (their task rows)
    rollout: Rollout  # this process's n = b * G sequences
    rewards: torch.Tensor  # [B, G] of the whole step (NaN where a reward failed)
    metrics: dict
    per_reward: torch.Tensor | None = None  # [B, G, K] each reward function's raw scores (GDPO)
    columns: dict = dataclasses.field(default_factory=dict)  # what TRL-form rewards logged per row (log_extra)

    def logged_rows(self, group_size: int) -> list[dict]:
        """The rows samples.jsonl gets: G / 2 completions of each prompt with the prompt, its answer, the
        reward, what TRL-form rewards logged for them (log_extra) and, for an episode, its transcript."""
        texts, flat, eps = self.rollout.texts, self.rewards.flatten().tolist(), self.rollout.episodes
        rows = []
        for i in range(0, len(texts), max(1, group_size // 2)):
            sample = self.samples[i // group_size]
            row = {"prompt": sample["prompt"], "completion": texts[i], "answer": sample.get("answer"), "reward": flat[i]}
            if "task" in sample:  # a mixture's source, a routed dataset's column
                row["task"] = sample["task"]
            row.update({k: v[i] for k, v in self.columns.items() if len(v) == len(texts)})
            if eps is not None:
                row["transcript"] = eps[i].get("transcript")
            rows.append(row)
        return rows


@dataclass(frozen=True)
class CollectSettings:
    """What collection reads; each field is the Config field named in its comment."""

    seed: int  # seed: the prompt sampler's and the sampling keys'
    prompts_per_step: int  # prompts_per_step (B, over every process)
    group_size: int  # num_generations (G)
    system_prompt: str  # system_prompt
    sampling: SamplingSettings  # max_completion_length, top_p, top_k, max_prompt_length (temperature: per step)
    with_logprobs: bool  # sampling log-probs kept: for a rollout_correction, or async_rollouts' stale tokens
    dynamic_sampling: bool  # dynamic_sampling (DAPO)
    dynamic_sampling_rounds: int  # dynamic_sampling_rounds
    mini_batches: int  # mini_batches: dynamic sampling keeps whole mini-batches on every process
    resample_invalid_rounds: int  # resample_invalid_rounds
    max_reward_failure_share: float  # max_reward_failure_share
    max_steps: int  # max_steps (TRL-form rewards see it in trainer_state)


class Collector:
    """Draws the step's prompts (an epoch-shuffled sampler, or the ``sampler`` given: a mixture's or
    the difficulty sampler, train/sources.py), samples them with the run's training engine
    (``engines.train``), scores the completions and counts what went wrong (failed rewards, prompts
    cut to max_prompt_length). ``sources`` (train/sources.RunSources) gives each row's verdict and the
    per-source metrics; None: the first reward's value is the verdict. ``note`` reports a message to
    the run's log."""

    def __init__(self, settings: CollectSettings, *, world: distributed.World, train: list[dict], engines, tokenizer,
                 rewards: RewardRunner, note: Callable[..., None], timer: StageTimer | None = None,
                 agent: AgentSampler | None = None, sampler=None, sources=None):
        self.settings, self.world, self.train, self.rewards, self.note = settings, world, train, rewards, note
        self.agent = agent  # tools / environment_factory: every rollout is a multi-turn episode
        self.timer = timer or NullTimer()  # seconds of the sampling and rewards stages
        self.engines, self.tok = engines, tokenizer
        self.sampler = sampler if sampler is not None else PromptSampler(len(train), seed=settings.seed)
        self.sources = sources
        self.reward_failures = 0
        self.prompts_truncated = 0  # this run's sampled prompts cut to max_prompt_length (every process)
        self.kernels_noted = False  # the kernel and engine choices shown (once a run)
        self.last_per_reward: torch.Tensor | None = None  # [B, G, K] of the last score()
        self.last_pass_rates: list[float] = []  # [B] each group's share of correct completions (last score())
        self.last_columns: dict = {}  # this process's rows' columns that TRL-form rewards logged (last score())
        self.checks = validity_checks(rewards.fns)  # rewards that declare which completions they can grade
        self.resample = {"resample_rounds": 0, "resampled_completions": 0, "invalid_after_resampling": 0}
        self._check_prompt_room()

    def _check_prompt_room(self) -> None:
        """Refuse at start-up a max_prompt_length that cannot hold the system message (and the tools
        it renders) with a question (grpo.data.prompt_fit), judged on the first PROMPT_ROOM_ROWS rows."""
        s = self.settings
        rows = self.train[:PROMPT_ROOM_ROWS]
        if self.agent is not None:
            lengths = [self.agent.start_lengths(x, s.system_prompt) for x in rows]
        else:
            lengths = [prompt_lengths(self.tok, render_prompt(self.tok, x["prompt"], s.system_prompt),
                                      chat_messages(x["prompt"], s.system_prompt)) for x in rows]
        check_prompt_room(lengths, s.sampling.max_prompt_length)

    def collect(self, *, step: int, temperature: float) -> Collected:
        """Sample and score this step (with dynamic sampling: several rounds). A step whose rewards
        failed too often (RewardError, max_reward_failure_share) draws nothing: the sampler is put
        back where it was, so a checkpoint saved next resumes with this step's prompts."""
        position = self.sampler.state_dict()
        try:
            if self.settings.dynamic_sampling:  # DAPO: only groups with reward variance reach the loss
                return self._dynamic(step=step, temperature=temperature)
            samples, ro = self.sample(step=step, temperature=temperature)
            rewards, metrics = self.score(samples, ro, step=step)
            return Collected(samples, ro, rewards, metrics, per_reward=self.last_per_reward,
                             columns=self.last_columns)
        except RewardError:
            self.sampler.load_state_dict(position)
            raise

    def _resample_invalid(self, samples, prompts, ro, *, step, draw, sampling, world) -> Rollout:
        """Rows a reward cannot grade (its ``valid`` check fails) sampled again (resample_invalid_rounds)."""
        s, g = self.settings, self.settings.group_size
        n_global, first = s.prompts_per_step * g, world.rank * len(ro.texts)

        def key_of(rnd: int, row: int) -> int:
            rnd_row = RESAMPLE_ROW_BASE + ((draw * s.resample_invalid_rounds + rnd) * n_global + first + row)
            return row_keys(s.seed, step, rnd_row, 1)[0]

        def generate(ps, keys):
            return self.engines.train.generate(ps, group_size=1, sampling=sampling, keys=keys, with_logprobs=False)

        got = resample_invalid(ro, [x for x in samples for _ in range(g)], [p for p in prompts for _ in range(g)],
                               checks=self.checks, rounds=s.resample_invalid_rounds, generate=generate,
                               key_of=key_of, pad_id=self.tok.pad_token_id, world=world)
        self.resample["resample_rounds"] += got.rounds
        self.resample["resampled_completions"] += int(distributed.all_sum(torch.tensor(got.resampled), world))
        self.resample["invalid_after_resampling"] += int(distributed.all_sum(torch.tensor(got.invalid_left), world))
        return got.rollout

    def sample(self, *, step: int, temperature: float, draw: int = 0, sampler: PromptSampler | None = None,
               seed: int | None = None, world: distributed.World | None = None) -> tuple[list[dict], Rollout]:
        """This process's b = B / world prompts of the step's global draw, G completions each. Each
        row samples from its own key (seed, step, global row), so the tokens do not depend on how
        many processes share the batch; ``draw`` numbers the extra draws of one step (dynamic sampling).
        ``sampler`` and ``seed`` replace the run's prompt stream and key seed (a draw outside training,
        as the reward model's warm-up, that leaves the training draws as they were). ``world``: the
        processes' group to count over where it is not the run's (a thread beside the trainer's)."""
        s, world = self.settings, world or self.world
        b, g = s.prompts_per_step // world.size, s.group_size
        mine = (sampler or self.sampler).draw(s.prompts_per_step)[world.rank * b:(world.rank + 1) * b]
        samples = [self.train[i] for i in mine]
        prompts = [fit_prompt(self.tok, x["prompt"], s.system_prompt, s.sampling.max_prompt_length) for x in samples]
        keys = row_keys(s.seed if seed is None else seed, step, (draw * world.size + world.rank) * b * g, b * g)
        sampling = dataclasses.replace(s.sampling, temperature=temperature)
        # no sampling log-probs (the loss recomputes them; keeping [N, T, V] logits costs memory), except
        # for the train/inference mismatch correction, which compares the engine's with the trainer's, and
        # for asynchronous rollouts, whose tokens drawn by older weights are corrected alike
        engine = self.engines.train
        with self.timer.stage("sampling"):
            if self.agent is not None:
                ro = self.agent.generate(engine, samples, group_size=g, sampling=sampling, keys=keys,
                                         system_prompt=s.system_prompt, with_logprobs=s.with_logprobs)
            else:
                ro = engine.generate(prompts, group_size=g, sampling=sampling, keys=keys, with_logprobs=s.with_logprobs)
        measured = take_messages()  # what the rollout measured or read about this machine's kernels
        if measured and not self.kernels_noted:  # one line, the first time (later row counts: in the cache folder)
            self.note("; ".join(measured))
            self.kernels_noted = True
        middle = sum(isinstance(p, list) for p in prompts) if self.agent is None else 0  # cut by fit_prompt
        self._count_truncated(int(distributed.all_sum(torch.tensor(ro.prompts_truncated + middle), world)))
        if self.checks and s.resample_invalid_rounds:
            ro = self._resample_invalid(samples, prompts, ro, step=step, draw=draw, sampling=sampling, world=world)
        return samples, ro

    def _count_truncated(self, n: int) -> None:
        """Count prompts cut to max_prompt_length; the first time, say so (they keep their end, the
        generation prompt, and lose their start, which may hold the question)."""
        if n and not self.prompts_truncated:
            self.note(f"{n} prompt(s) longer than max_prompt_length={self.settings.sampling.max_prompt_length} "
                      "tokens were cut from the middle: what comes before the first user content (the system message, "
                      "the tools) and the end are kept (counted in metrics as prompts_truncated)", "yellow")
        self.prompts_truncated += n

    def score(self, samples: list[dict], ro: Rollout, *, step: int = 0, world: distributed.World | None = None,
              observe: bool = True) -> tuple[torch.Tensor, dict]:
        """Rewards [B, G] of the whole step, gathered from every process (NaN where a reward
        failed or none applied), and the reward metrics. Rewards see each episode's transcript and
        counts beside its sample; TRL-form ones also the token ids and the step (``trainer_state``).
        ``world``: as for ``sample``. ``observe``: the prompt sampler hears each group's pass rate now
        (``last_pass_rates`` holds them either way; asynchronous rollouts hand them over later)."""
        s, world = self.settings, world or self.world
        group_samples = [x for x in samples for _ in range(s.group_size)]
        t0 = time.perf_counter()
        with self.timer.stage("rewards"):
            res = self.rewards.score(ro.texts, group_samples, episodes=ro.episodes,
                                     completion_ids=ro.completion_id_lists(),
                                     trainer_state=StepPosition(global_step=step, max_steps=s.max_steps))
        grading = time.perf_counter() - t0  # every reward of the step (the code rewards: its sandboxed tests)
        for msgs in distributed.gather_objects(res.messages, world):
            for msg in msgs:
                self.note(msg, "yellow")
        total = distributed.gather_rows(res.total.double(), world)  # [N_global]
        per_reward = {k: distributed.gather_rows(v.double(), world) for k, v in res.per_reward.items()}
        n_failed = int(torch.isnan(total).sum())
        if n_failed and n_failed >= s.max_reward_failure_share * len(total):
            part = {"failures": res.failures, "first_errors": res.first_errors, "unscorable": res.unscorable}
            raise RewardError(failure_message(distributed.gather_objects(part, world), n=len(total), n_failed=n_failed,
                                              share=s.max_reward_failure_share))
        self.reward_failures += n_failed
        names = self.rewards.names  # the run's rewards in order (a mixture's: every source's)
        verdicts = self.sources.verdict_values(group_samples, res.per_reward) if self.sources is not None \
            else res.per_reward[names[0]]
        correct = distributed.gather_rows(verdicts.double(), world) >= 1.0  # [N_global]: the row's verifier says so
        self.last_correct = correct
        self.last_scores = total  # [N_global] float64, with each reward's below: what the metrics average
        self.last_per_scores = torch.stack([per_reward[k] for k in self.rewards.names], -1)  # [N_global, K]
        timeouts = int(distributed.all_sum(torch.tensor(self.rewards.timeouts), world))
        pool = getattr(self.rewards, "pool", None)  # launcher=ray: the cluster's reward workers
        metrics = {f"rewards/{k}": float(torch.nanmean(v)) for k, v in per_reward.items()}
        logged: dict = {}  # what TRL-form rewards logged with log_metric, on every process
        for part in distributed.gather_objects(res.log_metrics, world):
            for name, values in part.items():
                logged.setdefault(name, []).extend(values)
        metrics.update({name: sum(values) / len(values) for name, values in logged.items()})
        self.last_columns = res.log_columns
        self.last_per_reward = torch.stack([per_reward[k] for k in names], -1).float().view(
            s.prompts_per_step, s.group_size, -1)  # [B, G, K]
        if self.sources is not None and self.sources.labels:
            labels = [x for part in distributed.gather_objects([r.get(self.sources.column) for r in group_samples], world)
                      for x in part]
            metrics.update(source_metrics(labels, total, correct, self.sources.labels))
        self.last_pass_rates = correct.double().view(s.prompts_per_step, -1).mean(1).tolist()  # [B]
        if observe:  # the difficulty sampler's history
            self.sampler.observe(self.last_pass_rates)
        metrics.update(accuracy=float(correct.double().mean()), reward_failures=n_failed,
                       reward_failures_total=self.reward_failures, reward_timeouts_total=timeouts,
                       grading_seconds=max(distributed.gather_objects(grading, world)))  # the slowest process
        if pool is not None:
            metrics["cluster/reward_restarts"] = len(set().union(*distributed.gather_objects(pool.restarted, world)))
        if ro.episodes is not None:  # every process's episodes (without their transcripts)
            infos = [e for part in distributed.gather_objects([episode_counts(e) for e in ro.episodes], world) for e in part]
            metrics.update(episode_metrics(infos))
        if self.checks and s.resample_invalid_rounds:  # the resampling since the last scoring
            metrics.update(self.resample)
            self.resample = dict.fromkeys(self.resample, 0)
        return total.float().view(s.prompts_per_step, s.group_size), metrics

    def _dynamic(self, *, step: int, temperature: float) -> Collected:
        """DAPO dynamic sampling (arXiv 2503.14476, section 3.2): sample and score rounds of B prompts, keep
        only groups whose rewards are not all equal, until B groups are kept or ``dynamic_sampling_rounds``
        rounds are spent. The result's rewards are [b', G], for the b' <= B kept groups. When no round
        kept a group the last round is trained as it is (its groups have zero advantage, so only the KL
        term acts) and dynamic_sampling_empty is 1.

        On several processes the kept groups are the same as on one, in the same order (the first
        informative groups of each round, by their index in the step's draw); each process then trains
        an equal, contiguous share of them (groups move between processes as CPU tensors), so DDP and
        FSDP2 see the same number of sequences everywhere. A remainder that would not fill every process's
        mini-batches alike (fewer groups than processes x mini_batches), possible only when the rounds run
        out, is left out of the step (counted as dropped), on one process as on several."""
        s, world, g, n = self.settings, self.world, self.settings.group_size, self.settings.prompts_per_step
        b = n // world.size  # prompts per process and round
        mine, kept_rewards, kept_per, n_kept, seconds = [], [], [], 0, 0.0
        for draw in range(s.dynamic_sampling_rounds):
            samples, ro = self.sample(step=step, temperature=temperature, draw=draw)
            rewards, metrics = self.score(samples, ro, step=step)  # [B, G] of the whole step
            seconds += ro.seconds
            idx = core.informative_groups(rewards).nonzero().flatten()[: n - n_kept]  # [k] indices into the step's B
            kept_rewards.append(rewards[idx])  # [k, G]
            kept_per.append(self.last_per_reward[idx])  # [k, G, K]
            n_kept += len(idx)
            for i in idx.tolist():  # this process's kept groups: (draw, index, sample, its G rows)
                j = i - world.rank * b
                if 0 <= j < b:
                    rows = select_rollout(ro, torch.arange(j * g, (j + 1) * g))
                    if world.distributed:  # to move between processes: on the CPU, without objects of this one
                        rows = dataclasses.replace(rollout_to(rows, "cpu"), episodes=None if rows.episodes is None
                                                   else [episode_counts(e) for e in rows.episodes])
                    mine.append((draw, i, samples[j], rows))
            if n_kept >= n:
                break
        share = kept_share(mine, n_kept=n_kept, world=world, mini_batches=s.mini_batches)
        n_used, rounds = share.used, draw + 1
        metrics.update(dynamic_sampling_rounds=rounds, dynamic_sampling_dropped_share=1.0 - n_used / (rounds * n),
                       dynamic_sampling_empty=int(n_used == 0), trained_groups=n_used or n)
        if n_used == 0:
            return Collected(samples, ro, rewards, metrics, per_reward=self.last_per_reward)
        merged = concat_rollouts([x[3] for x in share.rows], self.tok.pad_token_id)
        merged = dataclasses.replace(rollout_to(merged, ro.completion_ids.device), seconds=seconds)
        return Collected([x[2] for x in share.rows], merged, torch.cat(kept_rewards)[:n_used], metrics,
                         per_reward=torch.cat(kept_per)[:n_used])

    def state_dict(self) -> dict:
        return {"sampler": self.sampler.state_dict(), "reward_failures": self.reward_failures,
                **self.rewards.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])  # ValueError when the data changed
        self.reward_failures = state["reward_failures"]
        self.rewards.load_state_dict(state)
