"""Each source's own rewards behind the RewardRunner interface: a mixture's rows scored by the reward
runner of their source (the ``task`` column), merged into one result over the union of the reward
names. A reward that is not its row's source's has no value there (NaN, as a reward that returned
None), so the weighted sum of each row is its own source's.

Dimension letters: N completions.
"""

from __future__ import annotations

import torch

from grpo.data.mixture import SOURCE_COLUMN
from grpo.errors import DataError
from grpo.rewards.runner import RewardRunner
from grpo.rewards.scoring import RewardResult


def _take(rows: list | None, idx: list[int]) -> list | None:
    return None if rows is None else [rows[i] for i in idx]


class SourceRewards:
    """Scores rows with their source's RewardRunner (``runners``: label -> runner)."""

    def __init__(self, runners: dict[str, RewardRunner], *, column: str = SOURCE_COLUMN):
        self.runners, self.column = runners, column
        self.pool = None  # launcher=ray: the cluster's reward workers, which every runner scores on
        self.names = list(dict.fromkeys(n for r in runners.values() for n in r.names))
        self.fns: dict = {}
        for runner in runners.values():
            for name in runner.names:
                self.fns.setdefault(name, runner.fns[name])

    def reward_model(self):
        """The first source's ``reward_model`` reward's model holder (RewardRunner.reward_model), or None."""
        return next((m for m in (r.reward_model() for r in self.runners.values()) if m is not None), None)

    @property
    def timeouts(self) -> int:
        return sum(r.timeouts for r in self.runners.values())

    def _rows_of(self, samples: list[dict]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for i, s in enumerate(samples):
            label = s.get(self.column)
            if label not in self.runners:
                raise DataError(f"a row's {self.column!r} is {label!r}, not a source of this mixture "
                                f"({sorted(self.runners)})")
            out.setdefault(label, []).append(i)
        return out

    def score(self, completions: list[str], samples: list[dict], *, episodes: list[dict] | None = None,
              completion_ids: list[list[int]] | None = None, trainer_state=None) -> RewardResult:
        """Each source's rows scored by its runner, merged (module docstring)."""
        n = len(completions)
        total = torch.full((n,), float("nan"), dtype=torch.float64)  # [N]
        per_reward = {k: torch.full((n,), float("nan"), dtype=torch.float64) for k in self.names}  # name -> [N]
        out = RewardResult(total=total, per_reward=per_reward, failures=dict.fromkeys(self.names, 0),
                           not_applicable=dict.fromkeys(self.names, 0))
        for label, idx in self._rows_of(samples).items():
            res = self.runners[label].score(_take(completions, idx), _take(samples, idx),
                                            episodes=_take(episodes, idx), completion_ids=_take(completion_ids, idx),
                                            trainer_state=trainer_state)
            at = torch.tensor(idx)
            total[at] = res.total.double()
            for name, values in res.per_reward.items():
                per_reward[name][at] = values.double()
                out.failures[name] += res.failures[name]
                out.not_applicable[name] += res.not_applicable.get(name, 0)
            for name, error in res.first_errors.items():
                out.first_errors.setdefault(name, error)
            out.messages += res.messages
            out.unscorable += res.unscorable
            for name, values in res.log_metrics.items():
                out.log_metrics.setdefault(name, []).extend(values)
            for column, values in res.log_columns.items():
                merged = out.log_columns.setdefault(column, [None] * n)
                for i, v in zip(idx, values):
                    merged[i] = v
        return out

    def verdict_values(self, samples: list[dict], per_reward: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each row's value [N] of its own source's first reward."""
        out = torch.full((len(samples),), float("nan"), dtype=torch.float64)  # [N]
        for label, idx in self._rows_of(samples).items():
            at = torch.tensor(idx)
            out[at] = per_reward[self.runners[label].names[0]][at].double()
        return out

    def state_dict(self) -> dict:
        return {"sources": {label: r.state_dict() for label, r in self.runners.items()}}

    def load_state_dict(self, state: dict) -> None:
        for label, part in state["sources"].items():
            self.runners[label].load_state_dict(part)

    def close(self) -> None:
        for runner in self.runners.values():
            runner.close()


def source_metrics(labels: list, rewards: torch.Tensor, correct: torch.Tensor, known: list[str]) -> dict:
    """Per-source metrics of a step's N rows (``labels`` their sources, rewards [N], correct [N] bool):
    share/<source> of the rows, and for each source present reward/<source> (mean over its scored
    rows) and accuracy/<source>."""
    out = {}
    for label in known:
        rows = torch.tensor([str(x) == label for x in labels], dtype=torch.bool)  # [N]
        out[f"share/{label}"] = float(rows.double().mean())
        if rows.any():
            scored = rewards.double()[rows]
            if not torch.isnan(scored).all():
                out[f"reward/{label}"] = float(torch.nanmean(scored))
            out[f"accuracy/{label}"] = float(correct[rows].double().mean())
    return out
