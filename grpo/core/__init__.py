"""Pure tensor mathematics of GRPO and its variants: no config objects, I/O, devices or processes."""

from grpo.core.advantages import (ESTIMATORS, Estimator, MULTI_OBJECTIVE_AGGREGATIONS, compute_advantages,
                                  gae, gdpo_advantages, get_estimator, kl_shaped_rewards, process_advantages, whiten)
from grpo.core.losses import (AGGREGATIONS, KL_ESTIMATORS, RATIO_LEVELS, aggregate, clipped_surrogate,
                              clipped_value_loss,
                              indexed_logprobs_and_entropy, kl_penalty, log_ratio, masked_mean, masked_moments,
                              token_logprobs, token_logprobs_and_entropy)
from grpo.core.metrics import (advantage_group_variance, clip_fractions, distinct_n, explained_variance,
                               group_advantage_std, group_outcome_shares, loop_flags, reward_stats,
                               zero_variance_share)
from grpo.core.objective import grpo_loss, policy_loss
from grpo.core.distill import distill_loss, reverse_kl_tokens  # registers the "distill" policy loss
from grpo.core.vespo import vespo_loss, vespo_weights  # registers the "vespo" policy loss
from grpo.core.policy_losses import (POLICY_LOSSES, LossInputs, LossSettings, PolicyLoss, cispo_loss, clip_loss,
                                     get_policy_loss, gmpo_loss, sapo_loss)
from grpo.core.stability import (COV_MODES, PF_MODES, REWARD_TRANSFORMS, high_covariance_tokens, informative_groups,
                                 overlong_penalty, policy_filter, reward_cv, token_covariance, transform_scores)
from grpo.core.token_masks import high_entropy_mask, off_policy_sequence_mask, policy_gradient_keep
from grpo.core.reward_model import (bradley_terry_loss, distillation_loss, group_pairs, head_scores,
                                    label_word_margin, pairwise_accuracy, pointwise_accuracy, pointwise_loss)
from grpo.core.token_weights import token_weights, weighted_advantages
from grpo.core.sampling import processed_logprobs, processed_scores, seen_tokens, truncates
from grpo.core.rollout_correction import (CORRECTION_LEVELS, CORRECTION_MODES, Correction, correction_weights,
                                         mismatch_kl)

__all__ = [
    "AGGREGATIONS", "ESTIMATORS", "Estimator", "KL_ESTIMATORS", "RATIO_LEVELS",
    "advantage_group_variance", "aggregate", "clip_fractions", "clipped_surrogate", "clipped_value_loss",
    "compute_advantages", "explained_variance", "kl_shaped_rewards",
    "gae", "get_estimator", "grpo_loss", "indexed_logprobs_and_entropy", "kl_penalty", "log_ratio", "masked_mean",
    "masked_moments", "policy_loss", "POLICY_LOSSES", "LossInputs", "LossSettings", "PolicyLoss", "clip_loss",
    "get_policy_loss", "process_advantages", "reward_stats", "token_logprobs",
    "token_logprobs_and_entropy", "whiten", "zero_variance_share",
    "COV_MODES", "PF_MODES", "high_covariance_tokens", "informative_groups", "overlong_penalty", "policy_filter",
    "reward_cv", "token_covariance",
    "cispo_loss", "gmpo_loss", "sapo_loss", "high_entropy_mask", "off_policy_sequence_mask", "policy_gradient_keep",
    "MULTI_OBJECTIVE_AGGREGATIONS", "gdpo_advantages",
    "distinct_n", "group_advantage_std", "group_outcome_shares", "loop_flags", "REWARD_TRANSFORMS",
    "transform_scores",
    "token_weights", "weighted_advantages", "processed_logprobs", "processed_scores", "seen_tokens", "truncates",
    "bradley_terry_loss", "distillation_loss", "group_pairs", "head_scores", "pairwise_accuracy",
    "label_word_margin", "pointwise_accuracy", "pointwise_loss",
    "distill_loss", "reverse_kl_tokens", "vespo_loss", "vespo_weights",
    "CORRECTION_LEVELS", "CORRECTION_MODES", "Correction", "correction_weights", "mismatch_kl",
]
