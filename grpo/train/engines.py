"""The run's rollout engines, with one owner: the training sampler (``rollout_backend``) and the one
evaluation and the consistency probe sample with. Each is built on first use and again after
``close`` (a second ``train()``, or sampling and evaluation after one); each hears of new weights
(``sync``) and is closed once at the end."""

from __future__ import annotations

from grpo.errors import ConfigError
from grpo.rollout import RolloutEngine, make_engine


class Engines:
    """``name``, ``kernels`` and ``options`` build the training engine (``make_engine``) on
    ``policy``; ``synced``: generation is a collective of every process (FSDP2). Evaluation samples
    with the training engine where it ``serves_evaluation`` (one costly engine per run, as vLLM),
    else with an hf engine beside it, whose unkeyed sampling draws from the global RNG as generate does."""

    def __init__(self, policy, tokenizer, *, name: str, kernels: str, options, synced: bool):
        self.policy, self.tokenizer, self.name, self.kernels = policy, tokenizer, name, kernels
        self.options, self.synced = options, synced
        self._train: RolloutEngine | None = None
        self._eval: RolloutEngine | None = None

    @property
    def train(self) -> RolloutEngine:
        """The training sampler, built where there is none or it was closed."""
        if self._train is None or self._train.closed:
            try:
                self._train = make_engine(self.name, self.policy, self.tokenizer, synced=self.synced,
                                          kernels=self.kernels, options=self.options)
            except ValueError as e:  # rollout_backend=fast on a model or setup it does not cover
                raise ConfigError(str(e)) from None
        return self._train

    @property
    def eval(self) -> RolloutEngine:
        """The engine evaluation and the consistency probe sample with."""
        train = self.train
        if train.serves_evaluation:
            self._eval = train
        elif self._eval is None or self._eval.closed:
            self._eval = make_engine("hf", self.policy, self.tokenizer, synced=self.synced)
        return self._eval

    def open(self) -> None:
        """Build both where they are not open (errors in the engines' set-up surface here)."""
        self.eval  # noqa: B018 (builds the training engine too)

    def opened(self) -> tuple[RolloutEngine, ...]:
        """Every engine built so far, each once."""
        return tuple({id(e): e for e in (self._train, self._eval) if e is not None}.values())

    def sync(self) -> None:
        """Every open engine samples the policy's current weights next (after an update, after a resume)."""
        for engine in self.opened():
            if not engine.closed:
                engine.sync_weights(self.policy)

    def close(self) -> None:
        for engine in self.opened():
            engine.close()
