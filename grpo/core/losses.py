"""Token log-probabilities, entropy, the clipped surrogate, KL estimators and loss aggregation.

Dimension letters: B prompts, G group size, N = B*G sequences, T completion tokens, V vocabulary.

All functions are pure: tensors in, settings as keyword-only arguments, tensors out.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

KL_ESTIMATORS = ("k1", "k2", "k3")
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm", "seq_mean_token_sum")
RATIO_LEVELS = ("token", "sequence")


def _check_choice(name: str, value: str, valid: tuple[str, ...]) -> None:
    """Raise a ValueError listing the valid names unless value is one of them (no tensors: no shapes)."""
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {list(valid)}")


class _IndexedLogProbEntropy(torch.autograd.Function):
    """log p(token) and entropy of softmax(logits / temperature) for tokens scored at given positions.

    logits [K, V] holds one row per position whose next-token distribution is needed; index [M]
    names the position each of M tokens is scored at (several tokens may share one, as the G
    completions of a group share their prompt's last position). Only a [chunk, V] slice is
    materialised at a time, in forward and in backward; nothing of size [K, V] is saved for backward
    except the logits themselves (which the model produced anyway). Backward, with z = x / tau,
    p = softmax(z), H = -sum p log p, summed over the tokens scored at each position:
      d logp_y / dx = (onehot(y) - p) / tau,   dH / dx = -p * (log p + H) / tau.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, index: Tensor, tokens: Tensor, temperature: float, chunk: int):
        """logits [K, V], index [M], tokens [M] -> (logp [M], entropy [M]) in float32."""
        k, v = logits.shape
        lse = logits.new_empty(k, dtype=torch.float32)  # [K]
        ent = logits.new_empty(k, dtype=torch.float32)  # [K]
        # two [chunk, V] buffers reused by every chunk: a fresh 4 MB temporary per op was a fresh
        # mapping and ~1,000 page faults each, which made these ops ~10x slower inside training
        z_buf = logits.new_empty(min(chunk, k), v, dtype=torch.float32)
        p_buf = torch.empty_like(z_buf)
        for s in range(0, k, chunk):
            c = min(chunk, k - s)
            z, p = z_buf[:c], p_buf[:c]  # [C, V]
            torch.div(logits[s:s + c], temperature, out=z)
            m = z.amax(-1, keepdim=True)  # [C, 1]
            total = torch.sub(z, m, out=p).exp_().sum(-1, keepdim=True)  # [C, 1]
            lse_c = (m + total.log())[:, 0]  # [C]
            ent[s:s + c] = lse_c - torch.linalg.vecdot(p.div_(total), z)  # H = lse - sum_v p z
            lse[s:s + c] = lse_c
        logp = logits[index, tokens].float() / temperature - lse[index]  # [M]
        ctx.save_for_backward(logits, index, tokens, lse, ent)
        ctx.temperature, ctx.chunk = temperature, chunk
        return logp, ent[index]

    @staticmethod
    def backward(ctx, g_logp: Tensor, g_ent: Tensor):  # [M], [M]
        """Gradients [M] of logp and entropy -> gradient of the logits [K, V], one chunk at a time,
        written in place into the gradient's own rows (one [chunk, V] buffer besides)."""
        logits, index, tokens, lse, ent = ctx.saved_tensors
        tau, chunk = ctx.temperature, ctx.chunk
        k = logits.shape[0]
        # the per-row weights carry -1/tau, so no pass over [C, V] (nor over the whole gradient) applies it
        zeros = torch.zeros(k, dtype=torch.float32, device=logits.device)  # [K]
        gl = zeros.index_add(0, index, g_logp).mul_(-1.0 / tau)  # [K]
        ge = zeros.index_add(0, index, g_ent).mul_(-1.0 / tau)  # [K]
        grad = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)  # [K, V]
        p_buf = torch.empty(min(chunk, k), logits.shape[1], dtype=torch.float32, device=logits.device)
        for s in range(0, k, chunk):
            c = min(chunk, k - s)
            sl, p = slice(s, s + c), p_buf[:c]
            logp_all = torch.div(logits[sl], tau, out=grad[sl]).sub_(lse[sl, None])  # [C, V] log p
            torch.exp(logp_all, out=p)
            # -p * (gl + ge * (log p + H)) / tau, built in place in the gradient's rows
            logp_all.add_(ent[sl, None]).mul_(ge[sl, None]).add_(gl[sl, None]).mul_(p)
        grad.index_put_((index, tokens), g_logp / tau, accumulate=True)  # the onehot(y) part
        return grad.to(logits.dtype), None, None, None, None


def indexed_logprobs_and_entropy(logits: Tensor, index: Tensor, tokens: Tensor, *, temperature: float = 1.0,
                                 chunk_size: int | None = None) -> dict[str, Tensor]:
    """Log-probability of each token and the entropy of the distribution it was drawn from.

    logits: [K, V], one row per position (e.g. the model's logits at the kept positions of packed
    sequences); index: [...] long, the row each token is scored at (rows may repeat); tokens: [...]
    long, same shape. Returns {"logp", "entropy"} of that shape, float32, for
    softmax(logits / temperature). Peak extra memory is O(chunk_size * V), not O(K * V). The default
    chunk holds about 2**20 values (4 MB), so its several passes stay in cache: on a 2-core CPU,
    256 rows of a 49k vocabulary ran 3-4x slower.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size is None:
        chunk_size = max(1, (1 << 20) // logits.shape[-1])
    logp, ent = _IndexedLogProbEntropy.apply(logits, index.reshape(-1), tokens.reshape(-1), float(temperature),
                                             int(chunk_size))
    return {"logp": logp.view(index.shape), "entropy": ent.view(index.shape)}


def token_logprobs_and_entropy(logits: Tensor, tokens: Tensor, *, temperature: float = 1.0,
                               chunk_size: int | None = None) -> dict[str, Tensor]:
    """Log-probability of each chosen token and the entropy of each next-token distribution.

    logits: [N, T, V] (the logits that predict ``tokens``, already shifted; a non-contiguous view is
    copied once); tokens: [N, T] (long). Returns {"logp": [N, T], "entropy": [N, T]} in float32 for
    softmax(logits / temperature), the distribution the tokens were sampled from.
    """
    n, t, v = logits.shape
    index = torch.arange(n * t, device=logits.device).view(n, t)  # [N, T]
    return indexed_logprobs_and_entropy(logits.reshape(n * t, v), index, tokens, temperature=temperature,
                                        chunk_size=chunk_size)


def token_logprobs(logits: Tensor, tokens: Tensor, *, temperature: float = 1.0,
                   chunk_size: int | None = None) -> Tensor:
    """log softmax(logits / temperature) gathered at ``tokens``. [N, T, V], [N, T] -> [N, T]."""
    return token_logprobs_and_entropy(logits, tokens, temperature=temperature, chunk_size=chunk_size)["logp"]


def kl_penalty(logp: Tensor, ref_logp: Tensor, *, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from samples of pi_theta (Schulman 2020).

    logp, ref_logp: [N, T] -> [N, T].
      k1 = log pi - log pi_ref                  (unbiased, high variance, can be negative)
      k2 = (log pi - log pi_ref)^2 / 2          (low variance, biased)
      k3 = exp(ref - logp) - (ref - logp) - 1   (unbiased, always >= 0; DeepSeekMath eq. 4)
    """
    _check_choice("kl_estimator", estimator, KL_ESTIMATORS)
    diff = ref_logp - logp  # [N, T]
    if estimator == "k1":
        return -diff
    if estimator == "k2":
        return 0.5 * diff * diff
    return torch.exp(diff) - diff - 1.0  # [N, T]


def masked_moments(x: Tensor, mask: Tensor, *, dim: int | None = None, count: Tensor | None = None,
                   reduce: Callable[[Tensor], Tensor] | None = None,
                   var: bool = True) -> tuple[Tensor, Tensor | None]:
    """Mean and population variance of x over the entries where mask is 1 (all of them, or along ``dim``).

    x, mask: [N, T] (any equal shapes) -> (mean, var), each [] or, along ``dim``, the remaining
    dimensions ([N] for dim=1); var is None when ``var`` is False. A mean over no entries is 0.
    The variance is two-pass, sum((x - mean)^2 * m) / count, which stays exact for data far from 0.
    ``reduce`` maps each partial sum (of x, of the squared deviations, and of the mask unless ``count``
    is given) to the sum over every holder of a share of the batch, e.g. an all-reduce over processes,
    so a batch split across them gets the statistics of the whole; ``count`` is the number of counted
    entries (at least 1) when the caller already has it. Both default to this tensor alone.
    """
    m = mask.to(x.dtype)  # [N, T]
    total = reduce or _unchanged
    if count is None:
        count = total(m.sum() if dim is None else m.sum(dim)).clamp(min=1)  # [] or [N]
    mean = total((x * m).sum() if dim is None else (x * m).sum(dim)) / count  # [] or [N]
    if not var:
        return mean, None
    dev = (x - (mean if dim is None else mean.unsqueeze(dim))) * m  # [N, T]
    sq = (dev ** 2).sum() if dim is None else (dev ** 2).sum(dim)  # [] or [N]
    return mean, total(sq) / count


def _unchanged(x: Tensor) -> Tensor:
    """The identity on a partial sum [] or [N]: the whole batch is on this side."""
    return x


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of x over entries where mask is 1 (all of them, or along ``dim``); 0 where none count.

    x, mask: [N, T] (any equal shapes) -> [] or, along ``dim``, the remaining dimensions ([N] for dim=1).
    """
    return masked_moments(x, mask, dim=dim, var=False)[0]


def log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor, *, level: str = "token") -> Tensor:
    """log(pi_theta / pi_old) per token. [N, T] -> [N, T].

    ``level="sequence"`` is GSPO (Zheng et al. 2025) in its GSPO-token form: every token carries the
    sequence's length-normalised log ratio as value, sg[s_i] * pi / sg[pi], so with the
    seq_mean_token_mean aggregation the gradient equals GSPO's sequence objective.
    """
    _check_choice("ratio_level", level, RATIO_LEVELS)
    lr = logp - old_logp  # [N, T]
    if level == "token":
        return lr
    seq = masked_mean(lr, mask, dim=1)  # [N]
    return seq.detach()[:, None] + logp - logp.detach()  # [N, T]


def clipped_surrogate(ratio: Tensor, advantages: Tensor, *, eps_low: float = 0.2, eps_high: float = 0.2,
                      dual_clip: float | None = None, delta: float | None = None) -> Tensor:
    """Per-token PPO clipped surrogate loss, to be minimised. ratio, advantages: [N, T] -> [N, T].

    loss = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A). eps_high > eps_low is DAPO's clip-higher.
    ``dual_clip`` = c > 1 (Ye et al. 2020) also bounds the loss of negative-advantage tokens by -c A,
    so a huge ratio on a bad token cannot produce an unbounded update. ``delta`` > 1 (INTELLECT-2,
    arXiv 2505.07291, two-sided clipping) writes that bound as a clip of the ratio: on tokens with
    A < 0 the unclipped term is -min(r, delta) A.
    """
    if delta is not None:
        if delta <= 1.0:
            raise ValueError(f"delta must be > 1, got {delta}")
        ratio_u = torch.where(advantages < 0, ratio.clamp(max=delta), ratio)  # [N, T]
        unclipped = -advantages * ratio_u  # [N, T]
    else:
        unclipped = -advantages * ratio  # [N, T]
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)  # [N, T]
    loss = torch.maximum(unclipped, clipped)  # [N, T]
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * dual_clip), loss)
    return loss


def aggregate(loss_tok: Tensor, mask: Tensor, *, mode: str = "seq_mean_token_mean",
              norm_length: int | None = None, total: Tensor | float | None = None) -> Tensor:
    """Reduce a per-token loss [N, T] to a scalar.

    seq_mean_token_mean      1/N sum_i 1/|o_i| sum_t l_it   (DeepSeekMath / GRPO paper)
    token_mean               sum_it l_it / sum_i |o_i|      (DAPO: every token weighs the same)
    seq_mean_token_sum_norm  1/N sum_i sum_t l_it / L       (Dr.GRPO: L a fixed length, no length bias)
    seq_mean_token_sum       1/N sum_i sum_t l_it           (LUSPO, TRL's loss_type="luspo": a sequence weighs
                                                             by its length)

    ``norm_length`` is L (defaults to T). ``total`` replaces the denominator (N for the sequence
    modes, the token count for token_mean) with a global one, so micro-batches accumulate exactly to
    the full-batch loss and multiple processes can share one normalizer.
    """
    _check_choice("aggregation", mode, AGGREGATIONS)
    m = mask.to(loss_tok.dtype)  # [N, T]
    if mode == "token_mean":
        num = (loss_tok * m).sum()  # []
        den = m.sum().clamp(min=1) if total is None else total
        return num / den
    if mode == "seq_mean_token_mean":
        per_seq = (loss_tok * m).sum(1) / m.sum(1).clamp(min=1)  # [N]
    elif mode == "seq_mean_token_sum":
        per_seq = (loss_tok * m).sum(1)  # [N]
    else:
        length = loss_tok.shape[1] if norm_length is None else norm_length
        per_seq = (loss_tok * m).sum(1) / length  # [N]
    den = per_seq.shape[0] if total is None else total
    return per_seq.sum() / den


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *,
                       clip_range: float | None = 0.2) -> dict[str, Tensor]:
    """PPO's clipped value loss (Schulman et al. 2017; as in OpenAI's baselines), token mean.

    values, old_values, returns, mask: [N, T]. The new value may move at most ``clip_range`` from the
    value at sampling time; the loss is the larger of the clipped and unclipped squared errors, so
    clipping can only slow the critic down. Returns {"loss": [] differentiable, "clip_fraction": []}.
    """
    unclipped = (values - returns) ** 2  # [N, T]
    if clip_range is None:
        return {"loss": 0.5 * masked_mean(unclipped, mask), "clip_fraction": values.new_zeros(())}
    v_clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)  # [N, T]
    clipped = (v_clipped - returns) ** 2  # [N, T]
    loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), mask)  # []
    frac = masked_mean((clipped > unclipped).to(values.dtype), mask)  # []
    return {"loss": loss, "clip_fraction": frac.detach()}
