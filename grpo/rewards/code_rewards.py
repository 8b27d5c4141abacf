"""The code rewards: each step's programs graded by the sandboxed grader (grpo.rewards.code) in this
process, or, with ``GRPO_CODE_GRADER_URL`` set, by grading services on other machines
(grpo.rewards.grading_service). The registry entries (grpo.rewards.builtin) declare their start-up
check (``check_code_sandbox``) and their validity check (``program_parses``)."""

from __future__ import annotations

from grpo.rewards.code import default_grader, grade_batch
from grpo.rewards.grading_service import check_remote, grade_remotely, remote_urls


def code_reward(completion: str, sample: dict) -> float:
    """Share of the sample's tests (``tests`` asserts or ``io`` cases) the completion's program passes."""
    return default_grader().grade(completion, sample)


def code_strict_reward(completion: str, sample: dict) -> float:
    """1.0 when the completion's program passes every test of the sample, else 0.0."""
    return float(default_grader().grade(completion, sample) == 1.0)


def grade_step(completions: list[str], samples: list[dict], *, strict: bool) -> list:
    """All completions of a step graded concurrently, here or (GRPO_CODE_GRADER_URL) by grading services
    on other machines."""
    if remote_urls():
        return grade_remotely(completions, samples, strict=strict)
    return grade_batch(default_grader(), completions, samples, strict=strict)


def code_batch_reward(completions: list[str], samples: list[dict]) -> list:
    """Share of each sample's tests (``tests`` asserts or ``io`` cases) its completion's program passes,
    a step's programs graded concurrently in the sandbox."""
    return grade_step(completions, samples, strict=False)


def code_strict_batch_reward(completions: list[str], samples: list[dict]) -> list:
    """1.0 for each completion whose program passes every test of its sample, else 0.0; a step's
    programs graded concurrently in the sandbox."""
    return grade_step(completions, samples, strict=True)


def check_code_sandbox() -> None:
    """Start-up check for the code rewards: raises SandboxError when no sandbox can run (with
    GRPO_CODE_GRADER_URL set: when a grading service does not answer)."""
    if remote_urls():
        check_remote()
    else:
        default_grader()
