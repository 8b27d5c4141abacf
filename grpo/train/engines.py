"""The run's rollout engines, with one owner: the training sampler (``rollout_engine``) and the one
evaluation and the consistency probe sample with. Each is built on first use and again after
``close`` (a second ``train()``, or sampling and evaluation after one); each hears of new weights
(``sync``) and is closed once at the end. With asynchronous rollouts the training sampler runs in
an engine process of its own (rollout/producer.py), which gets each new set of weights numbered."""

from __future__ import annotations

import threading

from grpo.errors import ConfigError, EngineError
from grpo.rollout import RolloutEngine, make_engine
from grpo.rollout.producer import EngineProcess, EngineProcessSettings, ProcessEngine
from grpo.rollout.whole import ReplicaEngine


class Engines:
    """``name``, ``kernels`` and ``options`` build the training engine (``make_engine``) on
    ``policy``; ``synced``: generation is a collective of every process (FSDP2; ``fast`` there samples
    a whole copy of the weights on each process instead: rollout/whole.ReplicaEngine). Evaluation samples
    with the training engine where it ``serves_evaluation`` (one costly engine per run, as vLLM),
    else with an hf engine beside it, whose unkeyed sampling draws from the global RNG as generate does.
    ``process``: the training engine runs in an engine process so built (asynchronous rollouts; None:
    in this process). ``remote``: a callable that builds it on a cluster's rollout workers instead
    (launcher=ray; called as ``make_engine`` is, less the name's registry)."""

    def __init__(self, policy, tokenizer, *, name: str, kernels: str, options, synced: bool,
                 process: EngineProcessSettings | None = None, remote=None):
        self.policy, self.tokenizer, self.name, self.kernels = policy, tokenizer, name, kernels
        self.remote = remote  # launcher=ray: builds the engine on the cluster's rollout workers (cluster/launch.py)
        self.options, self.synced, self.process = options, synced, process
        self.version = 0  # the optimizer steps behind the weights the engines sample (``sync``)
        self._owner = threading.get_ident()  # the thread that starts an engine process (it dies with it)
        self._train: RolloutEngine | None = None
        self._eval: RolloutEngine | None = None

    @property
    def train(self) -> RolloutEngine:
        """The training sampler, built where there is none or it was closed."""
        if self._train is None or self._train.closed:
            if self.remote is not None:  # launcher=ray: the cluster's rollout workers (asynchronous: numbered)
                if threading.get_ident() != self._owner:  # the producer, after the trainer closed it
                    raise EngineError("the rollout engine on the cluster's workers was closed")
                self._train = self.remote(self.policy, self.tokenizer, inner=self.name, kernels=self.kernels,
                                          options=self.options, version=self.version, numbered=self.process is not None)
                return self._train
            if self.process is not None:
                if threading.get_ident() != self._owner:  # the producer, after the trainer closed it
                    raise EngineError("the rollout engine process was closed")
                proc = EngineProcess(self.policy, self.tokenizer, self.process, version=self.version)
                self._train = ProcessEngine(self.policy, self.tokenizer, process=proc)
                return self._train
            try:
                if self.synced and self.name == "fast":  # FSDP2: the fast loop samples a whole copy
                    self._train = ReplicaEngine(self.policy, self.tokenizer, inner=self.name, kernels=self.kernels,
                                                options=self.options)
                    return self._train
                self._train = make_engine(self.name, self.policy, self.tokenizer, synced=self.synced,
                                          kernels=self.kernels, options=self.options)
            except ValueError as e:  # rollout_engine=fast on a model or setup it does not cover
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

    def sync(self, *, version: int) -> dict:
        """Every open engine samples the policy's current weights next, those after ``version``
        optimizer steps (after an update, after a resume); the engine process gets them numbered, and
        the metrics say the bytes that publish copied against a publish of every weight."""
        self.version, metrics = version, {}
        for engine in self.opened():
            if not engine.closed:  # an engine that numbers its weights tags every token it draws with them
                engine.publish(self.policy, version=version)
                metrics.update(engine.sync_metrics())
        return metrics

    def close(self) -> None:
        for engine in self.opened():
            engine.close()
