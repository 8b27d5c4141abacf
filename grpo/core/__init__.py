"""Pure tensor mathematics of GRPO and its variants: no config objects, I/O, devices or processes."""

from grpo.core.advantages import (ESTIMATORS, GROUP_ESTIMATORS, compute_advantages, gae, get_estimator,
                                  kl_shaped_rewards, process_advantages, whiten)
from grpo.core.losses import (AGGREGATIONS, KL_ESTIMATORS, RATIO_LEVELS, aggregate, clipped_surrogate,
                              clipped_value_loss,
                              indexed_logprobs_and_entropy, kl_penalty, log_ratio, masked_mean, masked_moments,
                              token_logprobs, token_logprobs_and_entropy)
from grpo.core.metrics import (advantage_group_variance, clip_fractions, explained_variance, reward_stats,
                               zero_variance_share)
from grpo.core.objective import grpo_loss, policy_loss
from grpo.core.policy_losses import (POLICY_LOSSES, LossInputs, LossSettings, PolicyLoss, clip_loss,
                                     get_policy_loss)
from grpo.core.rollout_correction import (CORRECTION_LEVELS, CORRECTION_MODES, Correction, correction_weights,
                                         mismatch_kl)
from grpo.core.stability import (COV_MODES, PF_MODES, high_covariance_tokens, informative_groups, overlong_penalty,
                                 policy_filter, reward_cv, token_covariance)

__all__ = [
    "AGGREGATIONS", "ESTIMATORS", "GROUP_ESTIMATORS", "KL_ESTIMATORS", "RATIO_LEVELS",
    "advantage_group_variance", "aggregate", "clip_fractions", "clipped_surrogate", "clipped_value_loss",
    "compute_advantages", "explained_variance", "kl_shaped_rewards",
    "gae", "get_estimator", "grpo_loss", "indexed_logprobs_and_entropy", "kl_penalty", "log_ratio", "masked_mean",
    "masked_moments", "policy_loss", "POLICY_LOSSES", "LossInputs", "LossSettings", "PolicyLoss", "clip_loss",
    "get_policy_loss", "process_advantages", "reward_stats", "token_logprobs",
    "token_logprobs_and_entropy", "whiten", "zero_variance_share",
    "COV_MODES", "PF_MODES", "high_covariance_tokens", "informative_groups", "overlong_penalty", "policy_filter",
    "reward_cv", "token_covariance",
    "CORRECTION_LEVELS", "CORRECTION_MODES", "Correction", "correction_weights", "mismatch_kl",
]
