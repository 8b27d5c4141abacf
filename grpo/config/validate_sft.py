"""Rules of the fields beside GRPO's: the teacher of on-policy distillation and `grpo sft` (each error
names its field); the judge's are config/judge.py's."""

from __future__ import annotations

from grpo.core import LossSettings, get_policy_loss
from grpo.errors import ConfigError
from grpo.config.composition import TEACHER_RESET
from grpo.config.judge import validate_judge


def validate_teacher(c) -> None:
    """A loss that reads the reference's log-probs whatever beta is (distill) needs a teacher to read
    them from; a teacher stays the reference for the whole run."""
    needs = get_policy_loss(c.policy_loss).needs_ref_logp(LossSettings(kl_coef=0.0))
    if needs and not c.teacher:
        raise ConfigError(f"teacher: policy_loss={c.policy_loss} reads a teacher's log-probs of the student's "
                          "samples; set teacher=<hub id, model folder or run folder>")
    if c.teacher and c.ref_reset_steps:
        raise ConfigError(f"ref_reset_steps: {TEACHER_RESET}")
    if c.distill_grpo_weight < 0:
        raise ConfigError(f"distill_grpo_weight: must be >= 0, got {c.distill_grpo_weight}")


def validate_sft(c) -> None:
    if c.sft_epochs <= 0:
        raise ConfigError(f"sft_epochs: must be > 0, got {c.sft_epochs}")
    if c.sft_batch_size < 1:
        raise ConfigError(f"sft_batch_size: must be >= 1, got {c.sft_batch_size}")
    if c.sft_max_length < 2:
        raise ConfigError(f"sft_max_length: must be >= 2, got {c.sft_max_length}")
    if not 0.0 <= c.sft_eval_share < 1.0:
        raise ConfigError(f"sft_eval_share: must be in [0, 1), got {c.sft_eval_share}")


def validate_beside_grpo(c) -> None:
    validate_teacher(c)
    validate_judge(c)
    validate_sft(c)
