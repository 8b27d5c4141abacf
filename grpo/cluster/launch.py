"""The driver of ``grpo train launcher=ray``: join (or start) a cluster, place the run's processes with
placement groups (trainer ranks packed, rollout and reward workers spread over the nodes), run the
trainer ranks and bring the run back from its last checkpoint when a rank dies.

Each trainer rank is a Ray actor that sets torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT: rank 0's node and a free port there) and runs the unchanged trainer, which joins its
process group (gloo on CPUs, NCCL on GPUs) and wraps the policy in DDP or FSDP2 as under torchrun. The
rollout and reward workers are handed to every rank (``Workers``). ``cluster.json`` in the run folder
says where each process ran.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass

import torch

from grpo.cluster.faults import die_at
from grpo.errors import ConfigError


@dataclass
class Workers:
    """The run's rollout and reward workers (Ray actor handles), as each trainer rank gets them."""

    rollout: list
    reward: list
    max_restarts: int

    def rollouts(self, world):
        """A builder of the training engine on the rollout workers (train/engines.Engines' ``remote``)."""
        from grpo.cluster.rollout import ClusterEngine

        def build(policy, tokenizer, *, inner: str, kernels: str, options):
            return ClusterEngine(policy, tokenizer, inner=inner, kernels=kernels, options=options,
                                 workers=self.rollout, world=world, max_restarts=self.max_restarts)
        return build

    def attach_rewards(self, rewards) -> None:
        """The reward workers score every reward runner's pooled rewards (a mixture's: each source's)."""
        if not self.reward:
            return
        from grpo.cluster.rewards import RewardPool

        pool = RewardPool(self.reward, max_restarts=self.max_restarts)
        for runner in getattr(rewards, "runners", {"": rewards}).values():
            runner.pool = pool
        rewards.pool = pool


class TrainerRank:
    """One trainer rank (a Ray actor): the trainer under torchrun's environment."""

    def __init__(self, rank: int, size: int, working_dir: str, threads: int):
        from grpo.infra.runtime import import_from

        os.chdir(working_dir)  # the run's relative paths mean what they mean where the driver runs
        import_from(working_dir)
        torch.set_num_threads(max(1, threads))
        self.rank, self.size = rank, size

    def where(self) -> dict:
        import ray

        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id()}

    def master(self) -> tuple[str, int]:
        """This node's address and a free port on it: rank 0's, where the process group meets."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((host, 0))
            return host, s.getsockname()[1]

    def run(self, cfg, master: tuple[str, int], workers: Workers, attempt: int) -> dict:
        """The trainer's run, as `grpo train` runs it under torchrun; rank 0's result."""
        from grpo.infra.distributed import close_world
        from grpo.train.trainer import Trainer

        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.size), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
        trainer = Trainer(cfg, cluster=workers)
        world = trainer.world
        threading.Thread(target=self._watch, args=(trainer, attempt), daemon=True).start()
        finished = False
        try:
            result = trainer.train()
            finished = True
        finally:
            out = {"steps": trainer.step, "run_dir": str(trainer.run_dir), "cfg": trainer.cfg,
                   "resumed_from": None if trainer.resumed_from is None else str(trainer.resumed_from)}
            del trainer
            close_world(world, finished=finished)
        return {**out, "result": result}

    def _watch(self, trainer, attempt: int) -> None:
        """faults.py's ``trainer:R:S``: this rank dies once step S's checkpoint is written (first attempt only)."""
        from grpo.cluster.faults import planned

        if planned("trainer", self.rank) is None or attempt:
            return
        step = planned("trainer", self.rank)
        while not (trainer.run_dir / "checkpoints" / f"step-{step}").is_dir():  # written whole (atomic rename)
            time.sleep(0.02)
        die_at("trainer", self.rank, step, restarted=False)


def connect(address: str, *, cpus_needed: float):
    """Join the cluster at ``address`` ("auto": the one `ray start` began on this machine) or, empty, start
    one here with at least the CPUs the run reserves (Ray's CPUs are slots: sampling and updating take turns)."""
    import logging

    import ray

    quiet = dict(logging_level=logging.WARNING, log_to_driver=True)
    if address:
        return ray.init(address=address, namespace="grpo", **quiet)
    return ray.init(num_cpus=max(os.cpu_count() or 1, int(-(-cpus_needed // 1))), include_dashboard=False,
                    namespace="grpo", **quiet)


def _placed(bundles: list[dict], strategy: str, what: str, timeout: float):
    """A placement group of ``bundles``, ready; a ConfigError naming ``what`` where the cluster cannot hold it."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group(bundles, strategy=strategy)
    ready, _ = ray.wait([pg.ready()], timeout=timeout)
    if not ready:
        remove_placement_group(pg)
        raise ConfigError(f"{what}: the cluster could not place {len(bundles)} x {bundles[0]} within "
                          f"{timeout:g} s (ray_start_timeout); it has {ray.cluster_resources()}")
    return pg


def _actors(cls, pg, n: int, *, cpus: float, gpus: float, restarts: int, env: dict, args) -> list:
    """``n`` actors of ``cls``, actor i in bundle i of ``pg`` built with ``args(i)``."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    remote = ray.remote(cls)
    return [remote.options(num_cpus=cpus, num_gpus=gpus, max_restarts=restarts, max_task_retries=0,
                           runtime_env={"env_vars": env},
                           scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i))
            .remote(*args(i)) for i in range(n)]


def _bundles(n: int, cpus: float, gpus: float) -> list[dict]:
    return [{"CPU": cpus, **({"GPU": gpus} if gpus else {})} for _ in range(n)]
