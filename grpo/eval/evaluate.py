"""Held-out evaluation: greedy accuracy and unbiased pass@k, used by `grpo eval` and inside `train`.

A signal (SIGTERM, Ctrl-C) stops an evaluation at once: inside ``Interrupt.abortable`` (one process)
it raises in the generate call, even in a long prefill; else ``Interrupt.requested`` ends the
running batch's rows at their next token (engines that ``supports_stop``; others finish the batch).
That batch is dropped, and the result holds the prompts scored before it, marked
``"interrupted": true``.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable, ContextManager

import torch

from grpo.agent import AgentSampler, episode_metrics
from grpo.data import fit_prompt
from grpo.errors import RewardError
from grpo.infra.stop import StopRequested
from grpo.rewards import score_completions
from grpo.rewards.verdict import first_applicable
from grpo.rollout import Rollout, RolloutEngine, SamplingSettings


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n - c, k) / C(n, k) for c correct of n samples."""
    if k > n:
        raise ValueError(f"pass@k needs k <= n samples, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True)
class Interrupt:
    """How a stop request reaches an evaluation. ``requested()``: this process's flag, cheap, asked
    after every token (it ends the running batch, whose rows are then dropped). ``agreed()``: asked
    between batches, the same answer on every process (under FSDP2 each batch's forwards are
    collectives, so all processes stop at the same batch); default: ``requested``. ``abortable()``:
    a region in which the stop signal raises StopRequested (grpo.infra.stop), so a generate call
    that asks nothing for long (the prefill of a large batch) ends too; only for one process."""

    requested: Callable[[], bool]
    agreed: Callable[[], bool] | None = None
    abortable: Callable[[], ContextManager] | None = None  # StopFlag.abortable: a signal raises inside

    def region(self, engine: RolloutEngine) -> ContextManager:
        """Around one generate call: ``abortable`` where given and the engine samples in this process's
        torch (an engine with kernels of its own, as vLLM, is not interrupted mid-call)."""
        return self.abortable() if self.abortable is not None and not engine.own_kernels else nullcontext()

    def stop_between_batches(self) -> bool:
        return (self.agreed or self.requested)()


@dataclass
class _Greedy:
    """The greedy pass's running tally."""

    correct: list[bool] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    examples: list[dict] = field(default_factory=list)
    infos: list[dict] = field(default_factory=list)
    prompts_cut: int = 0
    failed: int = 0  # completions the verifier could not score (counted as wrong)
    first_error: str = ""


class _Batches:
    """Evaluation's generate calls on slices of the samples, plain or multi-turn, under an interrupt."""

    def __init__(self, engine: RolloutEngine, samples: list[dict], *, sampling: SamplingSettings, system_prompt: str,
                 agent: AgentSampler | None, interrupt: Interrupt | None):
        self.engine, self.samples, self.sampling, self.agent = engine, samples, sampling, agent
        self.system_prompt, self.interrupt = system_prompt, interrupt
        self.prompts = [fit_prompt(engine.tokenizer, s["prompt"], system_prompt, sampling.max_prompt_length)
                        for s in samples] if agent is None else []
        self.interrupted = False

    def stopped(self) -> bool:
        """Whether to stop before the next batch (marks the result interrupted)."""
        self.interrupted = self.interrupted or (self.interrupt is not None and self.interrupt.stop_between_batches())
        return self.interrupted

    def _generate(self, lo: int, hi: int, group_size: int, greedy: bool) -> Rollout | None:
        """One plain generate call, ended at the next token (its ``stop`` hook) or, inside the
        interrupt's region, at once by a stop request; None then."""
        if self.interrupt is None:
            return self.engine.generate(self.prompts[lo:hi], group_size=group_size, sampling=self.sampling,
                                        greedy=greedy)
        requested = self.interrupt.requested
        try:
            with self.interrupt.region(self.engine):
                return self.engine.generate(self.prompts[lo:hi], group_size=group_size, sampling=self.sampling,
                                            greedy=greedy, stop=lambda row, ids: requested())
        except StopRequested:
            self.interrupted = True
            return None

    def generate(self, lo: int, hi: int, group_size: int, greedy: bool) -> tuple[Rollout, list[dict]] | None:
        """The rollout of samples[lo:hi] (``group_size`` rows each, episodes in ``ro.episodes``) and each
        row's sample, or None when a stop was requested during it (its rows may be cut: dropped)."""
        rows = [s for s in self.samples[lo:hi] for _ in range(group_size)]
        if self.agent is not None:
            ro = self.agent.generate(self.engine, self.samples[lo:hi], group_size=group_size, sampling=self.sampling,
                                     system_prompt=self.system_prompt, greedy=greedy)
        else:
            ro = self._generate(lo, hi, group_size, greedy)
            if ro is None:
                return None
            ro.prompts_truncated += sum(isinstance(p, list) for p in self.prompts[lo:hi])  # cut by fit_prompt
        if self.interrupt is not None and self.interrupt.requested():
            self.interrupted = True
            return None
        return ro, rows


def _verifiers(verifier, name: str) -> dict:
    """The rewards that judge a completion: a dict of them (the first that applies decides,
    grpo.rewards.verdict), or one ``verifier`` under ``name``."""
    return dict(verifier) if isinstance(verifier, dict) else {name: verifier}


def _greedy(batches: _Batches, verifier, *, batch_size: int, verifier_name: str, max_failure_share: float) -> _Greedy:
    """Greedy completions of every sample, batch by batch, until an interrupt; each verified. Raises
    RewardError once the verifier could not score ``max_failure_share`` of the completions so far."""
    tally, samples = _Greedy(), batches.samples
    for i in range(0, len(samples), batch_size):
        if batches.stopped():
            break
        got = batches.generate(i, i + batch_size, 1, True)
        if got is None:  # dropped; the next stopped() (asked on every process alike) ends the pass
            continue
        ro, rows = got
        fns = _verifiers(verifier, verifier_name)
        res = score_completions(ro.texts, rows, fns, episodes=ro.episodes, completion_ids=ro.completion_id_lists())
        values = first_applicable(res.per_reward, list(fns)).tolist()
        tally.failed += sum(res.failures.values())
        tally.first_error = tally.first_error or next(iter(res.first_errors.values()), "")
        tally.correct += [bool(v >= 1.0) for v in values]
        if tally.failed and tally.failed >= max_failure_share * len(tally.correct):
            raise RewardError(f"evaluation: the verifier (reward {verifier_name!r}) could not score {tally.failed} of "
                              f"the {len(tally.correct)} greedy completions so far (max_reward_failure_share="
                              f"{max_failure_share:g}): {tally.first_error}")
        tally.infos += ro.episodes or []
        tally.lengths += ro.lengths.tolist()
        tally.truncated += ro.truncated.tolist()
        tally.prompts_cut += ro.prompts_truncated
        tally.examples += [{"prompt": samples[i + j]["prompt"], "answer": samples[i + j].get("answer"), "completion": t,
                            "reward": None if math.isnan(values[j]) else values[j],
                            **({"transcript": ro.episodes[j].get("transcript")} if ro.episodes else {})}
                           for j, t in enumerate(ro.texts[:2])] if len(tally.examples) < 6 else []
    return tally


def _pass_at_k(batches: _Batches, verifier, *, pass_k: int, pass_prompts: int, batch_size: int) -> list[float]:
    """pass@k of each of the first ``pass_prompts`` samples (fewer when interrupted)."""
    per_batch, scores = max(1, batch_size // pass_k), []
    for i in range(0, pass_prompts, per_batch):
        if batches.stopped():
            break
        got = batches.generate(i, min(i + per_batch, pass_prompts), pass_k, False)
        if got is None:
            continue
        ro, rows = got
        fns = _verifiers(verifier, "verifier")
        values = first_applicable(score_completions(ro.texts, rows, fns, episodes=ro.episodes,
                                                    completion_ids=ro.completion_id_lists()).per_reward,
                                  list(fns)).tolist()
        ok = [bool(v >= 1.0) for v in values]  # NaN (a failure) counts as wrong
        scores += [pass_at_k(pass_k, sum(ok[j:j + pass_k]), pass_k) for j in range(0, len(ok), pass_k)]
    return scores


@dataclass(frozen=True)
class EvalSettings:
    """What an evaluation reads (a run's: the Config fields named in the comments)."""

    system_prompt: str  # system_prompt
    sampling: SamplingSettings  # eval_max_new_tokens and the run's warpers and max_prompt_length (greedy: argmax)
    batch_size: int  # eval_batch_size: prompts decoded together
    pass_k: int  # eval_pass_k: k of pass@k (0: no pass@k)
    pass_prompts: int  # eval_pass_prompts: the first this many samples get k samples each
    verifier_name: str  # the first of rewards, named in a failure's message (a dict verifier: its first)
    max_failure_share: float = 1.0  # max_reward_failure_share


@torch.no_grad()
def evaluate(engine: RolloutEngine, samples: list[dict], verifier, settings: EvalSettings, *,
             agent: AgentSampler | None = None, interrupt: Interrupt | None = None) -> dict:
    """Greedy accuracy on every sample; pass@k from k samples per prompt on the first
    ``settings.pass_prompts``, both sampled by ``engine`` (pass@k unkeyed, from the global RNG).

    A completion is correct when ``verifier(completion, sample) >= 1`` (the task's first reward; a
    dict of rewards: the first that applies to the row, grpo.rewards.verdict); one
    it could not score counts as wrong, is counted in "verifier_failures", and once such completions
    reach ``max_failure_share`` of the greedy ones so far, RewardError names ``verifier_name`` and its
    first exception. Returns {"accuracy", "pass@k" (or None), "k", "n_prompts", "prompts_scored",
    "verifier_failures", "mean_length", "truncated_share", "prompts_truncated" (prompts cut from the
    left to ``max_prompt_length``), "seconds", "examples" (a few prompts with their greedy completion
    and its verifier value, "reward")}, and "interrupted": true when ``interrupt`` stopped it (the
    metrics then cover the "prompts_scored" prompts scored before). With ``agent`` (tools / an
    environment) every completion is a multi-turn episode, graded on its final answer with its
    transcript beside the sample, and the result holds the episodes' tool metrics ("tools").
    """
    start, s = time.perf_counter(), settings
    pass_k, pass_prompts = s.pass_k, min(s.pass_prompts, len(samples))
    batches = _Batches(engine, samples, sampling=s.sampling, system_prompt=s.system_prompt, agent=agent,
                       interrupt=interrupt)
    name = next(iter(verifier)) if isinstance(verifier, dict) else s.verifier_name  # named in a failure's message
    g = _greedy(batches, verifier, batch_size=s.batch_size, verifier_name=name, max_failure_share=s.max_failure_share)
    result = {"accuracy": sum(g.correct) / max(len(g.correct), 1), "n_prompts": len(samples),
              "prompts_scored": len(g.correct), "verifier_failures": g.failed,
              "mean_length": sum(g.lengths) / max(len(g.lengths), 1),
              "truncated_share": sum(g.truncated) / max(len(g.truncated), 1), "pass@k": None, "k": pass_k,
              "prompts_truncated": g.prompts_cut}
    if pass_k and pass_prompts:
        scores = _pass_at_k(batches, verifier, pass_k=pass_k, pass_prompts=pass_prompts, batch_size=s.batch_size)
        result["pass@k"] = sum(scores) / len(scores) if scores else None
        result["pass_prompts"] = len(scores)
    if agent is not None:
        result["tools"] = episode_metrics(g.infos)
    if batches.interrupted:
        result["interrupted"] = True
    result["seconds"] = time.perf_counter() - start
    result["examples"] = g.examples
    return result
