"""Scoring a batch of completions with a weighted list of rewards; failures are counted, not fatal.

A reward may be of either form (``grpo.rewards.forms``: per completion, or TRL's per batch). A value
of None means "not applicable to this row" (TRL's convention): that reward is left out of the row's
weighted sum, and a row for which every reward returned None cannot be scored (a counted failure).

Dimension letters: N completions, K reward functions.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

from grpo.rewards.forms import BatchInputs, RewardShapeError, call_batch, check_value, completion_values
from grpo.rewards.remote import _run_loop
from grpo.rewards.reward import Reward

log = logging.getLogger("grpo.rewards")


@dataclass
class RewardResult:
    """Rewards of N completions.

    total: [N] weighted sum over the rewards that apply, NaN where any reward failed or none applied
    (those completions are left out of the loss).
    per_reward: name -> [N] raw values (NaN on failure and where it returned None). failures: name ->
    count of its failed calls. not_applicable: name -> count of its None values. unscorable: rows no
    reward applied to. first_errors: name -> the first exception of each reward that failed in this
    call, as "Type: message". log_metrics / log_columns: what batch rewards logged (``log_metric``,
    ``log_extra``).
    """

    total: torch.Tensor
    per_reward: dict[str, torch.Tensor]
    failures: dict[str, int]
    messages: list[str] = field(default_factory=list)
    first_errors: dict[str, str] = field(default_factory=dict)
    not_applicable: dict[str, int] = field(default_factory=dict)
    unscorable: int = 0
    log_metrics: dict[str, list[float]] = field(default_factory=dict)
    log_columns: dict[str, list] = field(default_factory=dict)

    @property
    def failed(self) -> torch.Tensor:  # [N] bool
        return torch.isnan(self.total)


def reward_outcomes(name: str, reward: Reward, inputs: BatchInputs) -> list:
    """``reward``'s outcome for each completion of ``inputs`` (in the form it declares): what it
    returned, or the exception that failed that completion. A batch result of the wrong shape raises
    RewardShapeError."""
    if reward.batch:
        return call_batch(name, reward.fn, inputs, _run_loop)
    return completion_values(name, reward.fn, inputs.texts, inputs.rows())


def _report(name: str, e: Exception, text: str, sample: dict, logged: set, messages: list) -> None:
    """Log the first failure of each kind (reward, exception type) with its completion and answer."""
    kind = (name, type(e).__name__)
    if kind in logged:
        return
    logged.add(kind)
    msg = (f"reward {name!r} failed ({type(e).__name__}: {e}) on completion {text[:200]!r} "
           f"with answer {sample.get('answer')!r}; such failures are counted in "
           f"metrics as reward_failures and the samples left out of the loss")
    log.warning(msg)
    messages.append(msg)


def score_completions(completions: list[str], samples: list[dict], fns: dict[str, Reward | Callable],
                      weights: list[float] | None = None, *, logged: set | None = None,
                      episodes: list[dict] | None = None, completion_ids: list[list[int]] | None = None,
                      trainer_state=None, outcomes: dict[str, list] | None = None) -> RewardResult:
    """Run every reward on the batch (a per-completion one on each (completion, sample), a batch one
    once). A reward that raises or returns NaN or inf gives NaN for that completion; None leaves it
    out of the row's sum. The first failure of each kind is logged with its sample (``logged``
    remembers the kinds already reported across calls). ``fns``: name -> Reward (a plain callable is
    taken as ``Reward.of`` takes it: its form told by its signature). ``episodes``, ``completion_ids``
    and ``trainer_state``: what TRL-form rewards also receive (``forms.BatchInputs``). A value of the
    wrong type or shape raises RewardShapeError (the reward's bug). ``outcomes``: name -> each completion's
    outcome (what ``reward_outcomes`` gives) of rewards already run elsewhere (worker processes, a cluster's
    reward workers), checked and counted here as the others are."""
    if len(completions) != len(samples):
        raise ValueError(f"score_completions: {len(completions)} completions but {len(samples)} samples")
    inputs = BatchInputs(list(completions), samples, episodes=episodes, completion_ids=completion_ids,
                         trainer_state=trainer_state)
    fns = {name: Reward.of(name, fn) for name, fn in fns.items()}
    weights = weights or [1.0] * len(fns)
    logged = set() if logged is None else logged
    n = len(completions)
    per_reward, failures, not_applicable, messages, first_errors = {}, {}, {}, [], {}
    applies = torch.zeros(len(fns), n, dtype=torch.bool)  # [K, N]
    broken = torch.zeros(n, dtype=torch.bool)  # [N]
    for k, name in enumerate(fns):
        vals = torch.full((n,), float("nan"), dtype=torch.float64)  # [N]
        failures[name] = not_applicable[name] = 0
        batch = fns[name].batch
        done = (outcomes or {}).get(name)
        for i, out in enumerate(reward_outcomes(name, fns[name], inputs) if done is None else done):
            try:
                if isinstance(out, BaseException):
                    raise out
                value = check_value(name, out, batch=batch)
            except RewardShapeError:
                raise
            except Exception as e:  # a reward is user code: any failure is one sample's, not the run's
                failures[name] += 1
                broken[i] = True
                first_errors.setdefault(name, " ".join(f"{type(e).__name__}: {e}".split())[:300])  # one line
                _report(name, e, inputs.texts[i], samples[i], logged, messages)
                continue
            if value is None:
                not_applicable[name] += 1
            else:
                vals[i], applies[k, i] = value, True
        per_reward[name] = vals
    stacked = torch.stack([per_reward[k].nan_to_num(0.0) * w for k, w in zip(fns, weights)])  # [K, N]
    total = stacked.sum(0)  # [N]: the rewards that apply
    none_applies = ~applies.any(0) & ~broken  # [N]
    total[broken | none_applies] = float("nan")
    if none_applies.any() and ("*", "none applies") not in logged:
        logged.add(("*", "none applies"))
        i = int(none_applies.nonzero()[0])
        msg = (f"no reward applied to completion {inputs.texts[i][:200]!r} with answer {samples[i].get('answer')!r} "
               f"(every reward returned None); such completions are counted in metrics as reward_failures "
               f"and left out of the loss")
        log.warning(msg)
        messages.append(msg)
    return RewardResult(total=total, per_reward=per_reward, failures=failures, messages=messages,
                        not_applicable=not_applicable, first_errors=first_errors, unscorable=int(none_applies.sum()),
                        log_metrics=inputs.log.metrics, log_columns=inputs.log.columns)

