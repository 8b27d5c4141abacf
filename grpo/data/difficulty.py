"""An online difficulty sampler: a prompt's recent group pass rate decides how often it is drawn.

A group whose G completions all pass (or all fail) has zero advantage in GRPO and teaches nothing
(DAPO, arXiv 2503.14476, section 3.2, drops such groups after sampling them). This sampler draws them
less in the first place, as prime-rl's difficulty pools and online difficulty filtering (Bae et al.
2025, arXiv 2504.03380) do: prompt i's weight is

    w_i = floor + (1 - floor) * 4 p_i (1 - p_i)

where p_i is the mean pass rate of its last ``memory`` groups; a prompt not yet seen has weight 1
(the weight of p = 1/2, where the expected advantage signal p (1 - p) is largest). ``floor`` keeps
every prompt drawable, so a prompt judged too hard or too easy is seen again and its rate can move.

Each draw takes ``count`` distinct prompts by weight (Efraimidis and Spirakis 2006: the ``count``
largest keys u_i^(1 / w_i)), where u_i is a uniform number fixed by (seed, draw, i) alone, so the
draw depends only on the sampler's state (the number of draws and the pass-rate history), which
the checkpoint holds.
"""

from __future__ import annotations

import math

from grpo.data.mixture import keyed_uniform
from grpo.errors import DataError


def difficulty_weight(pass_rates: list[float], *, floor: float) -> float:
    """A prompt's draw weight from its recent group pass rates (module docstring); 1 when none."""
    if not pass_rates:
        return 1.0
    p = sum(pass_rates) / len(pass_rates)
    return floor + (1.0 - floor) * 4.0 * p * (1.0 - p)


class DifficultySampler:
    """Draws indices into a dataset of ``size`` prompts by their difficulty weights (module
    docstring); ``observe`` records each drawn prompt's group pass rate (oldest draw first)."""

    def __init__(self, size: int, *, seed: int, memory: int = 4, floor: float = 0.1):
        if size < 1:
            raise ValueError("DifficultySampler: the dataset is empty")
        if memory < 1 or not 0.0 < floor <= 1.0:
            raise ValueError(f"DifficultySampler: memory {memory} must be >= 1 and floor {floor} in (0, 1]")
        self.size, self.seed, self.memory, self.floor = size, seed, memory, floor
        self.draws = 0
        self.history: dict[int, list[float]] = {}  # prompt -> its last `memory` group pass rates
        self.pending: list[list[int]] = []  # draws whose outcomes are not observed yet

    def weight(self, i: int) -> float:
        return difficulty_weight(self.history.get(i, []), floor=self.floor)

    def draw(self, count: int) -> list[int]:
        out: list[int] = []
        while len(out) < count:  # more than the dataset: whole passes, each without repeats
            take = min(count - len(out), self.size)
            keys = sorted(((math.log(keyed_uniform(self.seed, self.draws, i)) / self.weight(i), i)
                           for i in range(self.size)), reverse=True)
            out += [i for _, i in keys[:take]]
            self.draws += 1
        self.pending.append(out)
        return out

    def observe(self, pass_rates: list[float]) -> None:
        """The group pass rates of the oldest unobserved draw's prompts, in its order."""
        if not self.pending:
            return
        drawn = self.pending.pop(0)
        if len(drawn) != len(pass_rates):
            raise ValueError(f"DifficultySampler: {len(pass_rates)} pass rates for a draw of {len(drawn)} prompts")
        self.update(drawn, pass_rates)

    def update(self, indices: list[int], pass_rates: list[float]) -> None:
        for i, p in zip(indices, pass_rates):
            if p is None or math.isnan(p):  # a group no reward could score says nothing of its difficulty
                continue
            self.history[i] = (self.history.get(i, []) + [float(p)])[-self.memory:]

    def state_dict(self) -> dict:
        # copies taken whole (dict() and list() of a dict or list are atomic in CPython): with asynchronous
        # rollouts the producer thread may draw and observe while the trainer saves a checkpoint
        history, pending = dict(self.history), list(self.pending)
        return {"draws": self.draws, "size": self.size, "seed": self.seed,
                "history": {int(k): list(v) for k, v in history.items()},
                "pending": [list(x) for x in pending]}  # draws made, their outcomes still to come (async)

    def load_state_dict(self, state: dict) -> None:
        if state.get("size") != self.size or "history" not in state:
            raise DataError(f"difficulty sampler state is for a dataset of {state.get('size')} prompts, "
                            f"this one has {self.size}")
        self.draws, self.seed = state["draws"], state["seed"]
        self.pending = [list(x) for x in state.get("pending", [])]
        self.history = {int(k): list(v) for k, v in state["history"].items()}
