"""Process supervision: step rewards, their mapping onto completion tokens, and the advantages.

A step reward is ``fn(completion: str, sample: dict) -> list[(score, end_char)]``: one score per
reasoning step and the character offset in the completion where that step ends (exclusive). One with an
``outcomes(texts, samples)`` method scores a batch at once (the PRM) or in worker processes under a
deadline (StepRewardInWorkers): each completion's steps, or the exception that failed it. The
trainer (``supervision=process``) turns them into tensors with ``step_tensors`` and advantages with
``core.process_advantages`` (DeepSeekMath section 4.1.3): every token gets the sum of the
group-normalized rewards of the steps that end at or after it.

Dimension letters: N completions, T completion tokens, S steps (padded with end index -1).
"""

from __future__ import annotations

import logging
import math
import os
import re
from typing import Callable

import torch

from grpo import core
from grpo.registry import Registry
from grpo.rewards.builtin import numeric_reward, resolve_named

log = logging.getLogger("grpo.rewards")
StepRewardFn = Callable[[str, dict], "list[tuple[float, int]]"]
EQUATION = re.compile(r"(?<![\d.])(-?\d+(?:\.\d+)?(?:\s*[-+*/x×]\s*-?\d+(?:\.\d+)?)+)\s*=\s*(-?\d+(?:\.\d+)?)(?![\d.])")


def _value(expr: str) -> float:
    """Value of a flat arithmetic expression of numbers and + - * / (the regex admits nothing else)."""
    return float(eval(expr.replace("×", "*").replace("x", "*"), {"__builtins__": {}}, {}))


def arithmetic_steps(completion: str, sample: dict) -> list[tuple[float, int]]:
    """Rule-based step reward: each line holding equations 'a op b ... = c' is a step scoring 1.0 when
    every equation on it is right, else 0.0; a last step at the end of the text scores the final
    answer (the numeric reward against sample['answer'])."""
    steps, pos = [], 0
    for line in completion.splitlines(keepends=True):
        end = pos + len(line.rstrip())
        eqs = EQUATION.findall(line)
        if eqs:
            try:
                ok = all(math.isclose(_value(lhs), float(rhs), rel_tol=1e-9, abs_tol=1e-9) for lhs, rhs in eqs)
            except (ZeroDivisionError, SyntaxError, OverflowError):
                ok = False
            steps.append((float(ok), end))
        pos += len(line)
    final = len(completion.rstrip())
    outcome = numeric_reward(completion, sample) if "answer" in sample else 0.0
    if steps and steps[-1][1] == final:
        steps[-1] = (min(steps[-1][0], outcome), final)  # the last line is also the answer
    else:
        steps.append((outcome, final))
    return steps


STEP_REWARDS: Registry[StepRewardFn] = Registry("step reward", field="step_reward")
STEP_REWARDS.register("arithmetic_steps", arithmetic_steps)


def _call_in_worker(name: str, completion: str, sample: dict) -> list[tuple[float, int]]:
    return [(float(v), int(e)) for v, e in resolve_step_reward(name)(completion, sample)]


class StepRewardInWorkers:
    """A step reward found by name whose calls run in worker processes under ``reward_timeout``, as the
    rewards' do (rewards/runner.py): a call past its deadline fails that completion alone, and the stuck
    worker is replaced."""

    def __init__(self, name: str, fn: StepRewardFn, options):
        from grpo.rewards.runner import RewardRunner

        self.name, self.fn = name, fn
        self.runner = RewardRunner([], None, options, warm=((resolve_step_reward, (name,)),))

    def __call__(self, completion: str, sample: dict) -> list[tuple[float, int]]:
        return self.fn(completion, sample)

    def outcomes(self, texts: list[str], samples: list[dict]) -> list:
        return self.runner.run_in_workers(texts, samples, [self.name], call=_call_in_worker)

    def close(self) -> None:
        self.runner.close()


def resolve_step_reward(name: str, options=None) -> StepRewardFn:
    """A built-in step reward by name, a learned process reward model (``prm:<folder>``, rewards/prm.py: scored
    here in batches, as the reward model is), or ``package.module:function``; errors list the built-ins. With
    ``options`` (RewardOptions) whose timeout is > 0, a ``module:function`` runs in worker processes."""
    from grpo.rewards.prm import PREFIX, PRMScorer

    if name.startswith(PREFIX):
        return PRMScorer(name[len(PREFIX):])
    fn = resolve_named(name, STEP_REWARDS)
    if name in STEP_REWARDS or options is None or options.timeout <= 0:  # a built-in is ours: it cannot hang
        return fn
    return StepRewardInWorkers(name, fn, options)


def char_ends_to_tokens(tokenizer, ids: list[int], char_ends: list[int]) -> list[int]:
    """Completion-token index at which each character offset is reached: the first token t whose
    decoded prefix ids[:t+1] (special tokens skipped, as the rollout decodes) is at least that long.
    Offsets past the text map to the last token. Incremental decoding, so multi-byte characters
    split over several byte-level tokens end where the character is complete."""
    full = tokenizer.decode(ids, skip_special_tokens=True)
    cache: dict[int, int] = {}

    def length(t: int) -> int:
        # a prefix cut inside a multi-byte character decodes to a replacement character: count only
        # the part that agrees with the whole text (so the length never decreases with t)
        if t not in cache:
            cache[t] = len(os.path.commonprefix([tokenizer.decode(ids[:t + 1], skip_special_tokens=True), full]))
        return cache[t]

    out = []
    for e in char_ends:  # binary search: O(log T) prefix decodes per step, not T
        lo, hi = 0, len(ids) - 1
        if not ids or length(hi) < e:
            out.append(max(len(ids) - 1, 0))
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if length(mid) < e else (lo, mid)
        out.append(lo)
    return out


def step_tensors(fn: StepRewardFn, tokenizer, completion_ids: torch.Tensor, mask: torch.Tensor,
                 texts: list[str], samples: list[dict]) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Step rewards [N, S] and token end indices [N, S] (-1 = no step) of N completions (``mask`` [N, T]:
    each one's tokens, a prefix mask; an empty row has no steps); a step reward that raises or returns a
    bad value leaves that completion without steps (listed in the messages)."""
    rows, problems = [], []
    given = fn.outcomes(texts, samples) if hasattr(fn, "outcomes") else None  # batched, or in workers
    for i, (text, sample) in enumerate(zip(texts, samples)):
        try:
            got = fn(text, sample) if given is None else given[i]
            if isinstance(got, BaseException):
                raise got
            steps = [(float(s), int(e)) for s, e in got]
            if not steps or not all(math.isfinite(s) for s, _ in steps):
                raise ValueError(f"returned {steps!r:.80}")
            n_tok = int(mask[i].sum())
            ids = completion_ids[i, :n_tok].tolist()
            ends = char_ends_to_tokens(tokenizer, ids, [e for _, e in steps]) if n_tok else []
            # the step that ends the text ends the completion: its reward reaches the EOS token too,
            # so stopping is reinforced like every other token of the last step
            final = len(text.rstrip())
            ends = [n_tok - 1 if e >= final else t for (_, e), t in zip(steps, ends)]
            rows.append(list(zip([s for s, _ in steps], ends)))
        except Exception as e:  # a step reward is user code: its failure is one completion's
            rows.append([])
            problems.append(f"step reward failed on completion {i} ({type(e).__name__}: {e})")
    s = max(1, max(len(r) for r in rows))
    rewards = torch.zeros(len(rows), s, dtype=torch.float64)  # [N, S]
    ends = torch.full((len(rows), s), -1, dtype=torch.long)  # [N, S]
    for i, r in enumerate(rows):
        for j, (score, end) in enumerate(r):
            rewards[i, j], ends[i, j] = score, end
    return rewards, ends, problems


def process_supervision(fn: StepRewardFn, tokenizer, ro, samples: list[dict], mask: torch.Tensor, *,
                        group_size: int, std_eps: float, unbiased_std: bool) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Token advantages [N, T] from step rewards, the mask [N, T] without completions whose step
    reward failed, and metrics. ``mask`` [N, T] is the counted loss tokens (within ro.loss_mask);
    steps are mapped onto the context (ro.completion_mask, the tokens the text decodes from) of the
    rows that count, and the advantages are kept on ``mask``'s tokens only."""
    group_samples = [s for s in samples for _ in range(group_size)]
    context = ro.completion_mask * mask.any(1, keepdim=True).to(ro.completion_mask.dtype)  # [N, T]
    rewards, ends, problems = step_tensors(fn, tokenizer, ro.completion_ids, context, ro.texts, group_samples)
    for p in problems[:1]:
        log.warning(p)
    rewards, ends = rewards.to(mask.device), ends.to(mask.device)  # scored on the CPU
    failed = (ends < 0).all(dim=1)  # [N]
    mask = mask * (~failed).unsqueeze(1).to(mask.dtype)  # [N, T]
    adv = core.process_advantages(rewards, ends, mask, group_size=group_size, std_eps=std_eps,
                                  unbiased_std=unbiased_std)  # [N, T]
    valid = ends >= 0  # [N, S]
    metrics = {"step_reward_mean": float(rewards[valid].mean()) if valid.any() else 0.0,
               "steps_per_completion": float(valid.sum(1).double().mean()),
               "step_reward_failures": len(problems)}
    return adv.to(torch.float32), mask, metrics
