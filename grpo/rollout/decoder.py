"""A one-token decode step for Llama-family models with fused, packed weights (CPU decoding).

Dimension letters: n live rows, H hidden size, Hq / Hk query / key-value heads, D head dim,
I intermediate size, L positions in the cache, V vocabulary.

Why: a decode step of HF's decoder at batch 8 runs ~60 small ops per layer, each paying dispatch
overhead, and five separate matrix products per layer. Here each layer is one product for q, k and v
together, one for gate and up together, one each for o and down (all on weights packed once per
rollout for oneDNN's inner product, see kernels.py; the RMSNorm weights folded into them), the rotary
embedding, two cache writes and one SDPA call. The arithmetic is HF's: the same products, norms,
rotary angles (from the model's own ``rotary_emb``) and attention, equal to fp32 rounding.

Used only where it is exactly HF's computation: model types llama, mistral and qwen2 with plain
``nn.Linear`` projections or PEFT LoRA linears (their adapters merged into the copy of the weights a
rollout reads: W + scaling * B A, the adapter's forward in eval mode, so sampling from a LoRA policy
costs what sampling from the plain model costs), SiLU MLPs, no per-head q/k norms, and no sliding
window within the rollout's length. Elsewhere the fast backend steps HF's own decoder.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from grpo.models.packing import sliding_window
from grpo.rollout.kernels import onednn_available, packed_linear

FUSED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def linear_weight(mod) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """The (weight [out, in], bias [out] or None) that ``mod``'s eval-mode forward applies: a plain
    ``nn.Linear``'s own, or a PEFT LoRA linear's base weight plus scaling * B @ A of each active
    adapter (nothing added when the adapters are merged or disabled). None for anything else (DoRA,
    other adapter types, other layers)."""
    if type(mod) is torch.nn.Linear:
        return mod.weight.detach(), (mod.bias.detach() if mod.bias is not None else None)
    base = getattr(mod, "base_layer", None)
    if type(base) is not torch.nn.Linear or not hasattr(mod, "lora_A"):
        return None
    weight = base.weight.detach()
    if getattr(mod, "merged", False) or getattr(mod, "disable_adapters", False):
        return weight, (base.bias.detach() if base.bias is not None else None)
    active = [a for a in mod.active_adapters if a in mod.lora_A]
    if getattr(mod, "fan_in_fan_out", False) or any(mod.use_dora.get(a, False) for a in active) \
            or any(a in getattr(mod, "lora_embedding_A", {}) for a in active):
        return None
    for a in active:  # LoRA (Hu et al. 2021): h = W x + scaling * B A x
        delta = mod.lora_B[a].weight.detach() @ mod.lora_A[a].weight.detach()  # [out, in]
        weight = weight + mod.scaling[a] * delta.to(weight.dtype)
    return weight, (base.bias.detach() if base.bias is not None else None)


def decoder_unsupported_reason(model, capacity: int) -> str | None:
    """Why ``TorchDecoder`` cannot step ``model`` (a CausalLM, not a LoRA wrapper); None when it can."""
    cfg = model.config
    if cfg.model_type not in FUSED_MODEL_TYPES:
        return f"model_type {cfg.model_type!r}"
    if getattr(cfg, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(cfg, 'hidden_act', None)!r}"
    window = sliding_window(cfg)
    if window is not None and window < capacity:
        return f"sliding window {window} < {capacity} positions"
    for layer in model.get_decoder().layers:
        a, m = layer.self_attn, layer.mlp
        mods = (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)
        weights = [linear_weight(x) for x in mods]
        if any(w is None for w in weights) or hasattr(a, "q_norm"):
            return "projections are neither nn.Linear nor LoRA linears, or the attention has q/k norms"
        if any(w.dtype != torch.float32 or w.device.type != "cpu" for w, _ in weights):
            return "not float32 on the CPU"
    return None


def default_linear(packed: bool):
    """The product factory (weight [out, in], bias [out] or None) -> (x [n, in] -> [n, out]) a decode
    step uses unless told otherwise: oneDNN on the weight packed once (kernels.packed_linear) where
    asked and available, else F.linear."""
    if packed and onednn_available():
        return packed_linear
    return lambda weight, bias: functools.partial(F.linear, weight=weight, bias=bias)


def _fuse(*mods, linear, scale: torch.Tensor | None = None):
    """One product for several projections of the same input: their weights stacked by rows, each
    column times ``scale`` [in] (the RMSNorm weight before them: W (w * x) = (W diag w) x). Returns
    ``linear(weight, bias)``: x [n, in] -> [n, sum out]."""
    pairs = [linear_weight(m) for m in mods]
    if len(pairs) == 1 and scale is None:
        weight = pairs[0][0]  # the products copy or read it as it is: no copy of our own (a rollout's
        # weight copies cost ~0.1 s per 540 MB on one core)
    else:
        weight = torch.cat([w for w, _ in pairs])  # [sum out, in] a new tensor
        if scale is not None:
            weight.mul_(scale.detach()[None, :])
    if all(b is None for _, b in pairs):
        bias = None
    else:
        bias = torch.cat([b if b is not None else w.new_zeros(w.shape[0]) for w, b in pairs])
    return linear(weight, bias)


class RowCache:
    """A decode step's bookkeeping over HF's KV cache: the G rows of each prompt share its prefilled
    cache (repeated once after the prefill), rows that ended leave the cache, and the attention mask
    grows by one position per step (kept only where the prompts have padding)."""

    def start(self, cache, prompt_mask: torch.Tensor, g: int, capacity: int) -> None:
        """Take ``cache`` after the prefill of the B prompts, prompt_mask [B, P]."""
        cache.batch_repeat_interleave(g)
        self.cache = cache
        padded = bool((prompt_mask == 0).any())
        self.mask = prompt_mask.repeat_interleave(g, 0) if padded else None  # [N, P + t]
        self.rows = torch.arange(prompt_mask.shape[0] * g, device=prompt_mask.device)  # [n] global rows

    def follow(self, rows: torch.Tensor) -> None:
        """Keep only the cache rows of ``rows`` (ascending global rows, a subset of the last ones) and
        add this step's position to the mask."""
        if len(rows) < len(self.rows):
            keep = torch.searchsorted(self.rows, rows)  # [n']
            self.cache.batch_select_indices(keep)
            self.mask = self.mask[keep] if self.mask is not None else None
            self.rows = rows
        if self.mask is not None:
            self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], 1)  # [n, P + t + 1]


class TorchDecoder(RowCache):
    """Decode steps of ``model`` (see the module docstring) on weights fused and packed on creation;
    make one per rollout (the weights change every optimiser step) and drop it after."""

    def __init__(self, model, *, packed: bool = True, linears: dict | None = None):
        """``linears``: role (qkv, o, gate_up, down) -> product factory (grpo.rollout.tuning's plan);
        ``default_linear(packed)`` for the roles not given."""
        lin = {role: (linears or {}).get(role) or default_linear(packed) for role in ("qkv", "o", "gate_up", "down")}
        cfg, dec = model.config, model.get_decoder()
        self.rotary, self.embed = dec.rotary_emb, dec.embed_tokens.weight.detach()
        self.hq, self.hk = cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.inter = cfg.intermediate_size
        self.layers = []
        for layer in dec.layers:
            a, m = layer.self_attn, layer.mlp
            n1, n2 = layer.input_layernorm, layer.post_attention_layernorm
            self.layers.append({  # the RMSNorm weights are folded into the products that follow them
                "eps1": n1.variance_epsilon, "qkv": _fuse(a.q_proj, a.k_proj, a.v_proj, linear=lin["qkv"], scale=n1.weight),
                "o": _fuse(a.o_proj, linear=lin["o"]), "scale": a.scaling, "eps2": n2.variance_epsilon,
                "gate_up": _fuse(m.gate_proj, m.up_proj, linear=lin["gate_up"], scale=n2.weight),
                "down": _fuse(m.down_proj, linear=lin["down"])})
        self.norm = (dec.norm.weight.detach(), dec.norm.variance_epsilon)

    @staticmethod
    def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
        """LlamaRMSNorm of x [n, H] without its weight (folded into the next product)."""
        return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt_()

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """HF's apply_rotary_pos_emb on queries and keys together, x [n, Hq + Hk, D], cos, sin [n, 1, D]."""
        half = self.d // 2
        return torch.cat((-x[..., half:], x[..., :half]), -1).mul_(sin).addcmul_(x, cos)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, masked: torch.Tensor | None,
                scale: float) -> torch.Tensor:
        """Attention of one query per row, q [n, Hq, 1, D], over keys, values [n, Hk, L, D]: query head
        j * G + i reads key-value head j (HF's repeat_kv order), written as two batched products
        (SDPA's CPU kernel costs ~3x more for a single query). Returns [n, Hq * D]."""
        n, hq, _, d = q.shape
        qg = q.view(n, self.hk, hq // self.hk, d)  # [n, Hk, G, D]
        s = torch.matmul(qg, keys.transpose(-1, -2)).mul_(scale)  # [n, Hk, G, L]
        if masked is not None:
            s.masked_fill_(masked, float("-inf"))
        return torch.matmul(torch.softmax(s, -1), values).view(n, hq * d)  # [n, Hq * D]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Feed tokens [n] of global rows ``rows`` [n] (ascending) at positions [n, 1] through every
        layer, appending their keys and values to the cache taken by ``start`` (fast.py's buffer
        cache). Returns the final hidden states [n, H] (the output layer is the caller's)."""
        self.follow(rows)
        n, hq, hk, d = tokens.shape[0], self.hq, self.hk, self.d
        h = self.embed[tokens]  # [n, H]
        cos, sin = self.rotary(h[:, None], positions)  # [n, 1, D]
        attn_mask = self.mask[:, None, None, :] == 0 if self.mask is not None else None  # [n, 1, 1, L + 1] True = masked
        for w, layer in zip(self.layers, self.cache.layers):
            qkv = w["qkv"](self._rms(h, w["eps1"]))  # [n, (Hq + 2 Hk) D]
            qk = self._rope(qkv[:, :(hq + hk) * d].view(n, hq + hk, d), cos, sin)  # [n, Hq + Hk, D]
            q, k = qk[:, :hq, None], qk[:, hq:, None]  # [n, Hq, 1, D], [n, Hk, 1, D]
            v = qkv[:, (hq + hk) * d:].view(n, hk, 1, d)  # [n, Hk, 1, D]
            keys, values = layer.update(k, v)  # [n, Hk, L + 1, D]
            h = h + w["o"](self._attend(q, keys, values, attn_mask, w["scale"]))  # [n, H]
            gu = w["gate_up"](self._rms(h, w["eps2"]))  # [n, 2 I]
            h = h + w["down"](F.silu(gu[:, :self.inter]).mul_(gu[:, self.inter:]))  # [n, H]
        return self._rms(h, self.norm[1]) * self.norm[0]  # [n, H]
