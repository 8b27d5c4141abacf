"""grpo.pathtracking: the path-tracking environment against hand-computed steps, the group baseline by hand,
TRPO's trust region, short training runs, saved policies, and the CLI."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("gymnasium")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from gymnasium.utils.env_checker import check_env  # noqa: E402

from grpo.pathtracking.agents import ControllerSettings, group_advantages, make_agent, settings_from  # noqa: E402
from grpo.pathtracking.env import (BAND, DT, SPEED, STEER_DEG, WHEELBASE, PathTrackingEnv,  # noqa: E402
                              bicycle_step)
from grpo.pathtracking.evaluate import evaluate, proportional_controller  # noqa: E402
from grpo.pathtracking.nets import PolicyNet, load_policy, save_policy  # noqa: E402
from grpo.pathtracking.paths import Scenario, held_out_scenarios, make_path, max_curvature, random_path  # noqa: E402
from grpo.pathtracking.rollout import policy_controller  # noqa: E402
from grpo.pathtracking.trpo import conjugate_gradient, trpo_step  # noqa: E402
from grpo.errors import CheckpointError, ConfigError  # noqa: E402


def test_seventeen_preset_angles_and_documented_constants():
    assert len(STEER_DEG) == 17 and STEER_DEG[0] == -24 and STEER_DEG[8] == 0 and STEER_DEG[-1] == 24
    assert (SPEED, WHEELBASE, DT, BAND) == (5.0, 2.5, 0.1, 2.0)


def test_bicycle_step_by_hand():
    d = math.radians(12)
    x, y, psi = bicycle_step(0.0, 0.0, 0.0, d)
    assert (x, y) == (0.5, 0.0) and psi == pytest.approx(0.2 * math.tan(d), abs=1e-15)  # v/L dt = 5/2.5*0.1
    x2, y2, psi2 = bicycle_step(x, y, psi, d)
    assert x2 == pytest.approx(0.5 + 0.5 * math.cos(psi), abs=1e-15)
    assert y2 == pytest.approx(0.5 * math.sin(psi), abs=1e-15)
    assert psi2 == pytest.approx(2 * 0.2 * math.tan(d), abs=1e-15)


def test_env_step_on_a_straight_path_by_hand():
    env = PathTrackingEnv()
    obs, _ = env.reset(options={"scenario": Scenario(make_path("straight"), 0.5, 0.1)})
    np.testing.assert_allclose(obs, [0.5 / 2.0, 0.1 / (math.pi / 2)], rtol=1e-6)
    obs, r, term, trunc, info = env.step(STEER_DEG.index(0))
    y = 0.5 + 0.5 * math.sin(0.1)  # lateral error = y on the x axis; heading unchanged at 0 steering
    assert info["lateral_error"] == pytest.approx(y, abs=1e-12)
    np.testing.assert_allclose(obs, [y / 2.0, 0.1 / (math.pi / 2)], rtol=1e-6)
    assert r == pytest.approx(0.6 * (1 - y / 2.0) + 0.4 * math.cos(0.1), abs=1e-12)
    assert not term and not trunc
    obs, r, *_ = env.step(STEER_DEG.index(24))  # full left: the steering penalty is its whole 0.1
    psi = 0.1 + 0.2 * math.tan(math.radians(24))
    y2 = y + 0.5 * math.sin(0.1)
    assert r == pytest.approx(0.6 * (1 - y2 / 2) + 0.4 * math.cos(psi) - 0.1, abs=1e-12)


def test_lateral_error_on_an_arc_matches_the_circle():
    k = 0.05
    env = PathTrackingEnv()
    env.reset(options={"scenario": Scenario(make_path("arc", curvature=k), 0.3, 0.0)})
    for _ in range(20):
        *_, info = env.step(STEER_DEG.index(3))
        exact = 1 / k - math.hypot(env.x, env.y - 1 / k)  # positive on the inside (left) of a left turn
        assert info["lateral_error"] == pytest.approx(exact, abs=2e-3)  # polyline chords 0.2 m apart


def test_episode_ends_at_the_path_end_and_outside_the_band():
    env = PathTrackingEnv()
    env.reset(options={"scenario": Scenario(make_path("straight"), 0.0, 0.0)})
    total, steps = 0.0, 0
    while True:
        _, r, term, trunc, info = env.step(STEER_DEG.index(0))
        total, steps = total + r, steps + 1
        if term or trunc:
            break
    assert term and info["completed"] and steps in (100, 101)  # 50 m at 0.5 m a step
    assert total == pytest.approx(steps, abs=1e-9)  # 1 a step on the line
    env.reset(options={"scenario": Scenario(make_path("straight"), 1.5, 0.0)})
    for i in range(10):
        _, _, term, _, info = env.step(STEER_DEG.index(24))
        if term:
            break
    assert term and not info["completed"] and abs(info["lateral_error"]) > BAND


def test_env_checker_and_registered_id():
    check_env(PathTrackingEnv())
    env = gym.make("grpo/PathTracking-v0")
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs) and env.action_space.n == 17


def test_paths_can_be_tracked():
    limit = math.tan(math.radians(24)) / WHEELBASE
    rng = np.random.default_rng(0)
    assert all(max_curvature(random_path(rng)) < limit for _ in range(50))
    held = held_out_scenarios()
    assert {s.path.family for s in held} == {"straight", "arc", "sine", "lane_change"}
    assert all(abs(s.path.length - 50.0) < 1e-9 for s in held)


def test_group_baseline_by_hand():
    rewards = torch.tensor([[1.0, 2.0], [1.0, 0.0], [2.0, 3.0], [4.0, 1.0]])  # [N, T], two groups of two
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    out = group_advantages(rewards, mask, group_size=2, variant="outcome")
    # returns 3, 1 (mean 2) and 5, 5 (mean 5)
    torch.testing.assert_close(out, torch.tensor([[1.0, 1.0], [-1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))
    step = group_advantages(rewards, mask, group_size=2, variant="step")
    # returns-to-go: [3, 2], [1, 0(ended)] -> means 2, 1; [5, 3], [5, 1] -> means 5, 2
    torch.testing.assert_close(step, torch.tensor([[1.0, 1.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]]))


def test_conjugate_gradient_solves_a_small_system():
    a = torch.tensor([[4.0, 1.0, 0.0], [1.0, 3.0, 0.5], [0.0, 0.5, 2.0]], dtype=torch.float64)
    b = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    torch.testing.assert_close(conjugate_gradient(lambda v: a @ v, b, iters=3), torch.linalg.solve(a, b))


@pytest.mark.parametrize("max_kl", [0.001, 0.01, 0.05])
def test_trpo_step_stays_inside_its_kl_bound(max_kl):
    torch.manual_seed(0)
    policy = PolicyNet()
    obs = torch.rand(512, 2) * 2 - 1  # [M, 2]
    with torch.no_grad():
        old = torch.log_softmax(policy(obs), -1)  # [M, A]
    actions = torch.multinomial(old.exp(), 1)[:, 0]
    adv = -obs[:, 0] * (actions.float() - 8) / 8  # steering against the lateral error is good
    adv = (adv - adv.mean()) / adv.std()

    def surrogate():
        with torch.no_grad():
            lp = torch.log_softmax(policy(obs), -1).gather(1, actions[:, None])[:, 0]
            return float((torch.exp(lp - old.gather(1, actions[:, None])[:, 0]) * adv).mean())

    before = surrogate()
    step = trpo_step(policy, obs, actions, adv, max_kl=max_kl)
    with torch.no_grad():
        kl = float((old.exp() * (old - torch.log_softmax(policy(obs), -1))).sum(-1).mean())
    assert step.accepted and kl <= max_kl and kl == pytest.approx(step.kl, rel=1e-4)
    assert kl > max_kl / 50  # it moved: the step is scaled to the region's edge before any halving
    assert surrogate() > before


def _eval_return(policy) -> float:
    return evaluate(policy_controller(policy, greedy=True)).mean_return


@pytest.fixture
def one_thread():
    """One torch thread, as each worker of grpo.pathtracking.compare trains; the tests after get theirs back."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("algo", ["grpo", "grpo_step", "ppo", "trpo"])
def test_a_short_run_improves_the_return(algo, one_thread):
    # a larger step than the defaults, so 6,000 env steps suffice; GRPO with the z-scored group
    # baseline, whose step size does not depend on the scale of the returns
    s = ControllerSettings(seed=0, lr=3e-3, max_kl=0.05, group_size=4, groups=4, batch_episodes=16, estimator="grpo",
                      log_every=10**9)
    agent = make_agent(algo, s, log=lambda *_: None)
    before = _eval_return(agent.policy)  # greedy on the held-out scenarios: an untrained policy leaves the lane
    agent.train(env_steps=6000)
    after = _eval_return(agent.policy)
    assert after > before + 25, (before, after)


def test_saved_policy_reloads_with_the_same_actions(tmp_path):
    torch.manual_seed(1)
    policy = PolicyNet()
    path = save_policy(policy, tmp_path / "p.pt", algo="grpo")
    again = load_policy(path)
    obs = torch.rand(64, 2) * 2 - 1
    assert torch.equal(policy.act(obs, greedy=True), again.act(obs, greedy=True))
    torch.testing.assert_close(policy(obs), again(obs), rtol=0, atol=0)
    blob = torch.load(path, weights_only=True)
    assert set(blob) == {"state_dict", "obs_dim", "n_actions", "algo"}  # the policy alone
    assert not any(k.startswith("critic") for k in blob["state_dict"])
    (tmp_path / "bad.pt").write_text("no")
    with pytest.raises(CheckpointError, match="bad.pt"):
        load_policy(tmp_path / "bad.pt")


def test_proportional_controller_tracks_a_straight_path():
    res = evaluate(proportional_controller(2.0, 4.0), [Scenario(make_path("straight"), 1.0, 0.0)])
    assert res.completion == 1.0 and res.rms_lateral < 0.5


def test_settings_from_rejects_unknown_keys():
    assert settings_from({"lr": "1e-3", "epochs": "2"}).epochs == 2
    with pytest.raises(ConfigError, match="valid"):
        settings_from({"learning_rate": "1"})
    with pytest.raises(ConfigError, match="unknown control algorithm"):
        make_agent("dqn", ControllerSettings())


def test_cli_train_saves_a_policy_that_reloads(tmp_path, capsys):
    from grpo.cli import main

    out = tmp_path / "ppo.pt"
    assert main(["control", "train", "--algo", "ppo", "--env-steps", "300", "--out", str(out), "batch_episodes=4"]) == 0
    assert "policy saved" in capsys.readouterr().out
    assert load_policy(out).n_actions == 17
    assert main(["control", "train", "--algo", "ppo", "nope=1"]) == 2


def _run(algo, seed, ret, rms, curve, reached=None):
    from grpo.pathtracking.compare import SeedResult

    return SeedResult(algo, seed, ret, rms, 1.0, reached, ret, 1.0, 10, 0, 100.0, curve[-1][0], curve,
                     [(0.0, 0.0), (1.0, 0.1)])


def test_steps_to_threshold_by_hand():
    from grpo.pathtracking.compare import steps_to

    curve = [(10, 1.0), (20, 3.0), (30, 5.0), (40, 9.0)]
    assert steps_to(curve, 4.0, window=2) == 30  # running means 2, 4, 7
    assert steps_to(curve, 7.5, window=2) is None
    assert steps_to(curve, 1.0, window=1) == 10


def test_compare_table_and_verdicts():
    """The table's mean ± spread and the acceptance lines (the plots are left to `grpo control compare`:
    matplotlib alone costs more than this file's budget on a contended CPU)."""
    from grpo.pathtracking.compare import Baseline, table, verdicts

    curve = [(i * 100, float(i)) for i in range(1, 40)]
    runs = [_run("ppo", s, 90.0 + s, 0.2, curve, 1000 * (s + 1)) for s in range(2)]
    runs.append(_run("sb3_ppo", 0, 100.0, 0.1, curve))
    base = Baseline(1.0, 2.0, 95.0, 0.15, 1.0, [(0.0, 0.0), (1.0, 0.0)])
    text = table(runs, base, threshold=20.0) + "\n".join(verdicts(runs, base))
    assert "| ppo (2 seeds) | 90.50 ± 0.50 |" in text
    assert "ppo reaches 90.5% of sb3_ppo's mean held-out return" in text and "at least 90%" in text
    assert "ppo: mean RMS lateral error 0.200 m vs proportional 0.150 m: does NOT beat it, worse by 0.050 m" in text
    assert "sb3_ppo: mean RMS lateral error 0.100 m vs proportional 0.150 m: beats it by 0.050 m" in text
    assert "| 1500 ± 500 (2/2 reached) |" in text and "| not reached (0/1) |" in text
