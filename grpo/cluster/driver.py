"""``grpo train launcher=ray``: the run on a Ray cluster, from the process that starts it. launch.py places
the parts (trainer ranks packed, rollout and reward workers spread over the nodes); this module runs the
trainer ranks and brings the run back from its last checkpoint when a rank dies.

Each trainer rank is a Ray actor that sets torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT: rank 0's node and a free port there) and runs the unchanged trainer, which joins its
process group (gloo on CPUs, NCCL on GPUs) and wraps the policy in DDP or FSDP2 as under torchrun. The
rollout and reward workers are handed to every rank (launch.Workers). ``cluster.json`` in the run folder
says where each process ran. Like `grpo train` itself, this module hands the Config to the Trainer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
from datetime import datetime
from pathlib import Path

import torch

from grpo.cluster.faults import die_at, planned
from grpo.cluster.launch import Workers, _actors, _bundles, _placed, connect
from grpo.cluster.rewards import RewardWorker
from grpo.cluster.rollout import RolloutWorker
from grpo.errors import ConfigError, GrpoError
from grpo.infra.checkpoint import find_latest
from grpo.train.settings import ClusterSettings, cluster_settings


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
        threading.Thread(target=self._watch, args=(trainer.run_dir, attempt), daemon=True).start()
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

    def _watch(self, run_dir: Path, attempt: int) -> None:
        """faults.py's ``trainer:R:S``: this rank dies once step S's checkpoint is written (S = 0: once the first
        step is logged), on the first attempt only."""
        step = planned("trainer", self.rank)
        if step is None or attempt:
            return
        done = run_dir / "checkpoints" / f"step-{step}" if step else run_dir / "metrics.jsonl"
        while not done.exists():  # a checkpoint is written whole (an atomic rename)
            time.sleep(0.02)
        die_at("trainer", self.rank, step, restarted=False)


DEATH_WAIT = 120.0  # seconds the other ranks may take to end (or be reported dead) after one raised


def _threads(cpus: float) -> int:
    return max(1, int(cpus))


def train_on_ray(cfg) -> dict:
    """Run ``cfg`` with its trainer ranks, rollout and reward workers on Ray; rank 0's outcome (``steps``,
    ``run_dir``, ``cfg``, ``result``, ``resumed_from``)."""
    import ray

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("launcher: ray places the trainer ranks itself; start `grpo train launcher=ray` "
                          "without torchrun")
    s = cluster_settings(cfg, cwd=os.getcwd(), stamp=f"{datetime.now():%Y%m%d-%H%M%S}")
    cfg = dataclasses.replace(cfg, output_dir=s.run_dir, working_dir=s.working_dir)  # every rank's, every attempt
    connect(s.address, cpus_needed=s.cpus)
    # what the workers read from the environment: grpo's own variables (keys, a test's fault plan) and those
    # the config names (a judge's key)
    env = {k: v for k, v in os.environ.items() if k.startswith("GRPO_") or k in s.env_names}
    groups, actors = [], []
    try:
        groups.append(_placed(_bundles(s.rollout_workers, s.rollout_cpus, s.rollout_gpus), "SPREAD",
                              "ray_rollout_workers", s.start_timeout))
        rollout = _actors(RolloutWorker, groups[-1], s.rollout_workers, cpus=s.rollout_cpus, gpus=s.rollout_gpus,
                          restarts=s.max_restarts, env=env, args=lambda i: (i, _threads(s.rollout_cpus), s.working_dir))
        reward = []
        if s.reward_workers:
            groups.append(_placed(_bundles(s.reward_workers, s.reward_cpus, 0), "SPREAD", "ray_reward_workers",
                                  s.start_timeout))
            reward = _actors(RewardWorker, groups[-1], s.reward_workers, cpus=s.reward_cpus, gpus=0,
                             restarts=s.max_restarts, env=env, args=lambda i: (i, s.working_dir))
        actors += rollout + reward
        groups.append(_placed(_bundles(s.trainers, s.trainer_cpus, s.trainer_gpus), "PACK", "ray_trainers",
                              s.start_timeout))
        where = {"rollout": ray.get([w.where.remote() for w in rollout], timeout=s.start_timeout),
                 "reward": ray.get([w.pid.remote() for w in reward], timeout=s.start_timeout)}
        workers = Workers(rollout, reward, s.max_restarts, s.call_timeout, s.start_timeout)
        return _run_trainers(cfg, s, workers, groups[-1], env, where)
    finally:
        from ray.util.placement_group import remove_placement_group

        for a in actors:
            ray.kill(a, no_restart=True)
        for pg in groups:
            remove_placement_group(pg)
        ray.shutdown()


def _run_trainers(cfg, s: ClusterSettings, workers: Workers, pg, env: dict, where: dict) -> dict:
    """The trainer ranks' run (``cfg``: what each hands its Trainer); after a rank's death, the run again
    from its last checkpoint (up to ray_max_restarts times), each time with one line saying so."""
    import ray

    run_dir = Path(s.run_dir)
    for attempt in range(s.max_restarts + 1):
        ranks = _actors(TrainerRank, pg, s.trainers, cpus=s.trainer_cpus, gpus=s.trainer_gpus, restarts=0, env=env,
                        args=lambda i: (i, s.trainers, s.working_dir, s.trainer_threads))
        try:
            where["trainer"] = ray.get([r.where.remote() for r in ranks], timeout=s.start_timeout)
            _record(run_dir, where, attempt)
            master = ray.get(ranks[0].master.remote(), timeout=s.start_timeout)
            started = dataclasses.replace(workers, epoch=attempt)  # the workers rebuild their replicas for it
            outcome = _outcome([r.run.remote(cfg, master, started, attempt) for r in ranks])
        finally:
            for r in ranks:
                ray.kill(r, no_restart=True)
        if not isinstance(outcome, int):
            return outcome
        if attempt == s.max_restarts:
            raise GrpoError(f"ray: trainer rank {outcome} died and the run was restarted ray_max_restarts="
                            f"{s.max_restarts} times already; it stops here (its checkpoints are in {run_dir})")
        if (run_dir / "checkpoints" / "latest").exists():
            since = f"its checkpoint {find_latest(run_dir).name}"
            cfg = dataclasses.replace(cfg, resume_from_checkpoint="auto")
        else:  # from the start again (or the checkpoint it began from): what the dead attempt wrote kept aside
            since = "the start (no checkpoint yet)"
            for name in ("metrics.jsonl", "checkpoints", "samples.jsonl", "tensorboard"):
                if (run_dir / name).exists():
                    (run_dir / name).rename(run_dir / f"{name}.attempt-{attempt}")
        print(f"ray: trainer rank {outcome} (pid {where['trainer'][outcome]['pid']}) died; the run restarts from "
              f"{since} (restart {attempt + 1} of {s.max_restarts})", flush=True)
    raise AssertionError("unreachable")


def _outcome(refs: list):
    """Rank 0's result, or the index of a rank that died (the others are then stopped by the caller); an
    error a rank raised (not caused by another's death) is raised here."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    index = {ref: i for i, ref in enumerate(refs)}
    pending, results, raised = list(refs), {}, None
    while pending:
        # once a rank raised, the others are given time to end: a rank lost with its node is reported
        # dead only after Ray's health checks, well after its peers' collectives failed
        ready, pending = ray.wait(pending, num_returns=1, timeout=None if raised is None else DEATH_WAIT)
        if not ready:
            break
        try:
            results[index[ready[0]]] = ray.get(ready[0])
        except RayActorError:
            return index[ready[0]]
        except RayTaskError as e:  # a rank raised: its own error, or its peer's death seen in a collective
            raised = raised or e
    if raised is not None:
        cause = raised.cause if isinstance(getattr(raised, "cause", None), BaseException) else raised
        raise cause
    return results[0]


def _record(run_dir: Path, where: dict, attempt: int) -> None:
    """cluster.json: where each process of the run runs (pids and Ray node ids), for the run's record."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "cluster.json").write_text(json.dumps({**where, "attempt": attempt}, indent=1) + "\n")
