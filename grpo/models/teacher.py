"""The teacher of on-policy distillation: any model ``grpo train`` takes (hub id, folder, run folder),
loaded as the run's frozen reference model (the trainer puts it in ``LoadedModels.reference``), so its
log-probs of the student's samples come from the same forward the reference's KL uses, with no second
path.

A run folder trained with LoRA holds adapters only: they are merged into the base model they name
(``base_model_name_or_path`` of the adapter's config), so the teacher is one plain frozen model."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from grpo.errors import ConfigError
from grpo.models.loading import freeze, load_tokenizer, resolve_model_path


def load_teacher(name: str, *, dtype: str, student_tokenizer) -> nn.Module:
    """The teacher named by ``name`` in eval mode without gradients; a ConfigError when its vocabulary
    differs from the student's (log-probs of the student's token ids must mean the same tokens)."""
    from transformers import AutoModelForCausalLM

    path = Path(resolve_model_path(name))
    torch_dtype = getattr(torch, dtype)
    adapter = path / "adapter_config.json"
    if adapter.is_file():
        from peft import PeftModel

        base = json.loads(adapter.read_text()).get("base_model_name_or_path")
        if not base:
            raise ConfigError(f"teacher: {path} holds LoRA adapters without the name of their base model")
        model = AutoModelForCausalLM.from_pretrained(resolve_model_path(base), dtype=torch_dtype)
        model = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype)
    theirs = load_tokenizer(str(path)).get_vocab()
    if theirs != student_tokenizer.get_vocab():
        raise ConfigError(f"teacher: {name} has another vocabulary than the student ({len(theirs)} tokens against "
                          f"{len(student_tokenizer)}): its log-probs of the student's tokens would be meaningless")
    return freeze(model)
