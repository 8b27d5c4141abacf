"""Seeded prompt sampling without replacement, epoch by epoch, with a resumable position."""

from __future__ import annotations

import random

from grpo.errors import DataError


class PromptSampler:
    """Yields indices into a dataset: a fresh seeded permutation each epoch, B at a time.

    ``state_dict``/``load_state_dict`` hold (epoch, position) so a resumed run draws exactly the
    prompts the uninterrupted run would have drawn, including across an epoch boundary.
    """

    def __init__(self, size: int, *, seed: int):
        if size < 1:
            raise ValueError("PromptSampler: the dataset is empty")
        self.size, self.seed = size, seed
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def draw(self, count: int) -> list[int]:
        out = []
        while len(out) < count:
            if self.position == self.size:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def observe(self, pass_rates: list[float]) -> None:
        """Outcomes do not move an epoch-shuffled stream (the difficulty sampler's are recorded)."""

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "size": self.size, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if state["size"] != self.size:
            raise DataError(f"sampler state is for a dataset of {state['size']} prompts, this one has {self.size}")
        self.seed, self.epoch, self.position = state["seed"], state["epoch"], state["position"]
        self._order = self._permutation(self.epoch)
