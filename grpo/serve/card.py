"""The model card ``grpo export`` writes beside the weights: a README.md whose YAML header is the Hugging
Face Hub's model metadata (huggingface_hub's ``ModelCardData``: base model, library, tags, datasets) and
whose text states how the model was trained (the rewards, the key settings) and its held-out evaluation
before and after training, with the machine and date it was measured on."""

from __future__ import annotations

import json
import re
from pathlib import Path

EMBEDDED_HUB_ID = {"embedded:SmolLM2-135M-Instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
CONFIG_COPY = "grpo_config.yaml"  # the run's config.yaml, copied beside the card
HUB_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # owner/name: a name the Hub's metadata takes
# the settings a reader needs to know what was optimised, in this order (the rest: config.yaml of the run)
KEY_SETTINGS = ("recipe", "task", "rewards", "advantage_estimator", "policy_loss", "aggregation",
                "importance_sampling_level", "epsilon", "epsilon_high", "beta", "num_generations", "prompts_per_step",
                "max_completion_length", "temperature", "learning_rate", "max_steps", "use_peft", "lora_r",
                "load_in_4bit", "dynamic_sampling", "supervision", "seed")


def hub_id(name: str) -> str | None:
    """The Hub repository a model or dataset name stands for, or None (a local folder or file)."""
    if name in EMBEDDED_HUB_ID:
        return EMBEDDED_HUB_ID[name]
    if Path(name).expanduser().exists() or not HUB_REPO.fullmatch(name):
        return None
    return name


def _evaluation(run: Path | None) -> list[str]:
    path = None if run is None else run / "eval.json"
    if path is None or not path.is_file():
        return ["No held-out evaluation was recorded for this model."]
    ev = json.loads(path.read_text())
    rows = [(when, ev[when]) for when in ("before", "after") if isinstance(ev.get(when), dict)]
    if not rows:
        return ["No held-out evaluation was recorded for this model (eval_prompts=0)."]
    k = next((r.get("k") for _, r in rows if r.get("k")), 0)
    head = "| | accuracy (greedy) |" + (f" pass@{k} |" if k else "") + " prompts | mean length (tokens) | measured on |"
    out = [head, "|---|---|" + ("---|" if k else "") + "---|---|---|"]
    for when, r in rows:
        cells = [f"{when} training", f"{r.get('accuracy', float('nan')):.3f}"]
        if k:
            cells.append("" if r.get("pass@k") is None else f"{r['pass@k']:.3f}")
        cells += [str(r.get("prompts_scored", r.get("n_prompts", ""))), f"{r.get('mean_length', float('nan')):.1f}",
                  _machine(r.get("measured_on") or {})]
        out.append("| " + " | ".join(cells) + " |")
    return out


def _machine(m: dict) -> str:
    """Where and when an evaluation ran: the accelerator or the CPU with its vector class, torch, UTC time."""
    if not m:
        return "not recorded"
    where = m.get("accelerator") or f"{m.get('cpu')} ({m.get('isa')}, {m.get('cores')} cores)"
    return _cell(f"{where}, torch {m.get('torch')}, {m.get('utc')} UTC")


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def model_card(*, name: str, base: str, run: Path | None, settings: dict | None, formats: list[str],
               extra_tags: tuple[str, ...] = ()) -> str:
    """The README.md text: the Hub metadata header, then the training summary and the evaluation."""
    from huggingface_hub import ModelCardData

    settings = settings or {}
    task = str(settings.get("task", ""))
    dataset = hub_id(task) if task and "/" in task else None
    base_id = hub_id(base)
    tags = ["grpo", "reinforcement-learning", "rlvr", *formats, *extra_tags]
    data = ModelCardData(base_model=base_id, library_name="transformers" if "transformers" in formats else None,
                         pipeline_tag="text-generation", tags=tags, datasets=[dataset] if dataset else None)
    lines = ["---", data.to_yaml(), "---", "", f"# {name}", "",
             f"Fine-tuned from `{base_id or base}` with Group Relative Policy Optimization (GRPO; Shao et al. "
             "2024, [arXiv 2402.03300](https://arxiv.org/abs/2402.03300)), reinforcement learning from verifiable "
             "rewards, with the `grpo` library.", ""]
    if settings:
        lines += ["## Training", "", "| setting | value |", "|---|---|"]
        lines += [f"| `{k}` | {_cell(settings[k])} |" for k in KEY_SETTINGS if k in settings and settings[k] not in ("", None)]
        lines += ["", f"The whole configuration is `{CONFIG_COPY}` beside this card.", ""]
    lines += ["## Evaluation on held-out prompts", "", *_evaluation(run), ""]
    lines += ["## Files", ""] + [f"- {f}" for f in _file_notes(formats)] + [""]
    return "\n".join(lines)


def _file_notes(formats: list[str]) -> list[str]:
    notes = {"transformers": "`model.safetensors`, `config.json` and the tokenizer: load with "
                             "`AutoModelForCausalLM.from_pretrained(folder)`.",
             "gguf": "the `.gguf` file: `llama-cli -m FILE` (llama.cpp), or `ollama create NAME -f Modelfile` "
                     "then `ollama run NAME` (Ollama reads the chat template from the file)."}
    return [notes[f] for f in formats if f in notes]
