"""Reward functions that tests load by module:function path, as a user would."""
import os
import time


def digit_share(completion: str, sample: dict) -> float:
    """Share of characters that are digits: varies across random completions, so groups have signal."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def always_raises(completion: str, sample: dict) -> float:
    raise RuntimeError("this reward is broken on purpose")


calls = {"n": 0}


def sometimes_bad(completion: str, sample: dict):
    """Cycles through a good value and every kind of value that fails its completion (None: the
    only reward does not apply, so nothing scores the row)."""
    calls["n"] += 1
    bad = [None, float("nan"), float("inf")]
    k = calls["n"] % (len(bad) + 1)
    return 0.5 if k == len(bad) else bad[k]


def hangs_on_hang(completion: str, sample: dict) -> float:
    """Hangs forever on the completion 'hang'; otherwise 1.0."""
    if completion == "hang":
        while True:
            time.sleep(1)
    return 1.0


def exits_on_exit(completion: str, sample: dict) -> float:
    """Kills its own process on 'exit', raises on 'raise'; otherwise 1.0."""
    if completion == "exit":
        os._exit(0)
    if completion == "raise":
        raise ValueError("bad sample")
    return 1.0


_per_process = {"n": 0}


def hangs_every_third(completion: str, sample: dict) -> float:
    """Hangs on every third call in its process (a fresh worker starts counting again)."""
    _per_process["n"] += 1
    if _per_process["n"] % 3 == 0:
        while True:
            time.sleep(1)
    return digit_share(completion, sample)


def has_digit(completion: str, sample: dict) -> float:
    """1.0 when the completion holds any digit: random tiny-model completions often all miss, so many
    groups have zero reward variance."""
    return float(any(c.isdigit() for c in completion))


_calls = {"n": 0}


def sigterm_on_rank1_step2(completion: str, sample: dict) -> float:
    """digit_share; on torchrun rank 1 only, the process sends itself SIGTERM while scoring its
    second step (its 9th completion: 2 prompts x 4 per step), as a scheduler might signal one rank."""
    import signal

    if os.environ.get("RANK") == "1":
        _calls["n"] += 1
        if _calls["n"] == 9:
            os.kill(os.getpid(), signal.SIGTERM)
    return digit_share(completion, sample)


def kill_engine_on_rank1_step2(completion: str, sample: dict) -> float:
    """digit_share; on torchrun rank 1 only, while scoring its second draw (its 9th completion), the
    process kills its own children (its asynchronous rollouts' engine process) with SIGKILL, as the
    kernel's out-of-memory killer might: one process fails where the others do not."""
    import signal

    if os.environ.get("RANK") == "1":
        _calls["n"] += 1
        if _calls["n"] == 9:
            me = str(os.getpid())
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    parent = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]
                except OSError:
                    continue
                if parent == me:
                    os.kill(int(pid), signal.SIGKILL)
    return digit_share(completion, sample)


def odd_length(completion: str, sample: dict) -> float:
    """1.0 for a completion of odd length: a verifier a random model passes about half the time."""
    return float(len(completion) % 2)


in_flight = {"now": 0, "max": 0}


async def async_digit_share(completion: str, sample: dict) -> float:
    """digit_share, awaiting a short sleep in between (so a batch's calls overlap); 'hang' never
    returns, 'raise' raises. Records the most calls in flight at once."""
    import asyncio

    in_flight["now"] += 1
    in_flight["max"] = max(in_flight["max"], in_flight["now"])
    try:
        await asyncio.sleep(3600 if completion == "hang" else 0.01)
        if completion == "raise":
            raise ValueError("bad sample")
        return digit_share(completion, sample)
    finally:
        in_flight["now"] -= 1


counted = {"n": 0, "fail_from": 0, "sigterm_at": 0}  # calls in this process; tests set the rest


def counting(completion: str, sample: dict) -> float:
    """digit_share, counting its calls in ``counted["n"]``: from call ``fail_from`` on (when set) it
    raises, and on call ``sigterm_at`` (when set) it sends its own process SIGTERM, as a scheduler
    would, before returning."""
    import signal

    counted["n"] += 1
    if counted["fail_from"] and counted["n"] >= counted["fail_from"]:
        raise ConnectionError("the grading service went away")
    if counted["n"] == counted["sigterm_at"]:
        os.kill(os.getpid(), signal.SIGTERM)
    return digit_share(completion, sample)


def fails_every_other_call(completion: str, sample: dict) -> float:
    """Raises on every second call in this process (counted in ``counted["n"]``), else digit_share:
    exactly half of a step with an even number of completions fails."""
    counted["n"] += 1
    if counted["n"] % 2 == 0:
        raise ValueError("flaky grader")
    return digit_share(completion, sample)


def trl_digit_share(completions, prompts, completion_ids, answer, trainer_state, **kwargs):
    """digit_share in TRL's batch form: one call per batch with keyword lists, a list back."""
    assert len(completions) == len(prompts) == len(completion_ids) == len(answer)
    assert trainer_state.max_steps > 0
    return [digit_share(c, {}) for c in completions]


def trl_returns_a_string(completions, **kwargs):
    return "0.5"


def returns_a_list(completion: str, sample: dict):
    """A TRL-style body in grpo's per-completion form: the bug the shape check names."""
    return [0.0, 0.0, 0.0, 0.0]


def last_number(completion: str, sample: dict) -> float:
    """The README quickstart's reward: 1.0 when the last number in the completion is the row's answer."""
    import re

    numbers = re.findall(r"-?\d+", completion)
    return float(bool(numbers) and numbers[-1] == sample["answer"])


def answer_is_odd(completion: str, sample: dict) -> float:
    """1.0 on the rows whose answer is odd, whatever the completion: known pass rates per prompt."""
    return float(int(sample["answer"]) % 2)


def steps_or_hang(completion: str, sample: dict) -> list:
    """A step reward (arithmetic_steps) that hangs forever on the completion 'hang'."""
    from grpo.rewards.steps import arithmetic_steps

    while completion == "hang":
        time.sleep(1)
    return arithmetic_steps(completion, sample)
