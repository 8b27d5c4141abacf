"""`grpo serve --completeness auto` picks a check the run's own answers pass: measured at start-up on its
held-out prompts, so a run trained on a user's reward is not sent wholesale to the fallback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo.cli import main
from grpo.serve.bench import free_port, wait_healthy
from grpo.serve.engines import Generation
from grpo.serve.scheme import Scheme, choose_completeness
from tests.conftest import TEST_SEED, build_tokenizer
from tests.hostile import request

ROOT = Path(__file__).resolve().parents[1]
KEY = "completeness-key"


def _gens(texts, finish="stop"):
    return [Generation(t, 4, finish, 0.0) for t in texts]


def test_the_check_most_of_the_runs_answers_pass_is_chosen():
    samples = [{"prompt": "q", "answer": None}] * 4
    stated = choose_completeness(_gens(["6 times 7 is 42."] * 4), samples, Scheme(), "markers")
    assert (stated.name, stated.passed) == ("final_answer", {"markers": 0, "final_answer": 4, "ended": 4})
    concluded = choose_completeness(_gens(["Therefore, yes."] * 3 + ["So 42."]), samples, Scheme(), "final_answer")
    assert concluded.name == "markers"  # 3 of 4 against the rule's 1 of 4
    tie = choose_completeness(_gens(["Therefore the answer is 42."] * 4), samples, Scheme(), "markers")
    assert tie.name == "markers"  # both pass all: the rule's choice
    neither = choose_completeness(_gens(["qzx wv", "", "hm", "ok"]), samples, Scheme(), "final_answer")
    assert neither.name == "ended" and "pass no content check" in neither.describe()
    capped = choose_completeness(_gens(["42"] * 4, finish="length"), samples, Scheme(), "final_answer")
    assert capped.passed["final_answer"] == 0  # an answer cut at the cap passes nothing


def scripted_model_dir(path: Path, answer: str = "42") -> Path:
    """A tiny Llama that answers ``answer`` then EOS to any chat prompt: its layers add nothing (zero
    output projections), so each next token is read from the current one's embedding alone, chained
    from the generation prompt's last token through the answer's characters to EOS."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer()
    chain = [tok.convert_tokens_to_ids(t) for t in tok.tokenize("\n" + answer)] + [tok.eos_token_id]
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in [model.model.norm] + [m for layer in model.model.layers for m in
                                          (layer.input_layernorm, layer.post_attention_layernorm)]:
            norm.weight.fill_(1.0)
        for i, (now, nxt) in enumerate(zip(chain, chain[1:])):
            model.model.embed_tokens.weight[now, i] = 1.0
            model.lm_head.weight[nxt, i] = 10.0
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def last_number_run(tmp_path_factory):
    """A run folder trained (at learning rate 0: the scripted answers stay) with a user's reward that
    reads the last number: rewards a closing-words check knows nothing of."""
    root = tmp_path_factory.mktemp("completeness-run")
    model = scripted_model_dir(root / "model")
    task = root / "products.jsonl"
    task.write_text("".join(json.dumps({"question": f"What is {a} times {b}?", "answer": str(a * b)}) + "\n"
                            for a in range(2, 8) for b in range(2, 8)))
    run = root / "run"
    assert main(["train", f"model={model}", f"task={task}", "prompt_field=question", f"output_dir={run}",
                 "rewards=tests.rewards_for_tests:last_number", "max_steps=1", "num_generations=2",
                 "prompts_per_step=2", "learning_rate=0", "eval_prompts=8", "eval_pass_k=0", "progress=false",
                 "report_to=none", "bf16=false", f"seed={TEST_SEED}"]) == 0
    examples = json.loads((run / "eval.json").read_text())["after"]["examples"]
    assert examples and all(ex["completion"] == "42" for ex in examples)  # the scripted answer, untrained
    return run


def test_serve_answers_a_user_reward_run_as_itself(last_number_run):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "grpo", "serve", str(last_number_run), "--port", str(port),
                             "--fallback", "base", "--deadline", "30", "--max-batch", "2"],
                            env={**os.environ, "PYTHONPATH": str(ROOT), "GRPO_SERVE_API_KEY": KEY},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=300, name="grpo serve", log="its stderr",
                            headers={"Authorization": f"Bearer {KEY}"})
        from grpo.config.io import load_config
        from grpo.train.settings import task_of

        held_out = task_of(load_config(last_number_run / "config.yaml")).eval
        assert len(held_out) == 8
        by = []
        for row in held_out:  # one at a time: c=1
            body = {"model": "grpo", "max_tokens": 16, "messages": [{"role": "user", "content": row["prompt"]}]}
            got = request(port, "POST", "/v1/chat/completions", json.dumps(body).encode(), key=KEY, timeout=60)
            assert got.status == 200
            by.append((got.body["answered_by"], got.body["choices"][0]["message"]["content"]))
        assert by == [("grpo", "42")] * 8
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    assert "completeness check final_answer (auto, measured on 8 held-out answers: markers 0/8, final_answer 8/8" in err
    assert "completeness check final_answer;" in out
