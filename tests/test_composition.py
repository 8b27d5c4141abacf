"""The composition table (grpo/config/composition.py) against the code: every pair it refuses is refused
by validation with its field, before anything loads; every pair it says runs trains two steps on the
tiny model with finite metrics, within a few runs that each turn on many features at once (a pairwise
covering set; the torchrun ones under torchrun); the page is the table's."""

from __future__ import annotations

import json
import math
import re
import sys

import pytest

from grpo.config import Config
from grpo.config.composition import BY_NAME, FEATURES, REFUSALS, composition_page, pairs, refusal_of
from grpo.config.validate import validate_world
from grpo.errors import ConfigError
from grpo.train.trainer import Trainer
from tests import mixture_envs_for_tests as envs
from tests.conftest import build_tiny_reward_model
from tests.test_trainer import make_cfg

ENVS = "arithmetic=tests.mixture_envs_for_tests:AdderEnv,calculator=tests.mixture_envs_for_tests:MultiplierEnv"
ENV_REWARDS = "tests.mixture_envs_for_tests:arithmetic_reward,tests.mixture_envs_for_tests:calculator_reward"


def asset_fields(routed, reward_model, teacher) -> dict:
    """What some features need besides their switches: a routed dataset, a reward model, a teacher."""
    return {"routed": {"task": str(routed), "environment_factory": ENVS, "rewards": ENV_REWARDS},
            "reward_model_training": {"reward_model": str(reward_model),
                                      "reward_model_verifier": "tests.rewards_for_tests:digit_share",
                                      "reward_model_batch_size": 4, "reward_model_heldout": 1},
            "teacher": {"teacher": str(teacher)}}


@pytest.fixture(scope="module")
def assets(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("composition")
    routed = root / "routed.jsonl"
    routed.write_text("".join(json.dumps(r) + "\n" for r in envs.rows()))
    return asset_fields(routed, build_tiny_reward_model(root / "rm"), tiny_model_dir)


def fields_of(names, assets) -> dict:
    out: dict = {}
    for name in names:
        out.update(BY_NAME[name].fields)
        out.update(assets.get(name, {}) if isinstance(assets, dict) else {})
    if {"mixture", "routed"} <= set(names):  # a mixture with the dict form besides its sources
        out.update(task=BY_NAME["mixture"].fields["task"])
        out.pop("rewards")
    if "async" in names:
        out.update(async_engine_threads=1, rollout_engine="hf")
    if "qlora" in names:
        out.update(rollout_engine="hf")
    return out


def test_the_page_is_the_tables():
    page = composition_page()
    for r in REFUSALS:
        assert f"`{r.field}`: {r.reason}." in page
    assert page.count("| `") >= 2 * len(FEATURES)




@pytest.mark.parametrize("pair", [r.pair for r in REFUSALS], ids="+".join)
def test_every_refused_pair_is_refused_naming_its_field(pair, assets):
    """Validation (on one process, or on the two processes a torchrun feature needs) raises the table's
    error; a pair of mutually exclusive switches cannot be written as one config at all."""
    r = refusal_of(*pair)
    fields = fields_of(pair, assets)
    if {"ddp", "fsdp2"} == set(pair) or {"lora", "qlora"} == set(pair):
        cfg = Config(**fields)  # the later switch wins: never both on
        assert not all(BY_NAME[n].on(cfg, 2) for n in pair)
        return
    processes = max(BY_NAME[n].processes for n in pair)
    with pytest.raises(ConfigError, match=f"^{re.escape(f'{r.field}: {r.reason}')}$"):
        cfg = Config(**fields, prompts_per_step=2)
        validate_world(cfg, processes)


RUNS = [p for p in pairs() if refusal_of(*p) is None]  # every pair the table says runs
NAMES = [f.name for f in FEATURES]


def _agree(group, name: str, assets) -> bool:
    """``name`` may join ``group`` in one run: the table refuses none of its pairs with the group's
    features, and their switches set no field to two values."""
    if any(refusal_of(name, g) is not None for g in group):
        return False
    mine, theirs = fields_of([name], assets), fields_of(group, assets)
    return all(theirs[k] == v for k, v in mine.items() if k in theirs)


def covering_runs(assets) -> list[tuple[str, ...]]:
    """A few runs whose features, together, hold every pair the table says runs (a pairwise covering
    set, greedy): each run starts from the first pair not yet held and takes on, one at a time, the
    feature that agrees with it and holds the most pairs not yet held (torchrun's pairs first, and no
one-process run takes on a torchrun feature, so torchrun runs are few). Training each run for two steps
    trains every such pair, with others beside it, in far fewer runs than one per pair."""
    def torchrun(names) -> bool:
        return any(BY_NAME[n].processes > 1 for n in names)

    todo, runs = sorted(RUNS, key=lambda p: not torchrun(p)), []  # the costly torchrun runs first, fewest
    while todo:
        group, left = list(todo[0]), {frozenset(p) for p in todo}

        def gain(name: str) -> int:  # pairs not yet held that ``name`` would hold in this run
            return sum(frozenset((name, g)) in left for g in group)

        while True:
            fits = [n for n in NAMES if n not in group and (torchrun(group) or not torchrun([n]))
                    and _agree(group, n, assets) and gain(n) > 0]
            if not fits:
                break
            group.append(max(fits, key=gain))  # the first of the largest gain, in the table's order
        runs.append(tuple(sorted(group, key=NAMES.index)))
        todo = [p for p in todo if not set(p) <= set(group)]
    return runs


# which features agree depends on the fields' keys, not on the paths: stand-ins at collection
COVER = covering_runs(asset_fields("routed.jsonl", "rm", "teacher"))


def test_the_runs_hold_every_pair_that_runs_and_no_refused_one():
    held = {frozenset(p) for run in COVER for p in pairs() if set(p) <= set(run)}
    assert {frozenset(p) for p in RUNS} <= held
    assert all(refusal_of(*p) is None for run in COVER for p in pairs() if set(p) <= set(run))
    assert len(COVER) < len(RUNS) / 3  # the point of covering: far fewer runs than pairs


@pytest.mark.parametrize("run", [r for r in COVER if all(BY_NAME[n].processes == 1 for n in r)], ids="+".join)
def test_every_one_process_pair_that_runs_trains_two_steps(run, tmp_path, tiny_model_dir, tiny_dataset, assets):
    """One run with all of ``run``'s features (each pair of them one the table says runs)."""
    cfg = make_cfg(tmp_path, tiny_model_dir, tiny_dataset, max_steps=2, eval_prompts=0, **fields_of(run, assets))
    assert all(BY_NAME[n].on(cfg, 1) for n in run), "the run's switches cannot be written as one config"
    t = Trainer(cfg)
    t.train()
    _check_lines(run, [json.loads(x) for x in (t.run_dir / "metrics.jsonl").read_text().splitlines()])


def _check_lines(run, lines: list[dict]) -> None:
    """Two steps with finite losses, in which the features that leave a trace in the metrics left it."""
    assert [line["step"] for line in lines] == [1, 2]
    assert all(math.isfinite(line["loss"]) for line in lines)
    if "async" in run:
        assert all("async/staleness_max" in line for line in lines)
    if "reward_model_training" in run:  # ref_reset_steps=1: the reward model trained before step 2
        assert "rm_loss" in lines[1], "the reward model did not train"


def _override(key: str, value) -> str:
    return f"{key}={str(value).lower() if isinstance(value, bool) else value}"


@pytest.mark.parametrize("run", [r for r in COVER if any(BY_NAME[n].processes > 1 for n in r)], ids="+".join)
def test_every_torchrun_pair_that_runs_trains_two_steps(run, tmp_path, tiny_model_dir, tiny_dataset, assets):
    """A real `torchrun --nproc-per-node 2 -m grpo train` of two steps with all of ``run``'s features."""
    from tests.test_distributed import _env, _run

    fields = {"model": tiny_model_dir, "task": tiny_dataset, "output_dir": tmp_path / "run", "max_steps": 2,
              "prompts_per_step": 4, "num_generations": 4, "per_device_train_batch_size": 4,
              "max_completion_length": 8, "eval_prompts": 0, "rewards": "tests.rewards_for_tests:digit_share",
              "learning_rate": 1e-3, "bf16": False, "progress": False, "report_to": "none", "reward_timeout": 0,
              "num_threads": 1, **fields_of(run, assets)}
    if "rewards" in fields and fields["rewards"] is None:
        fields.pop("rewards")
    cfg = Config(**{k: str(v) if k in ("model", "task", "output_dir") else v for k, v in fields.items()})
    assert all(BY_NAME[n].on(cfg, 2) for n in run), "the run's switches cannot be written as one config"
    env = _env()
    env.pop("WORLD_SIZE", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "grpo",
           "train", *[_override(k, v) for k, v in fields.items()]]
    proc = _run(cmd, env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    _check_lines(run, [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()])
