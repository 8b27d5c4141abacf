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
        """faults.py's ``trainer:R:S``: this rank dies once step S's checkpoint is written (first attempt only)."""
        step = planned("trainer", self.rank)
        if step is None or attempt:
            return
        while not (run_dir / "checkpoints" / f"step-{step}").is_dir():  # written whole (an atomic rename)
            time.sleep(0.02)
        die_at("trainer", self.rank, step, restarted=False)


def _threads(cpus: float) -> int:
    return max(1, int(cpus))


def train_on_ray(cfg) -> dict:
    """Run ``cfg`` with its trainer ranks, rollout and reward workers on Ray; rank 0's outcome (``steps``,
    ``run_dir``, ``cfg``, ``result``, ``resumed_from``)."""
    import ray

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError("launcher: ray places the trainer ranks itself; start `grpo train launcher=ray` "
                          "without torchrun")
    run_dir = Path(cfg.output_dir or f"runs/{datetime.now():%Y%m%d-%H%M%S}").resolve()
    cfg = dataclasses.replace(cfg, output_dir=str(run_dir), working_dir=cfg.working_dir or os.getcwd())
    need = (cfg.ray_trainers * cfg.ray_trainer_cpus + cfg.ray_rollout_workers * cfg.ray_rollout_cpus
            + cfg.ray_reward_workers * cfg.ray_reward_cpus)
    connect(cfg.ray_address, cpus_needed=need)
    env = {k: v for k, v in os.environ.items() if k.startswith("GRPO_")}  # a key, a test's fault plan
    wd, groups, actors = cfg.working_dir, [], []
    try:
        t = cfg.ray_start_timeout
        groups.append(_placed(_bundles(cfg.ray_rollout_workers, cfg.ray_rollout_cpus, cfg.ray_rollout_gpus),
                              "SPREAD", "ray_rollout_workers", t))
        rollout = _actors(RolloutWorker, groups[-1], cfg.ray_rollout_workers, cpus=cfg.ray_rollout_cpus,
                          gpus=cfg.ray_rollout_gpus, restarts=cfg.ray_max_restarts, env=env,
                          args=lambda i: (i, _threads(cfg.ray_rollout_cpus), wd))
        reward = []
        if cfg.ray_reward_workers:
            groups.append(_placed(_bundles(cfg.ray_reward_workers, cfg.ray_reward_cpus, 0), "SPREAD",
                                  "ray_reward_workers", t))
            reward = _actors(RewardWorker, groups[-1], cfg.ray_reward_workers, cpus=cfg.ray_reward_cpus, gpus=0,
                             restarts=cfg.ray_max_restarts, env=env, args=lambda i: (i, wd))
        actors += rollout + reward
        groups.append(_placed(_bundles(cfg.ray_trainers, cfg.ray_trainer_cpus, cfg.ray_trainer_gpus), "PACK",
                              "ray_trainers", t))
        where = {"rollout": ray.get([w.where.remote() for w in rollout]),
                 "reward": ray.get([w.pid.remote() for w in reward])}
        return _run_trainers(cfg, Workers(rollout, reward, cfg.ray_max_restarts), groups[-1], env, where, run_dir)
    finally:
        from ray.util.placement_group import remove_placement_group

        for a in actors:
            ray.kill(a, no_restart=True)
        for pg in groups:
            remove_placement_group(pg)
        ray.shutdown()


def _run_trainers(cfg, workers: Workers, pg, env: dict, where: dict, run_dir: Path) -> dict:
    """The trainer ranks' run; after a rank's death, the run again from its last checkpoint (up to
    ray_max_restarts times), each time with one line saying so."""
    import ray

    threads = cfg.num_threads or _threads(cfg.ray_trainer_cpus)
    for attempt in range(cfg.ray_max_restarts + 1):
        ranks = _actors(TrainerRank, pg, cfg.ray_trainers, cpus=cfg.ray_trainer_cpus, gpus=cfg.ray_trainer_gpus,
                        restarts=0, env=env, args=lambda i: (i, cfg.ray_trainers, cfg.working_dir, threads))
        try:
            where["trainer"] = ray.get([r.where.remote() for r in ranks])
            _record(run_dir, where, attempt)
            master = ray.get(ranks[0].master.remote())
            outcome = _outcome([r.run.remote(cfg, master, workers, attempt) for r in ranks])
        finally:
            for r in ranks:
                ray.kill(r, no_restart=True)
        if not isinstance(outcome, int):
            return outcome
        if attempt == cfg.ray_max_restarts:
            raise GrpoError(f"ray: trainer rank {outcome} died and the run was restarted ray_max_restarts="
                            f"{cfg.ray_max_restarts} times already; it stops here (its checkpoints are in {run_dir})")
        latest = run_dir / "checkpoints" / "latest"
        if latest.exists():
            since = f"its checkpoint {find_latest(run_dir).name}"
            cfg = dataclasses.replace(cfg, resume_from_checkpoint="auto")
        else:  # from the start again (or the checkpoint it began from): the dead attempt's metrics kept aside
            since = "the start (no checkpoint yet)"
            metrics = run_dir / "metrics.jsonl"
            if metrics.exists():
                metrics.rename(run_dir / f"metrics.attempt-{attempt}.jsonl")
        print(f"ray: trainer rank {outcome} (pid {where['trainer'][outcome]['pid']}) died; the run restarts from "
              f"{since} (restart {attempt + 1} of {cfg.ray_max_restarts})", flush=True)
    raise AssertionError("unreachable")


def _outcome(refs: list):
    """Rank 0's result, or the index of a rank that died (the others are then stopped by the caller); an
    error a rank raised (not caused by another's death) is raised here."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    index = {ref: i for i, ref in enumerate(refs)}
    pending, results, raised = list(refs), {}, None
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=None if raised is None else 30.0)
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
