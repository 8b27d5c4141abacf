"""The models behind ``grpo serve`` and ``grpo export``: a run folder (its newest checkpoint, LoRA
adapters merged into the base weights) or any model ``grpo train`` accepts, and its base model."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo.errors import CheckpointError, ConfigError
from grpo.infra.checkpoint import newest_checkpoint
from grpo.models.loading import load_tokenizer, resolve_model_path
from grpo.rewards.reward import RewardOptions


@dataclass
class ServedSource:
    """What a ``RUN_OR_MODEL`` argument names: the weights to load and the model they started from."""

    name: str  # as given
    weights: str  # a folder or hub id from_pretrained takes (a LoRA checkpoint: the adapters' folder)
    base: str  # the run's ``model`` (a plain model: itself)
    lora: bool  # weights holds adapters over ``base``
    system_prompt: str = ""
    max_prompt_length: int | None = None
    rewards: str | None = None  # the run's reward functions (the completeness check's default); None: not a run
    probe_prompts: tuple = ()  # an exported folder's recorded held-out prompts (--completeness auto measures on them)
    run: str | None = None  # the run folder it came from (its held-out prompts: probe_prompts_of)
    reward_options: RewardOptions = RewardOptions()  # a run's reward settings (--verifier resolves with them)


EXPORT_FILE = "grpo_export.json"


def source_of(name: str) -> ServedSource:
    """A run folder (it holds config.yaml) -> its newest checkpoint over the run's model; a folder
    ``grpo export`` wrote -> its weights over the base model its grpo_export.json records, with the
    run's system prompt, prompt limit and rewards; anything else -> the model itself, its own base."""
    p = Path(name)
    if p.is_dir() and (p / EXPORT_FILE).is_file():
        try:
            info = json.loads((p / EXPORT_FILE).read_text())
        except ValueError as e:
            raise ConfigError(f"{p / EXPORT_FILE}: not JSON ({e})") from None
        if not isinstance(info, dict):
            raise ConfigError(f"{p / EXPORT_FILE}: a JSON object expected")
        return ServedSource(name, name, info.get("base_model") or name, False, info.get("system_prompt") or "",
                      info.get("max_prompt_length"), info.get("rewards"), tuple(info.get("probe_prompts") or ()))
    if p.is_dir() and (p / "config.yaml").is_file():
        from grpo.config.io import load_config
        from grpo.train.settings import run_record

        run = run_record(load_config(p / "config.yaml"))
        ckpt = newest_checkpoint(p)
        if ckpt is None:
            raise CheckpointError(f"{p}: a run folder without checkpoints (nothing trained to serve)")
        return ServedSource(name, str(ckpt), run.model, (ckpt / "adapter_config.json").is_file(), run.system_prompt,
                            run.max_prompt_length, run.rewards, run=str(p), reward_options=run.reward_options)
    return ServedSource(name, name, name, False)


PROBE_PROMPTS = 8  # held-out prompts --completeness auto answers at start-up


def probe_prompts_of(src: ServedSource) -> tuple:
    """The held-out prompts --completeness auto measures on: an exported folder's recorded ones, or the
    first PROBE_PROMPTS of its run's task, loaded here (none where that cannot be: a dataset that stayed
    on another machine or the hub, a mixture; the check is then chosen by rule)."""
    if src.probe_prompts or src.run is None:
        return tuple(src.probe_prompts)
    from grpo.config.io import load_config
    from grpo.train.settings import held_out_prompts

    try:
        return held_out_prompts(load_config(Path(src.run) / "config.yaml"), PROBE_PROMPTS)
    except Exception:  # any reason the task cannot be loaded here: the measurement is skipped, not the server
        return ()


def _load(path: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(path), dtype=torch.float32)
    model.config.use_cache = True
    return model.eval()


def load_policy(src: ServedSource):
    """The source's model as plain full weights (adapters merged: W + scaling * B A) and its tokenizer."""
    if not src.lora:
        return _load(src.weights), load_tokenizer(resolve_model_path(src.weights))
    from peft import PeftModel

    merged = PeftModel.from_pretrained(_load(src.base), src.weights).merge_and_unload()
    return merged.eval(), load_tokenizer(src.weights)


def load_base(src: ServedSource):
    """The source's base model and its tokenizer (a plain model: itself again, a second copy); the tokenizer
    renders with the trained model's saved chat template (which carries the run's chat_template_kwargs), so
    both answer the same prompt text."""
    tok = load_tokenizer(resolve_model_path(src.base))
    trained = load_tokenizer(src.weights if src.lora else resolve_model_path(src.weights))
    if getattr(trained, "chat_template", None):
        tok.chat_template = trained.chat_template
    return _load(src.base), tok


def same_weights(a: ServedSource, b: ServedSource) -> bool:
    """Whether two sources load the same weights (a model served as its own fallback)."""
    return not a.lora and not b.lora and a.weights == b.weights


def fallback_source(src: ServedSource, fallback: str) -> ServedSource:
    """``--fallback``: 'base' is the run's base model; anything else is a model or run folder."""
    if fallback == "base":
        return ServedSource(src.base, src.base, src.base, False, src.system_prompt, src.max_prompt_length)
    if not fallback:
        raise ConfigError("--fallback: empty; give 'base' or a model")
    other = source_of(fallback)
    return ServedSource(other.name, other.weights, other.base, other.lora, src.system_prompt, src.max_prompt_length)


EXPORT_FORMATS = ("transformers", "gguf")


def export(name: str, out: Path, *, fmt: str = "transformers", quant: str = "f16", pre: str | None = None) -> Path:
    """Write the model ``name`` names (a run: its newest checkpoint, adapters merged) into the folder ``out``
    with a model card (README.md): as a plain transformers folder (weights, config, tokenizer, and
    grpo_export.json saying where it came from), or as one GGUF file in ``quant`` with an Ollama Modelfile."""
    from grpo.serve.card import CONFIG_COPY, model_card

    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"--format: {fmt!r} is not valid; choose one of {', '.join(EXPORT_FORMATS)}")
    src = source_of(name)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out}: exists and is not empty")
    model, tok = load_policy(src)
    out.mkdir(parents=True, exist_ok=True)
    title = Path(src.run or src.name).name or "model"
    if fmt == "gguf":
        _export_gguf(model, tok, src, out / f"{title}-{quant}.gguf", quant=quant, pre=pre)
    else:
        model.save_pretrained(out)
        tok.save_pretrained(out)
        (out / EXPORT_FILE).write_text(json.dumps(
            {"source": name, "checkpoint": src.weights, "base_model": src.base, "lora_merged": src.lora,
             "system_prompt": src.system_prompt, "max_prompt_length": src.max_prompt_length, "rewards": src.rewards,
             "probe_prompts": list(probe_prompts_of(src))},
            indent=2) + "\n")
    if src.run is not None:
        shutil.copyfile(Path(src.run) / "config.yaml", out / CONFIG_COPY)
    (out / "README.md").write_text(model_card(name=title, base=src.base, run=Path(src.run) if src.run else None,
                                              settings=_run_settings(src), formats=[fmt],
                                              extra_tags=("lora",) if src.lora else ()))
    return out


def _export_gguf(model, tok, src: ServedSource, path: Path, *, quant: str, pre: str | None) -> None:
    from grpo.serve.gguf_export import modelfile, write_gguf

    written = write_gguf(model, tok, path, quant=quant, name=path.stem, pre=pre)
    stop = tuple(t for t in (tok.eos_token,) if t)
    (path.parent / "Modelfile").write_text(modelfile(path.name, system_prompt=src.system_prompt, stop=stop))
    print(f"gguf: {path.name} ({quant}; pre-tokenizer {written.pre_tokenizer!r}, tensor types "
          f"{sorted(set(written.tensor_types.values()))})")


def _run_settings(src: ServedSource) -> dict | None:
    """The run's whole config as a dict (None for a model that is not a run)."""
    if src.run is None:
        return None
    from grpo.config.io import load_config

    return load_config(Path(src.run) / "config.yaml").to_dict()
