"""The judge reward's settings from a config's ``judge_*`` fields, and their check (each error names
its field)."""

from __future__ import annotations

from grpo.rewards.judge import JudgeSettings


def judge_settings(c) -> JudgeSettings:
    """The judge reward's settings, its ``judge_*`` fields: built here, in the config package, so that
    validation checks them before anything loads; train/settings.py hands them to the rewards in
    RewardOptions."""
    return JudgeSettings(url=c.judge_url, model=c.judge_model, api_key_env=c.judge_api_key_env,
                         template=c.judge_template, score=c.judge_score, score_scale=c.judge_score_scale,
                         mode=c.judge_mode, max_tokens=c.judge_max_tokens, temperature=c.judge_temperature)


def validate_judge(c) -> None:
    """rewards=judge: its settings checked before anything loads (JudgeSettings.check)."""
    if "judge" in c.reward_names:
        judge_settings(c).check()
