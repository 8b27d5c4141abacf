"""A trained Llama-family model as one GGUF file (the ``gguf`` package writes it) that llama.cpp, Ollama
and transformers' GGUF reader load, and the Ollama Modelfile beside it.

The layout follows llama.cpp's format for the ``llama`` architecture (its gguf-py constants name every
key): the hyper-parameters under ``llama.*``, a byte-level BPE tokenizer as ``tokenizer.ggml.model =
gpt2`` with its tokens, types and merges, the chat template, and the tensors under llama.cpp's names.
llama.cpp rotates query and key pairs that are adjacent (GPT-J style) where transformers' Llama rotates
the two halves of each head, so the query and key rows of each head are interleaved on the way out (and
transformers' reader undoes it on the way in). One-dimensional tensors (the norms) stay float32, as
llama.cpp keeps them; q8_0 falls back to f16 for a matrix whose rows are not a multiple of its block.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from grpo.errors import ConfigError

ARCHITECTURES = {"LlamaForCausalLM": "llama"}  # transformers class -> GGUF architecture
# llama.cpp's name for each weight of layer {i} (gguf-py's TENSOR_NAMES for MODEL_ARCH.LLAMA)
LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
QUANTS = ("f16", "q8_0", "f32")


@dataclass(frozen=True)
class GGUFWritten:
    """What ``write_gguf`` wrote: the file, its tensor types and the pre-tokenizer it named."""

    path: Path
    quant: str
    tensor_types: dict[str, str]
    pre_tokenizer: str


def interleave_heads(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a query or key projection [heads * d, in] from transformers' half-split rotary layout to
    llama.cpp's adjacent-pair layout: within each head, row j of the first half and row j of the second
    half become rows 2j and 2j + 1."""
    d = w.shape[0] // heads
    return w.reshape(heads, 2, d // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def pre_tokenizer_name(tok) -> str | None:
    """llama.cpp's name for the tokenizer's pre-tokenizer: digits split one by one before byte-level BPE
    (SmolLM, StarCoder) is "smollm"; byte-level alone is "gpt-2"; None for any other (llama.cpp would split
    the text by another rule than the model was trained with: ``--gguf-pre`` must name it)."""
    try:
        pre = json.loads(tok.backend_tokenizer.to_str()).get("pre_tokenizer") or {}
    except (AttributeError, ValueError):
        return None
    kinds = [p.get("type") for p in pre.get("pretokenizers", [pre])]
    if kinds == ["ByteLevel"]:
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and pre["pretokenizers"][0].get("individual_digits"):
        return "smollm"
    return None


def _tokenizer(writer, tok, vocab_size: int, pre: str) -> None:
    """The tokenizer as llama.cpp's gpt2 (byte-level BPE) vocabulary, padded to the model's vocab_size."""
    import gguf

    state = json.loads(tok.backend_tokenizer.to_str())
    model, decoder = state.get("model") or {}, state.get("decoder") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback") or decoder.get("type") != "ByteLevel":
        raise ConfigError(f"--format gguf: the tokenizer is {model.get('type')} with a {decoder.get('type')} decoder, "
                          "not byte-level BPE (GPT-2's, Llama 3's, SmolLM's, Qwen's); this export writes only those")
    by_id = {i: t for t, i in tok.get_vocab().items()}
    added = getattr(tok, "added_tokens_decoder", {})  # id -> AddedToken: tokens beside the BPE vocabulary
    special = set(tok.all_special_ids) | {i for i, a in added.items() if getattr(a, "special", False)}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(by_id[i])
        types.append(gguf.TokenType.CONTROL if i in special else
                     gguf.TokenType.USER_DEFINED if i in added else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"].get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for name, value in (("bos", tok.bos_token_id), ("eos", tok.eos_token_id), ("pad", tok.pad_token_id),
                        ("unk", tok.unk_token_id)):
        if value is not None:
            getattr(writer, f"add_{name}_token_id")(int(value))
    writer.add_add_bos_token(bool(getattr(tok, "add_bos_token", False)))
    writer.add_add_space_prefix(False)
    if getattr(tok, "chat_template", None):
        writer.add_chat_template(tok.chat_template)


def _hyper_parameters(writer, hf, name: str, file_type) -> None:
    rope = getattr(hf, "rope_parameters", None) or {}
    scaling = getattr(hf, "rope_scaling", None) or {}
    kind = rope.get("rope_type") or scaling.get("rope_type") or "default"
    if kind != "default":
        raise ConfigError(f"--format gguf: rope_type {kind!r} is not written by this export (only plain RoPE)")
    theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    writer.add_name(name)
    writer.add_context_length(hf.max_position_embeddings)
    writer.add_embedding_length(hf.hidden_size)
    writer.add_block_count(hf.num_hidden_layers)
    writer.add_feed_forward_length(hf.intermediate_size)
    writer.add_head_count(hf.num_attention_heads)
    writer.add_head_count_kv(hf.num_key_value_heads)
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(float(hf.rms_norm_eps))
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(hf.vocab_size)
    writer.add_file_type(file_type)


def _tensor(writer, name: str, t: torch.Tensor, quant: str) -> str:
    """Add one tensor in the export's type; returns the type written."""
    import gguf

    a = t.detach().to(torch.float32).cpu().numpy()
    if a.ndim == 1 or quant == "f32":
        writer.add_tensor(name, a)
        return "F32"
    if quant == "q8_0" and a.shape[-1] % gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0] == 0:
        writer.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                          raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        return "Q8_0"
    writer.add_tensor(name, a.astype(np.float16))
    return "F16"


def write_gguf(model, tok, path: Path, *, quant: str = "f16", name: str = "", pre: str | None = None) -> GGUFWritten:
    """Write ``model`` (plain weights: adapters merged) and ``tok`` as one GGUF file at ``path``."""
    import gguf

    if quant not in QUANTS:
        raise ConfigError(f"--quant: {quant!r} is not valid; choose one of {', '.join(QUANTS)}")
    arch = ARCHITECTURES.get(type(model).__name__)
    if arch is None:
        raise ConfigError(f"--format gguf: {type(model).__name__} is not written by this export; it writes "
                          f"{', '.join(ARCHITECTURES)}")
    file_type = {"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                 "f32": gguf.LlamaFileType.ALL_F32}[quant]
    pre = pre or pre_tokenizer_name(tok)
    if pre is None:
        raise ConfigError("--gguf-pre: the tokenizer's pre-tokenizer is neither GPT-2's byte-level split nor "
                          "SmolLM's digits-then-byte-level; name llama.cpp's one for this model (e.g. llama-bpe for "
                          "Llama 3, qwen2 for Qwen 2)")
    biased = [k for k in ("attention_bias", "mlp_bias") if getattr(model.config, k, False)]
    if biased:
        raise ConfigError(f"--format gguf: the model has biases ({', '.join(biased)}), which this export does not "
                          "write")
    writer = gguf.GGUFWriter(str(path), arch)
    _hyper_parameters(writer, model.config, name or path.stem, file_type)
    _tokenizer(writer, tok, model.config.vocab_size, pre)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    types = {}
    state = model.state_dict()
    types["token_embd.weight"] = _tensor(writer, "token_embd.weight", state["model.embed_tokens.weight"], quant)
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    for i in range(model.config.num_hidden_layers):
        for hf, ours in LAYER_NAMES.items():
            w = state[f"model.layers.{i}.{hf}.weight"]
            if hf == "self_attn.q_proj":
                w = interleave_heads(w, heads)
            elif hf == "self_attn.k_proj":
                w = interleave_heads(w, kv_heads)
            types[f"blk.{i}.{ours}.weight"] = _tensor(writer, f"blk.{i}.{ours}.weight", w, quant)
    types["output_norm.weight"] = _tensor(writer, "output_norm.weight", state["model.norm.weight"], quant)
    if not model.config.tie_word_embeddings:  # tied: llama.cpp reads the output matrix from token_embd
        types["output.weight"] = _tensor(writer, "output.weight", state["lm_head.weight"], quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GGUFWritten(path, quant, types, pre)


def modelfile(gguf_name: str, *, system_prompt: str = "", temperature: float | None = None,
              stop: tuple[str, ...] = ()) -> str:
    """An Ollama Modelfile for the GGUF file beside it: ``ollama create NAME -f Modelfile``. Ollama reads
    the chat template from the GGUF file itself; the system prompt and stop strings the run used are set
    here."""
    lines = [f"FROM ./{gguf_name}"]
    if system_prompt:
        lines.append('SYSTEM """' + system_prompt.replace('"""', '\\"\\"\\"') + '"""')
    if temperature is not None:
        lines.append(f"PARAMETER temperature {temperature:g}")
    lines += [f"PARAMETER stop {json.dumps(s)}" for s in stop]
    return "\n".join(lines) + "\n"
