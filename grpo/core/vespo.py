"""VESPO as a policy loss: a smooth weight on the policy gradient of each sequence in place of the clip
(Variational Sequence-Level Soft Policy Optimization, arXiv 2602.10693; TRL's ``loss_type="vespo"``).

Dimension letters: N sequences, T completion tokens.

With w_i = pi_theta(o_i) / pi_old(o_i) the sequence's importance ratio (the product of its token ratios,
each token's log-ratio clamped to [-20, 20] and log w_i to [log 1e-8, 20]), the weight is the Gamma-shaped

    phi(w) = e^lambda * w^k * e^(-lambda w),  phi(1) = 1,

with (k, lambda) = (k_pos, lambda_pos) where A >= 0 and (k_neg, lambda_neg) otherwise. phi rises to its
peak at w = k / lambda and decays for far-off-policy sequences, so a sequence the policy has moved far
from gets a small step instead of a hard cut. The loss on each token is -sg(phi(w_i)) A_it log
pi_theta(o_it): on-policy (w = 1) its gradient is the plain policy gradient; phi is detached, a
per-sequence gradient scale. TRL's defaults: k_pos 2, lambda_pos 3, k_neg 3, lambda_neg 2; its
aggregation is the token mean (aggregation=token_mean). Tokens drawn by another policy carry their
importance weight in the advantages, as for every loss here (TRL folds it into w instead).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from grpo.core.policy_losses import POLICY_LOSSES, LossInputs, LossSettings, _entry, _with_terms
from grpo.core.losses import masked_mean

LOG_W_MIN = math.log(1e-8)  # the clamp of log w below, as the reference implementation's


def vespo_weights(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, *, k_pos: float,
                  lambda_pos: float, k_neg: float, lambda_neg: float) -> Tensor:
    """phi(w_i) on each token [N, T] (no gradient): w_i the sequence's ratio, (k, lambda) by the sign of the
    token's own advantage (a sequence-level advantage gives one phi per sequence, as TRL's). logp,
    old_logp, advantages, mask: [N, T]."""
    with torch.no_grad():
        log_ratio = (logp - old_logp).clamp(-20.0, 20.0) * mask  # [N, T]
        log_w = log_ratio.sum(dim=1, keepdim=True).clamp(LOG_W_MIN, 20.0)  # [N, 1]
        positive = advantages >= 0  # [N, T]
        k = torch.where(positive, k_pos, k_neg).to(logp.dtype)  # [N, T]
        lam = torch.where(positive, lambda_pos, lambda_neg).to(logp.dtype).clamp(min=1e-4)  # [N, T]
        return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(0.0, 0.0, 0.0)  # [N, T]


def vespo_loss(inputs: LossInputs, settings: LossSettings) -> dict[str, Tensor]:
    """-sg(phi(w_i)) A_it log pi_theta(o_it) per token (module docstring), then the KL and entropy terms and
    the run's aggregation. inputs: [N, T]. Returns "loss", "policy_loss", "kl", "entropy" (when given),
    "ratio_mean" (token ratios) and "vespo_phi_mean" (the token-weighted mean of phi)."""
    x, s = inputs, settings
    phi = vespo_weights(x.logp, x.old_logp, x.advantages, x.mask, k_pos=s.vespo_k_pos, lambda_pos=s.vespo_lambda_pos,
                        k_neg=s.vespo_k_neg, lambda_neg=s.vespo_lambda_neg)  # [N, T]
    pg_tok = -phi * x.advantages * x.logp  # [N, T]
    out: dict[str, Tensor] = {}
    _with_terms(pg_tok, pg_tok, x, s, out)
    out["ratio_mean"] = masked_mean(torch.exp(x.logp - x.old_logp).detach(), x.mask)
    out["vespo_phi_mean"] = masked_mean(phi, x.mask)
    return out


POLICY_LOSSES.register("vespo", _entry(vespo_loss))
