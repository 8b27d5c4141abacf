"""Token masks on the policy-gradient term: which tokens of a batch a policy loss learns from.

Dimension letters: N sequences, T completion tokens.

Each mask is 1 where a token's policy-gradient term counts. The KL and entropy terms and the loss's
denominators still count every token of ``mask``, as the papers and TRL do: a mask moves the
gradient onto fewer tokens without rescaling it.
"""

from __future__ import annotations

import math

from torch import Tensor

from grpo.core.losses import masked_mean


def high_entropy_mask(entropy: Tensor, mask: Tensor, *, quantile: float) -> Tensor:
    """The top ``quantile`` of the counted tokens by entropy ("Beyond the 80/20 Rule", Wang et al.
    2025, arXiv 2506.01939, eq. 6): I[H_t >= tau_rho], tau_rho the entropy such that a share rho of
    the batch's tokens lies at or above it (the paper's rho = 0.2; TRL's ``top_entropy_quantile``).

    entropy, mask: [N, T] -> bool [N, T]. tau is the k-th largest entropy of the counted tokens, with
    k = ceil(quantile * count) (at least 1), so ties at tau are all kept; quantile = 1 keeps every
    counted token (TRL thresholds at torch.quantile(1 - rho), which interpolates: the kept sets agree
    up to the tokens next to the threshold). The ranking is over the tokens given: on the trainer's
    side, one forward chunk of one process (TRL ranks a micro-batch over all processes).
    """
    if not 0 < quantile <= 1:
        raise ValueError(f"top_entropy_quantile must lie in (0, 1], got {quantile}")
    counted = mask > 0  # [N, T]
    if quantile == 1.0:
        return counted
    vals = entropy.detach()[counted]  # [M]
    if vals.numel() == 0:
        return counted
    k = max(1, math.ceil(quantile * vals.numel()))
    tau = vals.topk(k).values[-1]  # []
    return counted & (entropy.detach() >= tau)  # [N, T]


def off_policy_sequence_mask(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *,
                             threshold: float) -> Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (arXiv 2512.02556, eq. 9): a sequence with a negative
    advantage whose KL from the sampling policy, 1/|o_i| sum_t log(pi_old(o_t) / pi_theta(o_t)), is
    above delta = ``threshold`` leaves the policy-gradient term; every other sequence stays.

    logp, old_logp, advantages, mask: [N, T] (old_logp: the policy that sampled) -> bool [N] (True:
    kept). A sequence's advantage is its mean token advantage. No gradient flows through the mask.
    """
    kl = masked_mean(old_logp.detach() - logp.detach(), mask, dim=1)  # [N]
    negative = masked_mean(advantages, mask, dim=1) < 0  # [N]
    return ~(negative & (kl > threshold))  # [N]


def policy_gradient_keep(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor,
                         entropy: Tensor | None, *, top_entropy_quantile: float = 1.0,
                         off_policy_mask_threshold: float | None = None) -> tuple[Tensor | None, dict[str, Tensor]]:
    """Both masks together: (keep [N, T] in logp's dtype, or None when neither is on; metrics).

    logp, old_logp, advantages, mask, entropy: [N, T]. Metrics (0-d): "entropy_mask_share", the
    share of counted tokens the entropy mask keeps, and "off_policy_masked_share", the share of
    counted tokens whose sequence the off-policy mask removes, each only when its mask is on.
    """
    keep, metrics = None, {}
    m = mask.to(logp.dtype)  # [N, T]
    if top_entropy_quantile < 1.0:
        if entropy is None:
            raise ValueError("top_entropy_quantile < 1 needs the token entropy")
        high = high_entropy_mask(entropy, mask, quantile=top_entropy_quantile).to(logp.dtype)  # [N, T]
        metrics["entropy_mask_share"] = masked_mean(high, m)
        keep = high
    if off_policy_mask_threshold is not None:
        seq = off_policy_sequence_mask(logp, old_logp, advantages, mask,
                                       threshold=off_policy_mask_threshold).to(logp.dtype)  # [N]
        metrics["off_policy_masked_share"] = masked_mean((1.0 - seq)[:, None].expand_as(m), m)
        keep = seq[:, None] * (m if keep is None else keep)  # [N, T]
    return keep, metrics
