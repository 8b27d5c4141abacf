"""rewards=judge against a real loopback HTTP server speaking OpenAI's chat API (tests/judge_server.py):
pointwise and group scoring, the model and key sent, timeouts, retries and failures counted through
the RewardRunner as for every remote reward, and the score parsers and settings checks."""

import pytest

from grpo.config import Config
from grpo.config.judge import judge_settings
from grpo.errors import ConfigError
from grpo.rewards.judge import JudgeReward, final_answer, parse_group_scores, parse_score
from grpo.rewards.reward import RewardOptions
from grpo.rewards.runner import RewardRunner
from tests.judge_server import JudgeServer

SAMPLES = [{"prompt": "What is 2 + 3?", "answer": "5"}] * 3 + [{"prompt": "What is 4 + 4?", "answer": "8"}] * 3
COMPLETIONS = ["2 + 3 = 5", "It is 6", "5", "8", "4 + 4 = 9", "The answer is 8."]
RIGHT = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]


@pytest.fixture
def server():
    s = JudgeServer()
    yield s
    s.close()


def _runner(url: str, *, timeout: float = 5.0, retries: int = 0, **judge) -> RewardRunner:
    settings = judge_settings(Config(rewards="judge", judge_url=url, **judge))
    return RewardRunner(["judge"], None, RewardOptions(timeout=timeout, retries=retries, judge=settings))


def test_pointwise_scores_each_completion(server):
    runner = _runner(server.url("/ok"), judge_model="my-judge", judge_max_tokens=4)
    res = runner.score(COMPLETIONS, SAMPLES)
    assert res.total.tolist() == RIGHT and res.failures == {"judge": 0}
    assert len(server.requests) == 6
    _, body, auth = server.requests[0]
    assert body["model"] == "my-judge" and body["max_tokens"] == 4 and body["temperature"] == 0.0
    assert auth is None  # no key in the environment: none sent
    sent = sorted(b["messages"][0]["content"] for _, b, _ in server.requests)
    assert any("Question: What is 4 + 4?\nReference answer: 8\nStudent's reply: 4 + 4 = 9" in c for c in sent)


def test_group_mode_one_request_per_group(server):
    runner = _runner(server.url("/ok"), judge_mode="group", judge_score="number", judge_score_scale=10.0)
    res = runner.score(COMPLETIONS, SAMPLES)
    assert res.total.tolist() == RIGHT
    assert len(server.requests) == 2  # two prompts, three completions each
    content = server.requests[0][1]["messages"][0]["content"]
    assert "1: 2 + 3 = 5\n2: It is 6\n3: 5" in content or "1: 8\n2: 4 + 4 = 9\n3: The answer is 8." in content


def test_timeouts_fail_the_samples_and_are_counted(server):
    runner = _runner(server.url("/slow"), timeout=0.5, retries=1)
    res = runner.score(COMPLETIONS[:2], SAMPLES[:2])
    assert res.failures == {"judge": 2} and res.failed.all()
    assert runner.timeouts == 2  # each completion's request, after its retry
    assert len(server.requests) == 4  # 2 requests x (1 + 1 retry)
    assert "TimeoutError" in res.first_errors["judge"]


def test_retryable_errors_are_retried(server):
    res = _runner(server.url("/flaky"), retries=2, judge_mode="group", judge_score="number",
                  judge_score_scale=10).score(COMPLETIONS, SAMPLES)
    assert res.total.tolist() == RIGHT and res.failures == {"judge": 0}
    assert len(server.requests) > 2  # some 503s were answered by another attempt


def test_key_from_the_named_environment_variable(server, monkeypatch):
    res = _runner(server.url("/keyed"), retries=3).score(COMPLETIONS[:1], SAMPLES[:1])
    assert res.failures == {"judge": 1} and "HTTP 401" in res.first_errors["judge"]
    assert len(server.requests) == 1  # a 401 is not retried
    monkeypatch.setenv("MY_JUDGE_KEY", "test-judge-key")
    res = _runner(server.url("/keyed"), judge_api_key_env="MY_JUDGE_KEY").score(COMPLETIONS[:1], SAMPLES[:1])
    assert res.total.tolist() == [1.0] and server.requests[-1][2] == "Bearer test-judge-key"


def test_unreadable_reply_is_a_counted_failure(server):
    res = _runner(server.url("/garbled")).score(COMPLETIONS[:3], SAMPLES[:3])
    assert res.failures == {"judge": 3} and "neither yes nor no" in res.first_errors["judge"]


def test_template_fields_come_from_the_sample(server):
    template = "Q {prompt} | gold {answer} | level {level} | reply: {completion}"
    res = _runner(server.url("/ok"), judge_template=template, judge_score="number").score(
        ["x"], [{"prompt": "p", "answer": "1", "level": "hard"}])
    assert server.requests[0][1]["messages"][0]["content"] == "Q p | gold 1 | level hard | reply: x"
    assert res.failures == {"judge": 1}  # the stand-in judge cannot read this template: a counted failure
    res = _runner(server.url("/ok"), judge_template="{missing} {completion}").score(["x"], SAMPLES[:1])
    assert "judge_template: {missing} is not a field of the sample" in res.first_errors["judge"]


def test_parsers_by_hand():
    assert parse_score("Yes, it is.", "yes_no") == 1.0 and parse_score(" no", "yes_no") == 0.0
    with pytest.raises(ValueError):
        parse_score("I think yes", "yes_no")
    assert parse_score("Score: 7.5 out of 10", "number") == 7.5
    assert parse_score("rating=[3]", r"\[(\d+)\]") == 3.0
    with pytest.raises(ValueError):
        parse_score("none here", "number")
    out = parse_group_scores("1: 10\n3: 2\n2) 5\n9: 1", "number", 4)
    assert out[:3] == [10.0, 5.0, 2.0] and isinstance(out[3], ValueError)


def test_settings_checked_with_the_config():
    base = dict(rewards="judge", judge_url="http://127.0.0.1:9/v1")
    for bad, field in [(dict(judge_url="ftp://x"), "judge_url"), (dict(judge_mode="pairs"), "judge_mode"),
                       (dict(judge_score="(unclosed"), "judge_score"), (dict(judge_score="no group"), "judge_score"),
                       (dict(judge_mode="group", judge_template="{prompt} {completion}"), "judge_template"),
                       (dict(judge_template="{completions}"), "judge_template")]:
        with pytest.raises(ConfigError, match=field):
            Config(**{**base, **bad})
    assert judge_settings(Config(**base, judge_mode="group", judge_template="{completions}")).mode == "group"
    with pytest.raises(ConfigError, match="judge_url"):  # resolved without its settings: the same check
        RewardRunner(["judge"], None, RewardOptions(timeout=1.0, retries=0))


def test_final_answer_field_shows_the_answer_alone(server):
    """{final_answer}: the last boxed content, else the last number, else "none"; a template may read it
    instead of {completion}, so the judge never sees the reasoning's words."""
    template = "gold {answer} | final {final_answer}"
    _runner(server.url("/ok"), judge_template=template, judge_score="number").score(
        ["so 2 + 3 = 5, I think", "\\boxed{7} not 9", "no idea"], SAMPLES[:3])
    sent = sorted(b["messages"][0]["content"] for _, b, _ in server.requests)
    assert sent == ["gold 5 | final 5", "gold 5 | final 7", "gold 5 | final none"]
    assert final_answer("\\boxed{}") == "none"
    judge = JudgeReward(judge_settings(Config(rewards="judge", judge_url=server.url("/ok"), judge_template=template)),
                        timeout=5.0)
    with pytest.raises(ConfigError, match="column 'final_answer' has the name of a field the judge fills in"):
        judge.render({**SAMPLES[0], "final_answer": "5"}, completion="5", final_answer="5")
    server.requests.clear()
    _runner(server.url("/ok"), judge_mode="group", judge_template="{final_answers}", judge_score="number").score(
        ["2 + 3 = 5", "It is 6"], SAMPLES[:2])
    assert server.requests[0][1]["messages"][0]["content"] == "1: 5\n2: 6"
    with pytest.raises(ConfigError, match="needs {completion} or {final_answer}"):
        judge_settings(Config(rewards="judge", judge_url="http://x/v1", judge_template="{answer}")).check()
    with pytest.raises(ConfigError, match="neither {completion} nor {final_answer}"):
        judge_settings(Config(rewards="judge", judge_url="http://x/v1", judge_mode="group",
                              judge_template="{completions} {final_answer}")).check()
