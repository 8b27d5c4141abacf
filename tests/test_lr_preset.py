"""lr_preset=warmup100_cosine: linear warm-up over 100 steps to a peak of 1.2e-6, then cosine decay;
an explicit setting wins; an unknown preset lists the valid ones."""

import math

import pytest

from grpo.config import Config
from grpo.errors import ConfigError
from grpo.train.optim import lr_lambda
from grpo.train.settings import update_settings


def test_the_preset_fills_the_schedule():
    c = Config(lr_preset="warmup100_cosine", max_steps=300)
    assert (c.learning_rate, c.warmup_steps, c.lr_scheduler_type) == (1.2e-6, 100, "cosine")
    settings = update_settings(c)  # what the Updater is built with
    assert settings.learning_rate == 1.2e-6
    f = lr_lambda(settings.schedule, per_step=1)
    assert f(0) == pytest.approx(1 / 101) and f(99) == pytest.approx(100 / 101)
    assert f(100) == pytest.approx(1.0)  # the peak, 1.2e-6
    assert f(200) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f(299) == pytest.approx(0.5 * (1 + math.cos(math.pi * 199 / 200)))


def test_an_explicit_setting_wins_and_unknown_names_are_listed():
    assert Config(lr_preset="warmup100_cosine", learning_rate=5e-6).learning_rate == 5e-6
    assert Config().learning_rate == 3e-5 and Config().warmup_steps == 0
    with pytest.raises(ConfigError, match=r"^lr_preset: unknown learning-rate preset 'fast'; valid: none, warmup100_cosine"):
        Config(lr_preset="fast")
