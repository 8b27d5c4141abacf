"""Reward functions that tests load by module:function path, as a user would."""


def digit_share(completion: str, sample: dict) -> float:
    """Share of characters that are digits: varies across random completions, so groups have signal."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def always_raises(completion: str, sample: dict) -> float:
    raise RuntimeError("this reward is broken on purpose")


calls = {"n": 0}


def sometimes_bad(completion: str, sample: dict):
    """Cycles through a good value and every kind of bad return value."""
    calls["n"] += 1
    bad = [None, float("nan"), float("inf"), "0.5", [1.0]]
    k = calls["n"] % (len(bad) + 1)
    return 0.5 if k == len(bad) else bad[k]
