"""An OpenEnv environment (environment_factory=openenv:URL) over its own WebSocket protocol, against a real
OpenEnv server started by the test as a process on loopback: sessions reset and step, the step tool carries
the server's action schema, and a run on the tiny model (taught to make one guess) trains 3 steps with the
environment's rewards."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from grpo.agent.environments import environment_tools, load_factory, new_environment, reset_environment
from grpo.config import Config
from grpo.errors import ConfigError
from tests.conftest import TEST_SEED, import_or_skip_unless_ci

ROOT = Path(__file__).resolve().parents[1]
GUESS = "step(guess=50)"


@pytest.fixture(scope="module")
def server():
    import_or_skip_unless_ci("openenv", "the OpenEnv server package (make test installs openenv --no-deps)")
    import_or_skip_unless_ci("websockets", "the websockets package (the envs extra)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "tests.openenv_server:app", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "the OpenEnv server did not start"
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=20)


def test_a_session_resets_steps_with_the_servers_action_schema_and_adds_its_rewards(server):
    factory = load_factory(f"openenv:{server}")
    env = new_environment(factory)
    assert "Guess my number" in reset_environment(env, {"prompt": "Play.", "seed": 3})
    (tool,) = environment_tools(env)
    assert tool.name == "step" and tool.parameters["properties"]["guess"]["type"] == "integer"
    assert tool.parameters["required"] == ["guess"] and "metadata" not in tool.parameters["properties"]
    import random

    secret = random.Random(3).randint(1, 100)
    assert secret not in (50, 51)
    text = tool.fn(guess=50)
    assert ("too low" if 50 < secret else "too high") in text and "ended" not in text
    assert "ended" in tool.fn(guess=51)  # the server's second guess ends the episode
    with pytest.raises(RuntimeError, match="ended"):
        tool.fn(guess=52)
    assert env.get_reward() == pytest.approx(2 - (abs(50 - secret) + abs(51 - secret)) / 100)  # the steps' sum


def test_no_server_is_an_error_naming_the_field():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConfigError, match="environment_factory"):
        load_factory(f"openenv:http://127.0.0.1:{port}")


def test_a_run_on_an_openenv_server_trains_three_steps_with_its_rewards(server, tmp_path, tiny_model_dir):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": "Play.", "answer": "", "seed": s}) + "\n" for s in range(12)))
    cfg = Config(model=str(tmp_path / "player"), task=str(rows), environment_factory=f"openenv:{server}",
                 rewards="environment", tool_format="python", tool_example_call="none", max_turns=2,
                 output_dir=str(tmp_path / "run"), max_steps=3, num_generations=2, prompts_per_step=2,
                 per_device_train_batch_size=4, max_completion_length=48, eval_prompts=0, learning_rate=1e-3,
                 progress=False, report_to="none", seed=TEST_SEED, rollout_engine="hf", temperature=0.7)
    _teach_to_guess(tiny_model_dir, tmp_path / "player", cfg)
    from grpo.train.trainer import Trainer

    Trainer(cfg).train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3]
    for line in lines:  # the taught model guesses: the rewards are the server's, graded by closeness
        assert line["tools/call_rate"] > 0 and line["reward_failures"] == 0, line
        assert 0 < line["reward_mean"] < 1, line
    assert len({round(line["reward_mean"], 6) for line in lines}) > 1  # seeds differ, secrets differ


def _teach_to_guess(model_dir, out, cfg: Config) -> None:
    """The tiny model learns to write ``step(guess=50)`` after the episode's start and a short answer after
    the server's reply (its contexts built by the run's own sampler, against the running server)."""
    from transformers import AutoTokenizer

    from grpo.agent import AgentSampler
    from grpo.agent.call_base import Call
    from grpo.agent.episodes import result_turn_ids
    from grpo.train.settings import agent_settings
    from tests.teaching import teach

    tok = AutoTokenizer.from_pretrained(model_dir)
    sampler = AgentSampler.from_settings(agent_settings(cfg), tok)
    (ep,), _ = sampler.episodes([{"prompt": "Play.", "seed": 0}], group_size=1, system_prompt="",
                                max_prompt_length=cfg.max_prompt_length, keys=None)
    ep.env.close()
    call = tok(GUESS, add_special_tokens=False)["input_ids"]
    after = ep.prompt + call + result_turn_ids(tok, sampler.fmt, [Call("step", {"guess": 50}, GUESS)],
                                               ["feedback: too low\n(the episode has ended)"])
    teach(model_dir, out, [(ep.prompt, call), (after, tok("Done.", add_special_tokens=False)["input_ids"]
                                                + [tok.eos_token_id])])


def test_a_server_at_capacity_is_an_error_naming_its_limit(server):
    factory = load_factory(f"openenv:{server}")
    envs = []
    try:
        with pytest.raises(ConfigError, match="max_concurrent_envs"):
            for _ in range(70):  # the test server holds 64 sessions
                env = new_environment(factory)
                reset_environment(env, {"seed": 1})
                envs.append(env)
    finally:
        for env in envs:
            env.close()
