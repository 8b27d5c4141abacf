"""Agent programs (agent=module:function) on the tiny model: the program's calls go through the real
openai client to grpo's recording endpoint on loopback; the episode is one sample whose recorded
log-probs are the trainer's; a whole run trains, logs the calls and its report shows them."""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch

from grpo.agent.programs import ProgramSampler
from grpo.config import Config
from grpo.rollout import make_engine
from grpo.rollout.engine import SamplingSettings
from grpo.rollout.keys import row_keys
from grpo.train.forwards import Forwards
from grpo.train.trainer import Trainer
from tests.agent_programs import ask_then_compute
from tests.conftest import TEST_SEED, build_tiny_model, build_tokenizer

pytest.importorskip("openai")

ROWS = [{"prompt": "What is 2 + 3?", "answer": "5"}, {"prompt": "What is 4 * 2?", "answer": "8"}]


@pytest.fixture(scope="module")
def sampled():
    tok = build_tokenizer()
    model = build_tiny_model(len(tok), seed=TEST_SEED, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    model.generation_config.eos_token_id = tok.eos_token_id
    sampler = ProgramSampler(tok, ask_then_compute, max_turns=4, timeout=60.0)
    engine = make_engine("fast", model, tok, kernels="mkl")
    try:
        ro = sampler.generate(engine, ROWS, group_size=2, keys=row_keys(TEST_SEED, 1, 0, 4), with_logprobs=True,
                              sampling=SamplingSettings(max_new_tokens=160, temperature=1.0, max_prompt_length=256))
        again = sampler.generate(engine, ROWS, group_size=2, keys=row_keys(TEST_SEED, 1, 0, 4), with_logprobs=True,
                                 sampling=SamplingSettings(max_new_tokens=160, temperature=1.0, max_prompt_length=256))
        yield tok, model, sampler, ro, again
    finally:
        engine.close()
        sampler.close()


def test_each_episode_is_one_sample_with_both_calls_and_the_turn_between(sampled):
    tok, _, sampler, ro, again = sampled
    ro.check()
    assert all(len(e["agent_calls"]) == 2 and not e["agent_error"] for e in ro.episodes), ro.episodes
    for i, info in enumerate(ro.episodes):
        n = int(ro.completion_mask[i].sum())
        trained = ro.loss_mask[i, :n]
        # the first reply (trained), the turn with the tool's result (read only), the second reply (trained)
        assert trained[0] == 1 and trained[-1] == 1 and (trained == 0).any()
        second = info["agent_calls"][1]["messages"]
        assert "The calculator says" in second[-1]["content"] and second[-2]["content"] == info["agent_calls"][0]["reply"]
        assert info["agent_reward"] in (0.0, 1.0)
    # the episode's tokens depend on its keys alone
    assert torch.equal(ro.completion_ids, again.completion_ids) and ro.texts == again.texts
    assert sampler.last_metrics["agent/calls_per_episode"] == 2.0


def test_the_recorded_logprobs_are_the_trainers_for_the_same_tokens(sampled):
    _, model, _, ro, _ = sampled
    fw = Forwards(group_size=2, share_prompt=False, attn_implementation="sdpa", autocast=False, max_tokens=0,
                  sharded=False, tied_grad_in_place=False)
    with torch.no_grad():
        logp = fw.logprobs(model, ro, torch.arange(ro.completion_ids.shape[0]), temperature=1.0)["logp"]  # [N, T]
    mask = ro.loss_mask.bool()
    assert mask.sum() > 0
    torch.testing.assert_close(ro.sampling_logp[mask], logp[mask], atol=1e-4, rtol=0)


def test_the_endpoint_refuses_what_it_cannot_record_and_unknown_episodes(sampled):
    _, _, sampler, _, _ = sampled
    base = sampler._serve()

    def post(path, body, key=sampler.key):
        req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    msgs = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
    for field, value in (("stream", True), ("tools", [{"type": "function"}]), ("n", 2), ("temperature", 0.3),
                         ("top_p", 0.5), ("max_tokens", 0)):
        status, body = post("/e/nobody/v1/chat/completions", {**msgs, field: value})
        assert status == 400 and body["error"]["field"] == field, (field, body)
    req = urllib.request.Request(base + "/e/nobody/v1/chat/completions", data=b"{not json", method="POST",
                                 headers={"Authorization": f"Bearer {sampler.key}", "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("malformed JSON was answered 200")
    except urllib.error.HTTPError as e:
        assert e.code == 400
    # and it keeps serving after them
    assert post("/e/nobody/v1/chat/completions", msgs)[0] == 404
    assert post("/e/nobody/v1/chat/completions", msgs, key="wrong")[0] == 401
    assert post("/v1/chat/completions", msgs)[0] == 404


def test_an_agent_program_run_trains_five_steps_and_logs_its_calls(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    cfg = Config(model=str(tiny_model_dir), task=str(_rows(tmp_path)), agent="tests.agent_programs:ask_then_compute",
                 rewards="agent", output_dir=str(run), max_steps=5, num_generations=2, prompts_per_step=2,
                 per_device_train_batch_size=4, max_completion_length=64, max_turns=3, eval_prompts=0,
                 learning_rate=1e-3, progress=False, report_to="none", seed=TEST_SEED, rollout_engine="fast",
                 log_completions_steps=1)
    Trainer(cfg).train()
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5]
    assert all(line["agent/calls_per_episode"] == 2.0 for line in lines), lines
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    logged = [s for s in samples if s.get("transcript")]
    assert logged and all("The calculator says" in json.dumps(s["transcript"]) for s in logged)
    from grpo.commands.report import main as report

    report([str(run), "--out", str(tmp_path / "report")])
    assert "The calculator says" in (tmp_path / "report" / "report.html").read_text()


def _rows(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                            for a in range(1, 5) for b in range(1, 4)))
    return path
