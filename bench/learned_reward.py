"""The learned-reward demonstration (seed 001 Algorithm 1, step 4) on this machine: the embedded model
trains on arithmetic twice from the same seed, once on a reward model that learns from the arithmetic
verifier's labels at every iteration boundary, once on the verifier itself; the peer is the verifier run.

The reward model is built from the embedded model's config and weights, cut to its first
``--rm-layers`` layers, with a fresh one-label score head, trained pointwise (or Bradley-Terry with
``--objective pairwise``). Prints, per iteration, the reward model's held-out accuracy and
within-group ranking before/after its update and its agreement with the verifier on the new samples,
and for both runs the verifier's greedy held-out accuracy before -> after, as one JSON object.

    nice -n 10 python bench/learned_reward.py --steps 12 --ref-reset 3 --out /tmp/learned_reward
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def build_reward_model(out: Path, layers: int) -> Path:
    """The embedded model's first ``layers`` layers with a one-label score head, saved with its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    from grpo.models.loading import DEFAULT_MODEL, load_tokenizer, resolve_model_path

    path, folder = out / "reward_model", resolve_model_path(DEFAULT_MODEL)
    cfg = AutoConfig.from_pretrained(folder)
    cfg.num_hidden_layers, cfg.num_labels = layers, 1
    tok = load_tokenizer(folder)
    cfg.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_config(cfg)
    base = AutoModelForCausalLM.from_pretrained(folder).model.state_dict()
    missing, _ = rm.model.load_state_dict({k: v for k, v in base.items() if not k.startswith("layers.")
                                           or int(k.split(".")[1]) < layers}, strict=False)
    assert not missing, missing
    torch.nn.init.normal_(rm.score.weight, std=0.02)
    rm.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def run(out: Path, name: str, **kw) -> dict:
    from grpo.config import Config
    from grpo.models.loading import DEFAULT_MODEL
    from grpo.train.trainer import Trainer

    cfg = Config(model=DEFAULT_MODEL, output_dir=str(out / name), progress=False, report_to="none", **kw)
    t = Trainer(cfg)
    result = t.train()
    lines = [json.loads(x) for x in (t.run_dir / "metrics.jsonl").read_text().splitlines()]
    rm_lines = [{k: v for k, v in x.items() if k.startswith("rm_") and k != "rm_verifier_reward"} | {"step": x["step"]}
                for x in lines if "rm_heldout_accuracy_after" in x]
    return {"eval": {k: result.get(k, {}).get("accuracy") for k in ("before", "after")}, "rm": rm_lines,
            # the verifier's mean on each step's samples: what optimising the reward model really achieved
            "verifier_reward_per_step": [round(x.get("rm_verifier_reward", x.get("rewards/numeric", 0.0)), 3)
                                         for x in lines],
            "seconds": sum(x["step_seconds"] for x in lines)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--ref-reset", type=int, default=3)
    ap.add_argument("--rm-steps", type=int, default=16)
    ap.add_argument("--rm-layers", type=int, default=4)
    ap.add_argument("--objective", default="pointwise", choices=("pointwise", "pairwise"),
                    help="reward_model_objective of the learned reward")
    ap.add_argument("--warmup", type=int, default=6, help="reward_model_warmup_draws (0: the untrained head scores iteration 1)")
    ap.add_argument("--eval", type=int, default=100)
    ap.add_argument("--out", default="/tmp/learned_reward")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = dict(max_steps=args.steps, ref_reset_steps=args.ref_reset, eval_prompts=args.eval, prompts_per_step=4,
                  num_generations=8, per_device_train_batch_size=8, max_completion_length=32, temperature=0.8,
                  learning_rate=3e-5, beta=0.04, eval_pass_k=0, seed=0, log_completions_steps=0)
    rm_path = build_reward_model(out, args.rm_layers)
    learned = run(out, "learned", rewards="reward_model", reward_model=str(rm_path),
                  reward_model_train_steps=args.rm_steps, reward_model_objective=args.objective,
                  reward_model_verifier="numeric", reward_model_heldout=8, reward_model_batch_size=16,
                  reward_model_lr=1e-4, reward_model_warmup_draws=args.warmup, **common)
    verifier = run(out, "verifier", rewards="numeric", **common)
    summary = {"learned_reward": learned, "verifier": verifier, "settings": {**common, **vars(args)}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
