"""grpo against TRL's GRPOTrainer on the same work: same model, task, seed and settings.

Each trainer runs in its own subprocess (so their peak RSS is measured apart), one after the other,
on the same prompts in the same order (grpo's seeded draw, given to TRL unshuffled):
B prompts x G completions of up to T new tokens, temperature 0.8, beta 0.04 (k3), TRL's loss_type
"grpo" = our seq_mean_token_mean, AdamW at the same learning rate, constant schedule, fp32, no bf16
autocast, no gradient checkpointing, one optimisation pass per batch (mu = 1). The first
``--warmup`` steps are excluded. Prints: seconds per step (median), generation seconds per step,
generated tokens/s, peak RSS, the ratio grpo/TRL of each, and the mean reward of both over the
measured steps. grpo runs with its defaults otherwise (shared-prefix training, forward passes of at
most max_tokens_per_forward = 1024 tokens, the fast decoding backend); both take one optimizer step
per B x G completions with per_device_train_batch_size = B x G. The last line is the step-time ratio.

Installs nothing: `make bench` installs the `bench` extra (trl) first. Heavy: run it on a quiet machine.

    PYTHONPATH=. python bench/vs_trl.py [--model embedded:SmolLM2-135M-Instruct] [--prompts 1] [--group 8]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

SETTINGS = dict(temperature=0.8, beta=0.04, learning_rate=1e-6, epsilon=0.2)


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is KiB on Linux


def _drawn_samples(a) -> list[dict]:
    """The samples grpo's trainer draws for every step, in its order (its PromptSampler, same seed and
    task settings): TRL is given exactly these, unshuffled, so both train on the same prompts."""
    from grpo.config import Config
    from grpo.data import PromptSampler
    from grpo.train.settings import task_of

    cfg = Config(task="arithmetic", eval_prompts=0, seed=a.seed)
    task = task_of(cfg)
    draw = PromptSampler(len(task.train), seed=cfg.seed).draw(a.prompts * (a.warmup + a.steps))
    return [task.train[i] for i in draw]


def run_grpo(a, out: Path) -> dict:
    from grpo.config import Config
    from grpo.train.trainer import Trainer

    cfg = Config(model=a.model, task="arithmetic", rewards="numeric", num_generations=a.group,
                 prompts_per_step=a.prompts, per_device_train_batch_size=a.prompts * a.group,
                 max_completion_length=a.tokens, max_steps=a.warmup + a.steps, eval_prompts=0, seed=a.seed,
                 output_dir=str(out / "grpo-run"), progress=False, report_to="none", bf16=False, dtype="float32",
                 num_iterations=1, lr_scheduler_type="constant", save_steps=0, log_completions_steps=0,
                 rollout_engine=a.backend, **SETTINGS)
    Trainer(cfg).train()
    lines = [json.loads(line) for line in (out / "grpo-run" / "metrics.jsonl").read_text().splitlines()]
    lines = [line for line in lines if "step_seconds" in line][a.warmup:]
    return {"step": [x["step_seconds"] for x in lines], "gen": [x["generation_seconds"] for x in lines],
            "tokens": [x["completion_length_mean"] * a.prompts * a.group for x in lines],
            "reward": [x["reward_mean"] for x in lines], "backend": lines[0]["rollout_engine"]}


def run_trl(a, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo.models import load_tokenizer, resolve_model_path
    from grpo.rewards.builtin import numeric_reward

    path = resolve_model_path(a.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    rows = [{"prompt": [{"role": "user", "content": s["prompt"]}], "answer": s["answer"]} for s in _drawn_samples(a)]
    rec = {"step": [], "gen": [], "tokens": [], "reward": [], "prompts": []}
    generate = model.generate

    def timed_generate(*args, **kwargs):  # TRL's generation time: every call of the policy's generate
        t = time.perf_counter()
        res = generate(*args, **kwargs)
        rec["gen"][-1] += time.perf_counter() - t
        return res

    model.generate = timed_generate

    def reward(prompts, completions, answer, **kw):
        # one per prompt: checked against grpo's draw below
        rec["prompts"].extend(p[-1]["content"] if isinstance(p, list) else p for p in prompts[::a.group])
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        scores = [float(numeric_reward(t, {"answer": x})) for t, x in zip(texts, answer)]
        rec["reward"].append(statistics.mean(scores))
        return scores

    class Clock(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            rec["gen"].append(0.0)
            self.t0 = time.perf_counter()

        def on_step_end(self, *args, **kwargs):
            rec["step"].append(time.perf_counter() - self.t0)

    args = GRPOConfig(output_dir=str(out / "trl-run"), per_device_train_batch_size=a.prompts * a.group,
                      num_generations=a.group, max_completion_length=a.tokens, loss_type="grpo",
                      max_steps=a.warmup + a.steps, lr_scheduler_type="constant", optim="adamw_torch",
                      gradient_checkpointing=False, bf16=False, use_cpu=True, seed=a.seed, logging_steps=1,
                      report_to="none", save_strategy="no", num_iterations=1, top_p=1.0, top_k=0,
                      shuffle_dataset=False, **SETTINGS)
    tok = load_tokenizer(path)
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tok, callbacks=[Clock()])
    trainer.train()
    n = a.warmup
    lengths = [x["completions/mean_length"] for x in trainer.state.log_history if "completions/mean_length" in x]
    same = rec["prompts"] == [r["prompt"][-1]["content"] for r in rows]
    return {"same_prompts": same, "step": rec["step"][n:], "gen": rec["gen"][n:], "reward": rec["reward"][n:],
            "tokens": [x * a.prompts * a.group for x in lengths][n:], "backend": "trl"}


def child(a) -> None:
    out = Path(a.out)
    res = (run_trl if a.run == "trl" else run_grpo)(a, out)
    res["rss_gib"] = _rss_gib()
    (out / f"{a.run}.json").write_text(json.dumps(res))


def table(trl: dict, ours: dict) -> list[str]:
    def med(x):
        return statistics.median(x) if x else float("nan")

    rows = [("seconds per step (median)", med(trl["step"]), med(ours["step"])),
            ("generation seconds per step", med(trl["gen"]), med(ours["gen"])),
            ("generated tokens/s", sum(trl["tokens"]) / sum(trl["gen"]), sum(ours["tokens"]) / sum(ours["gen"])),
            ("peak RSS (GiB)", trl["rss_gib"], ours["rss_gib"])]
    lines = [f"| | TRL | grpo ({ours['backend']}) | grpo/TRL |", "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {t:.3f} | {o:.3f} | {o / t:.2f} |" for name, t, o in rows]
    lines.append(f"mean reward over the measured steps: TRL {statistics.mean(trl['reward']):.3f}, "
                 f"grpo {statistics.mean(ours['reward']):.3f}")
    lines.append(f"TRL trained on grpo's prompts, in grpo's order: {trl['same_prompts']}")
    lines.append(f"step-time ratio grpo/TRL: {med(ours['step']) / med(trl['step']):.3f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded:SmolLM2-135M-Instruct")
    ap.add_argument("--prompts", type=int, default=1, help="B prompts per step")
    ap.add_argument("--group", type=int, default=8, help="G completions per prompt")
    ap.add_argument("--tokens", type=int, default=64, help="most new tokens per completion")
    ap.add_argument("--steps", type=int, default=3, help="measured steps")
    ap.add_argument("--warmup", type=int, default=1, help="steps excluded at the start")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="auto", help="grpo's rollout_engine")
    ap.add_argument("--out", default="bench/out")
    ap.add_argument("--run", choices=("trl", "grpo"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run:
        return child(a)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    res = {}
    for name in ("trl", "grpo"):
        shutil.rmtree(Path(a.out) / f"{name}-run", ignore_errors=True)  # the previous invocation's scratch run
        subprocess.run([sys.executable, __file__, *sys.argv[1:], "--run", name], check=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]),
                                                                                     os.environ.get("PYTHONPATH")]))})
        res[name] = json.loads((Path(a.out) / f"{name}.json").read_text())
    print(f"{a.prompts} prompts x {a.group} completions, {a.tokens} new tokens, {a.steps} measured steps "
          f"after {a.warmup} warm-up, model {a.model}, load average {os.getloadavg()}")
    print("\n".join(table(res["trl"], res["grpo"])))


if __name__ == "__main__":
    main()
