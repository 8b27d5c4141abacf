"""Placing a run on Ray: joining (or starting) a cluster, placement groups and the actors in them, and
``Workers``, the rollout and reward workers as each trainer rank gets them (driver.py runs the ranks)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from grpo.errors import ConfigError


@dataclass
class Workers:
    """The run's rollout and reward workers (Ray actor handles), as each trainer rank gets them."""

    rollout: list
    reward: list
    max_restarts: int
    call_timeout: float  # seconds a call may take beyond its work's share (ray_call_timeout)
    start_timeout: float  # seconds a worker may take to build its replica (ray_start_timeout)
    epoch: int = 0  # which start of the trainer ranks (0, then one more after each restart)

    def rollouts(self, world):
        """A builder of the training engine on the rollout workers (train/engines.Engines' ``remote``)."""
        from grpo.cluster.rollout import ClusterEngine

        def build(policy, tokenizer, *, inner: str, kernels: str, options, version: int, numbered: bool):
            return ClusterEngine(policy, tokenizer, inner=inner, kernels=kernels, options=options, version=version,
                                 numbered=numbered, workers=self.rollout, world=world, max_restarts=self.max_restarts,
                                 epoch=self.epoch, call_timeout=self.call_timeout,
                                 start_timeout=self.start_timeout)
        return build

    def attach_rewards(self, rewards) -> None:
        """The reward workers score every reward runner's pooled rewards (a mixture's: each source's)."""
        if not self.reward:
            return
        from grpo.cluster.rewards import RewardPool

        pool = RewardPool(self.reward, max_restarts=self.max_restarts, call_timeout=self.call_timeout)
        for runner in getattr(rewards, "runners", {"": rewards}).values():
            runner.pool = pool
        rewards.pool = pool


def connect(address: str, *, cpus_needed: float):
    """Join the cluster at ``address`` ("auto": the one `ray start` began on this machine) or, empty, start
    one here with at least the CPUs the run reserves (Ray's CPUs are slots: sampling and updating take turns)."""
    import logging

    import ray

    quiet = dict(logging_level=logging.WARNING, log_to_driver=True)
    if address:
        try:
            return ray.init(address=address, namespace="grpo", **quiet)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise ConfigError(f"ray_address: no Ray cluster answers at {address!r} ({type(e).__name__}: "
                              f"{str(e)[:300]}); start one with `ray start --head`, or leave ray_address empty "
                              "to start one here") from None
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
