"""On-policy distillation as a policy loss: the student samples, a teacher scores the student's tokens,
and the loss is the per-token reverse KL from the student to the teacher (Agarwal et al. 2024, GKD,
arXiv 2306.13649, with the student's own samples; Gu et al. 2024, MiniLLM, arXiv 2306.08543, on why
the reverse KL suits a small student: it seeks the teacher's modes instead of covering all of them).

Dimension letters: N sequences, T completion tokens.

On a token y_t the student sampled, k_t = log pi_theta(y_t) - log pi_teacher(y_t) estimates the
reverse KL at that position, KL(pi_theta(. | prefix) || pi_teacher(. | prefix)) = E_{y ~ pi_theta}[k].
The loss puts r_t * sg(k_t) on each token, r_t = pi_theta / pi_old the importance ratio (1 on the
first pass over a batch). Its value is the sampled reverse KL; its gradient is r_t k_t grad log
pi_theta(y_t), whose expectation over y_t ~ pi_theta is the exact gradient of the per-position reverse
KL (the score-function term E[grad log pi] is 0), as in on-policy distillation with a per-token
advantage -k_t and no discount (Thinking Machines, "On-Policy Distillation", 2025). The teacher's
log-probs reach the loss in ``LossInputs.ref_logp``: the trainer loads the teacher as its reference
model (one frozen model, one forward path), so ``kl_coef`` > 0 adds the usual KL term, to the teacher.

Tokens sampled by another policy than pi_old (an engine whose kernels differ, or older weights under
asynchronous rollouts) carry an importance weight w_t = pi_train / pi_sampler (TIS or MIS), which
multiplies the advantages; the reverse-KL term takes the same w_t (``LossInputs.weight``), so at
each position its expectation is again over pi_train's token (per token, as the correction is; the
prefix was drawn by the sampler). The KL term to the teacher (kl_coef) is not weighted.

``distill_grpo_weight`` > 0 mixes in GRPO's clipped surrogate on the step's advantages:
loss = reverse KL + w * clipped surrogate, both aggregated as the run's ``aggregation``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.core.losses import clipped_surrogate, log_ratio, masked_mean
from grpo.core.policy_losses import POLICY_LOSSES, LossInputs, LossSettings, PolicyLoss, _with_terms


def reverse_kl_tokens(logp: Tensor, teacher_logp: Tensor) -> Tensor:
    """Per-token sampled reverse KL, log pi_theta(y) - log pi_teacher(y) on the student's own tokens y.
    [N, T], [N, T] -> [N, T] (the k1 estimator: unbiased for KL(pi_theta || pi_teacher), may be < 0)."""
    return logp - teacher_logp  # [N, T]


def distill_loss(inputs: LossInputs, settings: LossSettings) -> dict[str, Tensor]:
    """Reverse-KL on-policy distillation (module docstring), optionally + distill_grpo_weight * GRPO's
    clipped surrogate; the KL term (kl_coef, to the teacher) and the entropy term as every loss.

    inputs: [N, T] tensors, ``ref_logp`` the teacher's log-probs of the sampled tokens. Returns
    "loss", "policy_loss" (the distillation + surrogate part), "kl", "entropy" (when given),
    "distill_reverse_kl" (the mean sampled reverse KL, detached) and "ratio_mean"."""
    x, s = inputs, settings
    if x.ref_logp is None:
        raise ValueError("policy_loss 'distill' needs the teacher's log-probs (ref_logp)")
    ratio = torch.exp(log_ratio(x.logp, x.old_logp, x.mask, level=s.ratio_level))  # [N, T]
    rkl = reverse_kl_tokens(x.logp, x.ref_logp).detach()  # [N, T] sg(k)
    loss_tok = ratio * rkl  # [N, T] value r k; gradient r k grad log pi
    if x.weight is not None:  # tokens another policy sampled: the advantages' importance weight, here too
        loss_tok = loss_tok * x.weight  # [N, T]
    if s.distill_grpo_weight:
        pg_tok = clipped_surrogate(ratio, x.advantages, eps_low=s.eps_low, eps_high=s.eps_high,
                                   dual_clip=s.dual_clip, delta=s.clip_delta)  # [N, T]
        loss_tok = loss_tok + s.distill_grpo_weight * pg_tok  # [N, T]
    out: dict[str, Tensor] = {"distill_reverse_kl": masked_mean(rkl, x.mask)}
    _with_terms(loss_tok, loss_tok, x, s, out)
    out["ratio_mean"] = masked_mean(ratio.detach(), x.mask)
    return out


POLICY_LOSSES.register("distill", PolicyLoss(
    fn=distill_loss, needs_old_logp=True, needs_ref_logp=lambda s: True,
    needs_entropy=lambda s: s.entropy_coef > 0,
    # the reverse-KL term gives every sampled token a gradient, whatever its advantage
    zero_advantage_has_gradient=lambda s: True))
