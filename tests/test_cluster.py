"""launcher=ray on a real Ray cluster this module starts: a head and two worker nodes (Ray's own
multi-node test cluster, each node a raylet of its own with its own CPU count), joined by real
`grpo train launcher=ray ray_address=...` subprocesses on the tiny random Llama.

A Ray run is the single-process run (weights to the tolerance of tests/test_distributed.py, the same
metrics); a rollout worker, a reward worker or a trainer rank killed with SIGKILL mid-run
(grpo/cluster/faults.py) is brought back and the run ends with the same weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import import_or_skip_unless_ci
from tests.test_distributed import LORA, STEPS, _adapters_start, _assert_same_metrics, _assert_same_weights, _env, \
    _initial, _metrics, _run, _weights, data_file  # noqa: F401 (data_file: a fixture)

ROOT = Path(__file__).resolve().parents[1]
RAY_MISSING = "ray is not installed (pip install -e '.[ray]')"
TRAIN = ["prompts_per_step=4", "num_generations=4", "per_device_train_batch_size=4", "max_completion_length=8",
         "eval_prompts=0", "rewards=tests.rewards_for_tests:digit_share", "learning_rate=1e-3", "beta=0.04",
         "num_iterations=2", "bf16=false", "progress=false", "report_to=none", "reward_timeout=0", "num_threads=1",
         "seed=3", "aggregation=seq_mean_token_mean", "advantage_estimator=grpo", f"max_steps={STEPS}"]


@pytest.fixture(scope="module")
def cluster():
    """A head (1 CPU) and two worker nodes (2 CPUs each); its address."""
    import_or_skip_unless_ci("ray", RAY_MISSING)
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        for _ in range(2):
            c.add_node(num_cpus=2)
        c.wait_for_nodes()
        yield c.address
    finally:
        c.shutdown()


def _train(run: Path, model, data, extra: list[str], *, env: dict | None = None):
    args = ["train", f"model={model}", f"task={data}", f"output_dir={run}", *TRAIN, *extra]
    proc = _run([__import__("sys").executable, "-m", "grpo", *args], {**_env(), **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _on_ray(cluster: str, *, trainers: int = 2, rollout: int = 2, reward: int = 0) -> list[str]:
    return ["launcher=ray", f"ray_address={cluster}", f"ray_trainers={trainers}", f"ray_rollout_workers={rollout}",
            f"ray_reward_workers={reward}", "ray_trainer_cpus=0.5", "ray_rollout_cpus=0.5", "ray_reward_cpus=0.25"]


@pytest.fixture(scope="module")
def data(data_file):
    """The distributed tests' task (24 sums), so a Ray run is compared with the runs they compare."""
    return data_file


@pytest.fixture(scope="module")
def single(tmp_path_factory, tiny_model_dir, data):
    run = tmp_path_factory.mktemp("one") / "run"
    _train(run, tiny_model_dir, data, [])
    return run


@pytest.fixture(scope="module")
def single_lora(tmp_path_factory, tiny_model_dir, data):
    run = tmp_path_factory.mktemp("one-lora") / "run"
    _train(run, tiny_model_dir, data, list(LORA))
    return run


@pytest.fixture(scope="module")
def on_ray(tmp_path_factory, tiny_model_dir, data, cluster):
    run = tmp_path_factory.mktemp("ray") / "run"
    _train(run, tiny_model_dir, data, _on_ray(cluster, reward=2))
    return run


def test_a_ray_run_with_two_trainer_ranks_and_two_rollout_workers_is_the_single_process_run(
        tiny_model_dir, single, on_ray):
    where = json.loads((on_ray / "cluster.json").read_text())
    assert len(where["trainer"]) == 2 and len(where["rollout"]) == 2 and len(where["reward"]) == 2
    assert where["rollout"][0]["node"] != where["rollout"][1]["node"], "the rollout workers share a node"
    assert len({w["pid"] for w in where["trainer"] + where["rollout"]}) == 4
    _assert_same_weights(_weights(single), _weights(on_ray), _initial(tiny_model_dir))
    _assert_same_metrics(_metrics(single), _metrics(on_ray))
    m = _metrics(on_ray)
    from grpo.train.metrics_catalog import METRICS, lookup

    assert not [k for x in m for k in x if lookup(k) is None], "a key missing from the metric catalog"
    assert {e.key for e in METRICS if e.key.startswith("cluster/")} <= set(m[0]), "a cluster metric not logged"
    assert all(x["cluster/rollout_restarts"] == 0 and x["cluster/reward_restarts"] == 0 for x in m)
    # the trainable weights went through the object store after every step: the whole tiny model here
    assert all(x["cluster/weight_sync_bytes"] == sum(t.numel() * 4 for t in _initial(tiny_model_dir).values())
               for x in m)


@pytest.mark.parametrize("trainers,rewards,kill,metric,line,extra", [
    # one rank spreads its groups over both rollout workers, the second of which dies in its call of step 2
    # rollout worker 1 killed in its call of step 2; then worker 0 stops answering (hung) in its call of step 3:
    # past ray_call_timeout it is killed, Ray restarts it and its groups are drawn again (one run, both faults)
    (1, 0, "rollout:1:2,hang-rollout:0:3", "cluster/rollout_restarts", "ray: rollout worker 1 (pid",
     ("ray_call_timeout=8",)),  # room for a call on a loaded 2-core machine
    # two ranks each call every one of 3 reward workers: call 3 of worker 1 is one of step 2's; LoRA: the
    # adapters alone go to the rollout workers after each step
    (2, 3, "reward:1:3", "cluster/reward_restarts", "ray: reward worker 1 (pid", LORA),
], ids=["rollout-worker-killed-then-one-hung", "reward-worker-lora"])
def test_a_worker_killed_mid_step_is_restarted_and_the_run_ends_with_the_same_weights(
        tmp_path, tiny_model_dir, data, cluster, single, single_lora, trainers, rewards, kill, metric, line, extra):
    run = tmp_path / "run"
    proc = _train(run, tiny_model_dir, data, _on_ray(cluster, trainers=trainers, reward=rewards) + list(extra),
                  env={"GRPO_RAY_KILL": kill})
    out = proc.stdout + proc.stderr
    assert 1 <= out.count(line) <= trainers and "died or hung while" in out, out[-3000:]  # each rank that saw it
    faults = kill.count(",") + 1
    if "hang" in kill:
        assert "no answer within its deadline (ray_call_timeout=8)" in out and "ray: rollout worker 0 (pid" in out, \
            out[-3000:]
    restarts = [x[metric] for x in _metrics(run)]
    assert restarts == [0, 1, 2][:len(restarts)] if faults == 2 else restarts[0] == 0 and restarts[-1] == 1, restarts
    lora = LORA[0] in extra
    one = single_lora if lora else single
    _assert_same_weights(_weights(one), _weights(run), _adapters_start(one) if lora else _initial(tiny_model_dir))
    _assert_same_metrics(_metrics(one), _metrics(run))
    if lora:  # the adapters alone went to the rollout workers after each step, not the whole model
        adapters = sum(t.numel() * 4 for t in _weights(one).values())
        assert all(m["cluster/weight_sync_bytes"] == adapters for m in _metrics(run))
        assert adapters < 0.2 * sum(t.numel() * 4 for t in _initial(tiny_model_dir).values())


def test_async_rollouts_on_ray_without_staleness_are_the_synchronous_run(tmp_path, tiny_model_dir, data, cluster,
                                                                         single):
    """The rollout workers are the producer's engines: at max_staleness=0 each step's draw is keyed as the
    synchronous loop keys it and sampled on the newest weights, so the run is the single-process one; every
    token carries the version it was drawn with (none stale). One rollout worker serves both ranks: each
    rank's weights reach it, and it samples each rank's groups on the version that rank asks for."""
    run = tmp_path / "run"
    _train(run, tiny_model_dir, data, _on_ray(cluster, rollout=1) + ["async_rollouts=true", "max_staleness=0"])
    _assert_same_weights(_weights(single), _weights(run), _initial(tiny_model_dir))
    _assert_same_metrics(_metrics(single), _metrics(run))
    assert all(m["async/staleness_max"] == 0 and m["async/stale_token_share"] == 0 for m in _metrics(run))


def test_async_rollouts_on_ray_draw_ahead_with_tokens_of_older_weights(tmp_path, tiny_model_dir, data, cluster):
    """At max_staleness=1 the workers sample the next step's groups while the trainer updates: the run
    trains tokens of the previous weights (tagged with their version by the worker that drew them)."""
    run = tmp_path / "run"
    _train(run, tiny_model_dir, data, _on_ray(cluster, trainers=1, rollout=2) + ["async_rollouts=true",
                                                                             "max_staleness=1"])
    lines = _metrics(run)
    assert [m["step"] for m in lines] == list(range(1, STEPS + 1))
    assert max(m["async/staleness_max"] for m in lines) == 1 and max(m["async/stale_token_share"] for m in lines) > 0


@pytest.mark.parametrize("strategy,kill,save,since", [
    # FSDP2: the ranks gather the sharded weights for the rollout workers together, and resume sharded
    ("fsdp2", "trainer:1:1", 1, "its checkpoint step-1"),
    # DDP, after step 1 was logged but before any checkpoint: the run starts again, what the dead attempt
    # wrote (its metrics) moved aside
    ("ddp", "trainer:1:0", 10, "the start (no checkpoint yet)"),
], ids=["fsdp2-after-step-1", "ddp-before-a-checkpoint"])
def test_a_trainer_rank_killed_restarts_the_run_from_its_checkpoint_with_the_same_weights(
        tmp_path, tiny_model_dir, data, cluster, single, strategy, kill, save, since):
    run = tmp_path / "run"
    proc = _train(run, tiny_model_dir, data, _on_ray(cluster) + [f"save_steps={save}", f"distributed_strategy={strategy}"],
                  env={"GRPO_RAY_KILL": kill})
    out = proc.stdout + proc.stderr
    assert out.count("ray: trainer rank 1 (pid") == 1, out[-3000:]
    assert f"the run restarts from {since} (restart 1 of 3)" in out, out[-3000:]
    assert json.loads((run / "cluster.json").read_text())["attempt"] == 1
    if save > 1:
        assert (run / "metrics.jsonl.attempt-0").read_text().strip(), "the dead attempt's metrics were not kept"
    _assert_same_weights(_weights(single), _weights(run), _initial(tiny_model_dir))
    assert [m["step"] for m in _metrics(run)] == list(range(1, STEPS + 1))


# ---- without a cluster -----------------------------------------------------------------------------------
@pytest.mark.parametrize("fields,named", [
    (dict(launcher="slurm"), "launcher"),
    (dict(launcher="ray", ray_trainers=3), "ray_trainers"),  # 4 prompts over 3 ranks
    (dict(launcher="ray", rollout_engine="vllm_server"), "rollout_engine"),
    (dict(launcher="ray", async_rollouts=True, partial_rollouts=True), "partial_rollouts"),
    (dict(ray_rollout_workers=0), "ray_rollout_workers"),
    (dict(ray_reward_cpus=0), "ray_reward_cpus"),
    (dict(launcher="ray", ray_trainer_gpus=0.5), "ray_trainer_gpus"),  # two ranks on one GPU cannot join one NCCL group
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_cluster_setting_is_refused_naming_its_field(fields, named):
    from grpo.config import Config
    from grpo.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^{named}:"):
        Config(prompts_per_step=4, **fields)


def test_each_rank_drives_its_own_rollout_workers():
    from grpo.cluster.rollout import my_workers

    workers = list("abcde")
    assert [my_workers(workers, r, 2) for r in range(2)] == [[0, 2, 4], [1, 3]]
    assert [my_workers(workers[:1], r, 3) for r in range(3)] == [[0], [0], [0]]  # fewer workers: shared


def test_weights_cross_as_numpy_with_their_bits():
    import torch

    from grpo.cluster.wire import from_wire, to_wire, wire_bytes

    w = {"a": torch.randn(3, 4, dtype=torch.bfloat16), "b": torch.randn(5), "c": torch.arange(4)}
    back = from_wire(to_wire(w))
    assert all(back[k].dtype == w[k].dtype and torch.equal(back[k], w[k]) for k in w)
    assert wire_bytes(to_wire(w)) == 12 * 2 + 5 * 4 + 4 * 8
