"""Rollout workers: each a Ray actor holding a replica of the policy and an engine of the run's kind
(fast, hf, vllm) on it, and ``ClusterEngine``, the trainer's RolloutEngine that spreads a call's groups
over its workers, whole, in contiguous blocks (each row keeps its key, so a row draws the same tokens
on any worker: engines that declare ``same_tokens_for_keys``).

Weights go through Ray's object store: the whole policy once (``setup``), then after every optimizer
step the trainable parameters (a full fine-tune's every one, a LoRA policy's adapters), put once and
read by every worker without a copy on its node. Each trainer rank drives its own workers (rank r:
workers r, r + R, ...; with fewer workers than ranks, worker r mod M), so no rank waits on another's.

A worker that dies mid-call (its process killed, its node lost) is restarted by Ray (up to
``ray_max_restarts`` times); the engine gives the new process the whole policy and the newest trainable
weights and asks it again for the same groups with the same keys, so the rollout is the one the dead
worker would have returned, and nothing is drawn twice. Each restart is one warning line and counts in
``cluster/rollout_restarts``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from grpo.cluster.faults import RESTART_WAIT, Hung, answer_after_restart, die_at, restarted
from grpo.cluster.wire import from_wire, readonly_tensor, to_wire, wire_bytes
from grpo.errors import EngineError
from grpo.rollout.engine import RolloutEngine, SamplingSettings, engine_class, make_engine
from grpo.rollout.producer import pack_rollout, unpack_rollout
from grpo.rollout.types import Rollout, concat_rollouts, rollout_to
from grpo.rollout.vllm.client import blocks, call_deadline
from grpo.rollout.whole import architecture, lora_config, replica_model, whole_weights

log = logging.getLogger("grpo.cluster")


@dataclass(frozen=True)
class ReplicaSpec:
    """What a rollout worker builds: the policy's architecture, dtype and LoRA config, its tokenizer, and
    the engine (a rollout_engine name, its kernel setting and options)."""

    model_config: object
    dtype: str
    peft_config: object
    tokenizer: object
    engine: str
    kernels: str
    options: object


NO_REPLICA, STALE = "no replica", "stale"  # a worker's answer where it cannot do what it was asked


class RolloutWorker:
    """One rollout worker (a Ray actor: launch.py applies ``ray.remote``). ``generate`` and ``load`` answer
    NO_REPLICA in a process that holds no replica (a restarted one), ``generate`` STALE where its weights
    are older than those asked for: the engine then gives it the whole policy, or the newest weights."""

    def __init__(self, index: int, threads: int, working_dir: str):
        from grpo.infra.runtime import import_from

        import_from(working_dir)
        torch.set_num_threads(max(1, threads))
        self.index, self.calls, self.version, self.epoch = index, 0, -1, -1
        self.model = self.engine = None

    def where(self) -> dict:
        """This worker's process and node, and whether Ray restarted it."""
        import ray

        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(), "restarted": restarted()}

    def setup(self, spec: ReplicaSpec, whole: dict, version: int, epoch: int) -> int:
        """A replica of the policy with every weight ``whole`` holds (those of ``version``), and the engine on it;
        nothing where this process holds one of the same ``epoch`` already (two threads of a trainer rank may
        both bring it back). An epoch is one start of the trainer ranks: after a restart they start a new one."""
        if self.engine is not None and self.epoch == epoch:
            return self.version
        if self.engine is not None:  # a replica of the ranks' previous start
            self.engine.close()
        self.model = replica_model(spec.model_config, getattr(torch, spec.dtype), spec.peft_config)
        if torch.cuda.is_available():  # Ray made the GPUs it gave this worker (ray_rollout_gpus) the visible ones
            self.model.to("cuda")
        self._copy(whole)
        self.engine = make_engine(spec.engine, self.model, spec.tokenizer, kernels=spec.kernels, options=spec.options)
        self.version, self.epoch = version, epoch
        return self.version

    def load(self, weights: dict, version: int) -> int | str:
        """The trainable weights of ``version`` into the replica, the engine told; NO_REPLICA where this
        process holds none (restarted)."""
        if self.engine is None:
            return NO_REPLICA
        if version <= self.version:  # as new already (another rank's, or the other thread's, load came first)
            return self.version
        self._copy(weights)
        self.engine.sync_weights(self.model)
        self.version = version
        return version

    def _copy(self, wire: dict) -> None:
        mine = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in from_wire(wire).items():
                mine[name].copy_(value)

    def generate(self, version: int, request: dict) -> dict | str:
        """One sampling call on weights ``version`` or newer (``RolloutEngine.generate``'s keywords), packed,
        with the version it sampled; NO_REPLICA where this process holds none, STALE where it holds older weights (a worker several
        ranks share, which another rank's weights reached first)."""
        if self.engine is None:
            return NO_REPLICA
        if self.version < version:
            return STALE
        self.calls += 1
        die_at("rollout", self.index, self.calls, restarted=restarted())
        return {"rollout": pack_rollout(self.engine.generate(**request)), "version": self.version}


def my_workers(workers: list, rank: int, world_size: int) -> list[int]:
    """The indices of the workers rank ``rank`` drives: r, r + R, ...; with fewer workers than ranks, r mod M."""
    if len(workers) < world_size:
        return [rank % len(workers)]
    return list(range(rank, len(workers), world_size))


class ClusterEngine(RolloutEngine):
    """The run's engine ``inner`` on this rank's rollout workers (module docstring). ``world``: the
    trainer's (each rank drives its own workers; the restart count is summed over ranks). ``version``: the
    optimizer steps behind the policy's weights now; ``numbered``: every rollout carries the version each
    token was drawn with (asynchronous rollouts, whose producer thread samples while the trainer updates
    and publishes: a publish waits for the sampling call a worker is in, then loads the new weights)."""

    name = "ray"

    def __init__(self, model, tokenizer, *, inner: str, kernels: str, options, workers: list, world,
                 max_restarts: int, call_timeout: float, start_timeout: float, version: int = 0,
                 numbered: bool = False, epoch: int = 0):
        super().__init__(model, tokenizer)
        cls = engine_class(inner)
        self.same_tokens_for_keys, self.returns_sampling_logprobs = cls.same_tokens_for_keys, cls.returns_sampling_logprobs
        self.own_kernels = cls.own_kernels
        self.world, self.max_restarts, self.call_timeout = world, max_restarts, call_timeout
        self.start_timeout = start_timeout  # building a replica is a start: a fresh process imports and builds
        self.indices = my_workers(workers, world.rank, world.size)
        self.workers = {i: workers[i] for i in self.indices}
        self.device = next(model.parameters()).device
        whole = whole_weights(model)  # a collective where FSDP2 shards the policy: every rank builds its engine
        dtype = str(next(iter(whole.values())).dtype).removeprefix("torch.")
        self.spec = ReplicaSpec(architecture(model), dtype, lora_config(model), tokenizer, inner, kernels, options)
        self.trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        import ray

        self._ray = ray
        self.whole_ref, self.latest_ref, self.version, self.numbered = ray.put(to_wire(whole)), None, version, numbered
        self.first_version, self.epoch = version, epoch  # the weights whole_ref holds; the ranks' start
        self.restarted: set[tuple[int, int]] = set()  # (worker, pid of its new process) this rank saw
        self._recovery = threading.Lock()  # the producer's sampling and the trainer's publish may both find a death
        self.where = dict(zip(self.indices, ray.get([w.where.remote() for w in self.workers.values()],
                                                    timeout=start_timeout)))
        self._on_each({i: ("setup", (self.spec, self.whole_ref, version, epoch)) for i in self.indices})
        self.last_sync = {"bytes": 0, "seconds": 0.0}

    # ---- calls that survive a worker's death -------------------------------------------------------
    def _on_each(self, calls: dict[int, tuple[str, tuple]], what: str = "setting up", tokens: dict | None = None) -> dict:
        """``worker.method(*args)`` on each worker ``calls`` names, at once. A worker that died is brought
        back (``_bring_back``) and asked again; one without a replica, or with older weights, is given the
        whole policy or the newest weights first. Each such recovery (a death during it too) is one try
        of ray_max_restarts + 2. Each call has a deadline (``call_deadline``: ray_call_timeout plus the share of
        the ``tokens`` it samples; setting up a replica: ray_start_timeout); a worker past it is taken as hung:
        killed, restarted and asked again."""
        from ray.exceptions import GetTimeoutError, RayActorError

        out, todo = {}, dict(calls)
        for _ in range(self.max_restarts + 2):
            refs = {i: getattr(self.workers[i], m).remote(*args) for i, (m, args) in todo.items()}
            t0 = time.monotonic()
            for i, ref in refs.items():
                setup = todo[i][0] == "setup"
                share = (tokens or {}).get(i, 0)
                limit = self.start_timeout if setup else call_deadline(self.call_timeout, tokens=share)
                left = limit - (time.monotonic() - t0)
                try:
                    try:
                        got = self._ray.get(ref, timeout=max(left, 0.0))
                    except GetTimeoutError:  # hung: Ray restarts it once killed
                        self._ray.kill(self.workers[i], no_restart=False)
                        field = f"ray_start_timeout={self.start_timeout:g}" if setup else \
                            f"ray_call_timeout={self.call_timeout:g}"
                        raise Hung(f"no answer within its deadline ({field})") from None
                    if got in (NO_REPLICA, STALE):
                        with self._recovery:
                            self._give_weights(i, whole=got == NO_REPLICA)
                        continue
                except (RayActorError, GetTimeoutError, Hung) as e:  # GetTimeoutError: while given its weights
                    if isinstance(e, GetTimeoutError):
                        self._ray.kill(self.workers[i], no_restart=False)
                    with self._recovery:
                        self._bring_back(i, e, what)
                    continue
                out[i] = got
                del todo[i]
            if not todo:
                return out
        raise EngineError(f"ray: rollout worker(s) {sorted(todo)} could not complete {what} after "
                          f"{self.max_restarts + 2} tries (ray_max_restarts={self.max_restarts})")

    def _bring_back(self, i: int, err: Exception, what: str) -> None:
        """Worker ``i`` died: Ray restarts it (or has given up: an EngineError); its next call answers
        NO_REPLICA and it gets the weights then."""
        from ray.exceptions import RayActorError

        old = self.where.get(i, {})
        try:
            now = answer_after_restart(self.workers[i].where.remote)
        except RayActorError as e:
            raise EngineError(f"ray: rollout worker {i} (pid {old.get('pid')}) died while {what} and was not "
                              f"restarted within {RESTART_WAIT:g} s ({type(e).__name__}); "
                              f"ray_max_restarts={self.max_restarts}") from None
        if (i, now["pid"]) in self.restarted:  # the other thread of this rank brought it back already
            return
        self.where[i] = now
        self.restarted.add((i, now["pid"]))
        log.warning("ray: rollout worker %d (pid %s) died or hung while %s (%s: %s); Ray restarted it as pid %s, which gets "
                    "the weights and draws its groups again from the same keys",
                    i, old.get("pid"), what, type(err).__name__, str(err)[:200], self.where[i]["pid"])

    def _give_weights(self, i: int, *, whole: bool) -> None:
        """The whole policy (``whole``: the worker holds no replica) and the newest trainable weights to worker i."""
        latest, version = self.latest_ref, self.version  # read together: publish may replace them meanwhile
        if whole:
            self._ray.get(self.workers[i].setup.remote(self.spec, self.whole_ref, self.first_version, self.epoch),
                          timeout=self.start_timeout)
        if latest is not None:
            self._ray.get(self.workers[i].load.remote(latest, version), timeout=self.call_timeout)

    # ---- the engine's calls --------------------------------------------------------------------------
    def _generate(self, prompts, *, group_size: int, sampling: SamplingSettings, keys: list[int] | None,
                  with_logprobs: bool, greedy: bool) -> Rollout:
        """Each worker samples a contiguous block of whole groups (their rows' keys with them)."""
        t0 = time.perf_counter()
        parts = [(i, b) for i, b in zip(self.indices, blocks(list(range(len(prompts))), len(self.indices))) if b]
        calls, tokens = {}, {}
        for i, groups in parts:
            rows = [r for g in groups for r in range(g * group_size, (g + 1) * group_size)]
            calls[i] = ("generate", (self.version, dict(
                prompts=[prompts[g] for g in groups], group_size=group_size, sampling=sampling,
                keys=None if keys is None else [keys[r] for r in rows], with_logprobs=with_logprobs, greedy=greedy)))
            tokens[i] = len(rows) * sampling.max_new_tokens
        got = self._on_each(calls, "sampling", tokens)
        blocks_ = []
        for i, _ in parts:
            ro = unpack_rollout({k: readonly_tensor(v) if isinstance(v, np.ndarray) else v
                                 for k, v in got[i]["rollout"].items()})
            if self.numbered:  # every token of a call is drawn with the weights the worker held for it
                ro.versions = torch.full_like(ro.completion_ids, got[i]["version"], dtype=torch.int64)  # [n, T]
            blocks_.append(ro)
        ro = concat_rollouts(blocks_, self.tokenizer.pad_token_id)
        ro.seconds, ro.engine = time.perf_counter() - t0, self.spec.engine  # wall time: the workers sample at once
        return rollout_to(ro, self.device)

    def sync_weights(self, policy) -> None:
        """``publish`` as the next version."""
        self.publish(policy, version=self.version + 1)

    def publish(self, policy, *, version: int) -> None:
        """The trainable weights of ``version`` (gathered, dequantized: ``whole_weights``) put once in the
        object store and loaded by this rank's workers; calls made after this one ask for them."""
        if policy is not self.model:
            raise ValueError("rollout engine 'ray' samples a copy of the model it was built on; publish got "
                             "another one")
        t0 = time.perf_counter()
        wire = to_wire(whole_weights(policy, self.trainable))
        ref = self._ray.put(wire)
        self._on_each({i: ("load", (ref, version)) for i in self.indices}, "loading weights")
        with self._recovery:
            self.latest_ref, self.version = ref, version
        self.last_sync = {"bytes": wire_bytes(wire), "seconds": time.perf_counter() - t0}

    def sync_metrics(self) -> dict:
        """The latest sync's bytes and seconds on this rank, and the rollout workers' restarts so far (every rank's)."""
        from grpo.infra import distributed

        with self._recovery:  # the producer thread may be adding to it
            mine = frozenset(self.restarted)
        restarts = len(set().union(*distributed.gather_objects(mine, self.world)))  # each once
        return {"cluster/weight_sync_bytes": self.last_sync["bytes"],
                "cluster/weight_sync_seconds": self.last_sync["seconds"], "cluster/rollout_restarts": restarts}

    def close(self) -> None:
        """Leaves the workers to the launcher (they serve the run's next trainer after a restart)."""
        self.whole_ref = self.latest_ref = None
        super().close()
