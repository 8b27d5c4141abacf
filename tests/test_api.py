"""The Python API, shaped as TRL's: a TRL-style script's objects (a datasets.Dataset, reward callables
of TRL's form, TRL's config names) train as `grpo train` does, and the run folder repeats on the CLI."""

from __future__ import annotations

import json

import pytest

import grpo
from grpo.cli import main
from grpo.errors import ConfigError
from tests.conftest import TEST_BF16, TEST_SEED
from tests.test_cli import _no_clock

ROWS = [{"prompt": f"What is {a} + {b}?", "solution": str(a + b)} for a in range(1, 7) for b in range(1, 5)]


def solution_digits(completions, solution, **kwargs):
    """TRL's form, reading a dataset column by name."""
    return [sum(ch in s for ch in c) / max(len(c), 1) for c, s in zip(completions, solution)]


def _args(run, **kw):
    return grpo.GRPOConfig(**{**dict(output_dir=str(run), max_steps=2, num_generations=4, per_device_train_batch_size=4,
                                     gradient_accumulation_steps=2, max_completion_length=6, eval_prompts=4,
                                     eval_max_new_tokens=4, eval_pass_k=0, logging_steps=1, report_to="none",
                                     disable_tqdm=True, learning_rate=1e-2, seed=TEST_SEED, bf16=TEST_BF16,
                                     push_to_hub=False), **kw})


def test_a_trl_style_script_trains_and_its_run_repeats_on_the_command_line(tmp_path, tiny_model_dir, capsys):
    from datasets import Dataset

    run = tmp_path / "api"
    trainer = grpo.GRPOTrainer(model=str(tiny_model_dir), reward_funcs=[solution_digits], args=_args(run),
                               train_dataset=Dataset.from_list(ROWS))
    result = trainer.train()
    assert result["n_prompts"] == 4 and "after" in result
    cfg = trainer.args
    assert (cfg.prompts_per_step, cfg.mini_batches) == (2, 1)  # 4 completions x 2 accumulation steps / 4 per group
    assert cfg.rewards == "tests.test_api:solution_digits" and cfg.task == str(run / "train_dataset.jsonl")
    assert [json.loads(l) for l in (run / "train_dataset.jsonl").read_text().splitlines()] == ROWS
    # the same run from its config.yaml on the command line: the same metrics, samples and evaluation
    again = tmp_path / "cli"
    assert main(["train", "--config", str(run / "config.yaml"), f"output_dir={again}"]) == 0
    capsys.readouterr()
    lines = lambda r: [_no_clock(json.loads(l)) for l in (r / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert [m["step"] for m in lines(run)] == [1, 2] and lines(again) == lines(run)
    assert (again / "samples.jsonl").read_text() == (run / "samples.jsonl").read_text()
    assert main(["eval", "--model", str(run)]) == 0  # evaluates on the run's own held-out rows
    assert json.loads(capsys.readouterr().out)["accuracy"] == result["after"]["accuracy"]


def test_objects_handed_over(tmp_path, tiny_model_dir):
    """A list of dicts, an eval_dataset, a lambda (run in this process, named by itself), a peft
    LoraConfig, grpo's own config names."""
    from peft import LoraConfig

    run = tmp_path / "r"
    held = [{"prompt": "What is 9 + 9?", "solution": "18"}] * 3
    t = grpo.GRPOTrainer(model=str(tiny_model_dir), reward_funcs=[lambda completions, **kw: [1.0] * len(completions)],
                         args=_args(run, max_steps=1), train_dataset=ROWS, eval_dataset=held,
                         peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    assert t.args.rewards == "<lambda>" and t.args.use_peft and t.args.lora_target_modules == "q_proj,v_proj"
    assert len(t.task.train) == len(ROWS) and t.task.eval == held and t.args.task == "train_dataset"
    out = t.train()
    assert out["n_prompts"] == 3 and out["after"]["accuracy"] == 1.0  # the lambda rewards every completion
    saved = t.save_model(str(run))  # as TRL scripts call it: the run folder's final/, LoRA merged
    assert saved == run / "final" and (saved / "config.json").is_file() and not (saved / "adapter_config.json").exists()


def test_what_grpo_does_not_take_is_refused_by_name(tmp_path, tiny_model_dir):
    args = _args(tmp_path / "x", max_steps=1)
    with pytest.raises(ConfigError, match=r"^callbacks: not taken by grpo's trainer"):
        grpo.GRPOTrainer(model=str(tiny_model_dir), reward_funcs=solution_digits, args=args, train_dataset=ROWS,
                         callbacks=[object()])
    with pytest.raises(ConfigError, match=r"^model: give the model's hub id or folder"):
        grpo.GRPOTrainer(model=object(), reward_funcs=solution_digits, args=args, train_dataset=ROWS)
    with pytest.raises(ConfigError, match=r"^num_train_epochs: must be > 0"):
        grpo.GRPOConfig(num_train_epochs=0)
    with pytest.raises(ConfigError, match=r"^tools: .* must be a module-level function"):
        grpo.GRPOTrainer(model=str(tiny_model_dir), reward_funcs=solution_digits, args=args, train_dataset=ROWS,
                         tools=[lambda x: x])
    assert grpo.GRPOConfig is grpo.api.GRPOConfig and grpo.Config is grpo.config.Config
