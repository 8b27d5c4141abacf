"""A one-token decode step for Llama-family models with fused, packed weights (CPU decoding).

Dimension letters: n live rows, H hidden size, Hq / Hk query / key-value heads, D head dim,
I intermediate size, L positions in the cache, V vocabulary.

Why: a decode step of HF's decoder at batch 8 runs ~60 small ops per layer, each paying dispatch
overhead, and five separate matrix products per layer. Here each layer is one product for q, k and v
together, one for gate and up together, one each for o and down (all on weights packed once per
rollout for oneDNN's inner product, see kernels.py), one fused RMSNorm kernel per norm, the rotary
embedding, two cache writes and one SDPA call. The arithmetic is HF's: the same products, norms,
rotary angles (from the model's own ``rotary_emb``) and attention, equal to fp32 rounding.

Used only where it is exactly HF's computation: model types llama, mistral and qwen2 with plain
``nn.Linear`` projections (no LoRA wrapper), SiLU MLPs, no per-head q/k norms, and no sliding window
within the rollout's length. Elsewhere the fast backend steps HF's own decoder.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grpo.rollout.kernels import onednn_available

FUSED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def fused_unsupported_reason(model, capacity: int) -> str | None:
    """Why ``FusedDecoder`` cannot step ``model`` (a CausalLM, not a LoRA wrapper); None when it can."""
    cfg = model.config
    if cfg.model_type not in FUSED_MODEL_TYPES:
        return f"model_type {cfg.model_type!r}"
    if getattr(cfg, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(cfg, 'hidden_act', None)!r}"
    window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
    if window is not None and window < capacity:
        return f"sliding window {window} < {capacity} positions"
    for layer in model.get_decoder().layers:
        a, m = layer.self_attn, layer.mlp
        mods = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
        if any(type(x) is not torch.nn.Linear for x in mods) or hasattr(a, "q_norm"):
            return "projections are not plain nn.Linear (LoRA) or the attention has q/k norms"
        if any(x.weight.dtype != torch.float32 or x.weight.device.type != "cpu" for x in mods):
            return "not float32 on the CPU"
    return None


class _Linear:
    """x @ W.T + b on a weight made once: oneDNN-packed where available, else the plain weight."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: bool):
        self.bias = bias
        self.packed = packed and onednn_available()
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, 8) if self.packed else weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [None], "")
        return F.linear(x, self.weight, self.bias)


def _fuse(*mods, packed: bool) -> _Linear:
    """One product for several projections of the same input: their weights stacked by rows."""
    weight = torch.cat([m.weight.detach() for m in mods])  # [sum out, in]
    if all(m.bias is None for m in mods):
        bias = None
    else:
        bias = torch.cat([m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.weight.shape[0])
                          for m in mods])
    return _Linear(weight, bias, packed)


class FusedDecoder:
    """Decode steps of ``model`` (see the module docstring) on weights fused and packed on creation;
    make one per rollout (the weights change every optimiser step) and drop it after."""

    def __init__(self, model, *, packed: bool = True):
        cfg, dec = model.config, model.get_decoder()
        self.rotary, self.embed = dec.rotary_emb, dec.embed_tokens.weight.detach()
        self.hq, self.hk = cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.inter = cfg.intermediate_size
        self.layers = []
        for layer in dec.layers:
            a, m = layer.self_attn, layer.mlp
            self.layers.append({
                "norm1": (layer.input_layernorm.weight.detach(), layer.input_layernorm.variance_epsilon),
                "qkv": _fuse(a.q_proj, a.k_proj, a.v_proj, packed=packed), "o": _fuse(a.o_proj, packed=packed),
                "scale": a.scaling,
                "norm2": (layer.post_attention_layernorm.weight.detach(),
                          layer.post_attention_layernorm.variance_epsilon),
                "gate_up": _fuse(m.gate_proj, m.up_proj, packed=packed), "down": _fuse(m.down_proj, packed=packed)})
        self.norm = (dec.norm.weight.detach(), dec.norm.variance_epsilon)

    @staticmethod
    def _rms(x: torch.Tensor, norm) -> torch.Tensor:  # [n, H]: LlamaRMSNorm in one kernel
        return F.rms_norm(x, (x.shape[-1],), norm[0], norm[1])

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """HF's apply_rotary_pos_emb on x [n, h, 1, D] with cos, sin [n, 1, 1, D]."""
        half = self.d // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor | None) -> torch.Tensor:
        """Feed tokens [n] at positions [n, 1] through every layer, appending their keys and values to
        ``cache`` (fast.py's buffer cache); mask [n, L + 1] (1 = attend) or None when nothing is
        padding. Returns the final hidden states [n, H] (the output layer is the caller's)."""
        n, hq, hk, d = tokens.shape[0], self.hq, self.hk, self.d
        h = self.embed[tokens]  # [n, H]
        cos, sin = self.rotary(h[:, None], positions)  # [n, 1, D]
        cos, sin = cos[:, None], sin[:, None]  # [n, 1, 1, D]
        attn_mask = mask.bool()[:, None, None, :] if mask is not None else None  # [n, 1, 1, L + 1]
        for w, layer in zip(self.layers, cache.layers):
            qkv = w["qkv"](self._rms(h, w["norm1"]))  # [n, (Hq + 2 Hk) D]
            q = self._rope(qkv[:, :hq * d].view(n, hq, 1, d), cos, sin)  # [n, Hq, 1, D]
            k = self._rope(qkv[:, hq * d:(hq + hk) * d].view(n, hk, 1, d), cos, sin)  # [n, Hk, 1, D]
            v = qkv[:, (hq + hk) * d:].view(n, hk, 1, d)  # [n, Hk, 1, D]
            keys, values = layer.update(k, v)  # [n, Hk, L + 1, D]
            att = F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask, scale=w["scale"],
                                                 enable_gqa=hq != hk)  # [n, Hq, 1, D]
            h = h + w["o"](att.reshape(n, hq * d))  # [n, H]
            gu = w["gate_up"](self._rms(h, w["norm2"]))  # [n, 2 I]
            h = h + w["down"](F.silu(gu[:, :self.inter]) * gu[:, self.inter:])  # [n, H]
        return self._rms(h, self.norm)  # [n, H]
