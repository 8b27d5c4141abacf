"""A reward of TRL's batch form that waits, as a judge model does, before it scores."""

from __future__ import annotations

import time

from tests.rewards_for_tests import digit_share

WAIT_SECONDS = 1.0


def slow_digit_share(completions, **kw):
    """digit_share of each completion, after WAIT_SECONDS per batch."""
    time.sleep(WAIT_SECONDS)
    return [digit_share(c, {}) for c in completions]
