"""async def rewards run concurrently; URL rewards against a real local HTTP server (issue 27): a
deadline, retries, and the failure accounting of every other reward."""

import pytest

from grpo.rewards.remote import AsyncReward, HttpReward
from grpo.rewards.reward import RewardOptions
from grpo.rewards.runner import RewardRunner
from tests import rewards_for_tests as rft
from tests.reward_server import RewardServer

ASYNC = "tests.rewards_for_tests:async_digit_share"


@pytest.fixture(scope="module")
def server():
    srv = RewardServer()
    yield srv
    srv.close()


def _samples(n):
    return [{"prompt": f"p{i}", "answer": "x" * i} for i in range(n)]


def test_async_reward_calls_overlap_up_to_the_limit_and_fail_alone():
    # with a deadline, an async reward stays in the trainer's process; the plain one goes to the workers
    workers = RewardRunner([ASYNC, "tests.rewards_for_tests:digit_share"], None, RewardOptions(timeout=5.0, retries=0))
    assert isinstance(workers.fns[ASYNC].fn, AsyncReward) and workers.fns[ASYNC].own_deadline
    assert workers._worker_names == ["tests.rewards_for_tests:digit_share"]
    runner = RewardRunner([ASYNC, "tests.rewards_for_tests:digit_share"], None,
                          RewardOptions(timeout=0.0, retries=0, concurrency=3))
    try:
        comps = ["12ab", "raise", "9", "abc", "1", "22", "x3"]
        rft.in_flight["max"] = 0
        res = runner.score(comps, _samples(len(comps)))
        assert rft.in_flight["max"] == 3  # three at once: all of them were started, never more than allowed
        want = [rft.digit_share(c, {}) for c in comps]
        got = res.per_reward[ASYNC].tolist()
        assert got[1] != got[1] and [g for i, g in enumerate(got) if i != 1] == [w for i, w in enumerate(want) if i != 1]
        assert res.failures == {ASYNC: 1, "tests.rewards_for_tests:digit_share": 0} and runner.timeouts == 0
    finally:
        runner.close()


def test_async_reward_past_its_deadline_is_cancelled_and_counted():
    runner = RewardRunner([ASYNC], None, RewardOptions(timeout=0.3, retries=0))
    comps = ["1", "hang", "2a"]
    res = runner.score(comps, _samples(3))
    vals = res.per_reward[ASYNC].tolist()
    assert vals[0] == 1.0 and vals[2] == 0.5 and vals[1] != vals[1]
    assert res.failures[ASYNC] == 1 and runner.timeouts == 1 and rft.in_flight["now"] == 0  # cancelled, not left
    assert "TimeoutError" in res.messages[0] and "0.3 s deadline" in res.messages[0]


def test_url_reward_scores_a_json_batch_with_the_samples_fields(server):
    url = server.url("/ok")
    runner = RewardRunner([url], None, RewardOptions(timeout=5.0, retries=0))
    comps, samples = ["a", "bbb", ""], _samples(3)
    n_before = len(server.requests)
    res = runner.score(comps, samples)
    assert res.per_reward[url].tolist() == [1.0, 4.0, 2.0] and res.failures == {url: 0}
    assert len(server.requests) == n_before + 1  # one request per batch
    path, batch = server.requests[-1]
    assert path == "/ok" and batch == {"prompts": ["p0", "p1", "p2"], "completions": comps, "samples": samples}


def test_url_reward_null_is_not_applicable_to_its_sample(server):
    """null is None: not applicable to that row; with no other reward the row cannot be scored (a
    counted failure, left out of the loss), while the reward itself did not fail."""
    url = server.url("/null")
    res = RewardRunner([url], None, RewardOptions(timeout=5.0, retries=0)).score(["a", "null"], _samples(2))
    vals = res.per_reward[url].tolist()
    assert vals[0] == 1.0 and vals[1] != vals[1] and res.failures == {url: 0}
    assert res.not_applicable == {url: 1} and res.unscorable == 1 and res.failed.tolist() == [False, True]


def test_url_reward_retries_a_503_and_gets_the_scores(server):
    reward = HttpReward(server.url("/flaky"), timeout=5.0, retries=1, backoff=0.01)
    server.requests.clear()  # /flaky answers 503 to the odd-numbered requests of the list
    assert reward(["ab"], _samples(1)) == [2.0] and len(server.requests) == 2
    server.requests.clear()
    no_retry = HttpReward(server.url("/flaky"), timeout=5.0, retries=0)
    assert isinstance(no_retry(["ab"], _samples(1))[0], ConnectionError) and len(server.requests) == 1


@pytest.mark.parametrize("path, kind, text, attempts", [
    ("/error", "ConnectionError", "HTTP 500", 3),          # retried, then the batch fails
    ("/wrong", "ValueError", "returned 2 scores for 3 completions", 1),  # not retried
    ("/notjson", "ValueError", "not JSON with a 'scores' list", 1),
])
def test_url_reward_failures_fail_the_whole_batch_and_are_counted(server, path, kind, text, attempts):
    url = server.url(path)
    runner = RewardRunner([url, ASYNC], None, RewardOptions(timeout=5.0, retries=2))  # the other reward still scores
    try:
        server.requests.clear()
        res = runner.score(["1", "a", "22"], _samples(3))
        assert res.failures[url] == 3 and res.failures[ASYNC] == 0 and res.per_reward[ASYNC].tolist() == [1, 0, 1]
        assert res.failed.tolist() == [True] * 3 and runner.timeouts == 0
        assert len(server.requests) == attempts
        assert kind in res.messages[0] and text in res.messages[0], res.messages
    finally:
        runner.close()


def test_url_reward_past_its_deadline_counts_one_timeout_per_batch(server):
    url = server.url("/slow")
    runner = RewardRunner([url], None, RewardOptions(timeout=0.4, retries=1))
    server.requests.clear()
    res = runner.score(["a", "b"], _samples(2))
    assert res.failures[url] == 2 and runner.timeouts == 1 and len(server.requests) == 2
    assert "TimeoutError" in res.messages[0] and "0.4 s deadline" in res.messages[0] and "2 attempts" in res.messages[0]
    assert runner.state_dict()["reward_timeouts"] == 1  # a resumed run counts on from here


def test_url_reward_refused_connection_is_a_counted_failure():
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/score"
    res = RewardRunner([url], None, RewardOptions(timeout=2.0, retries=0)).score(["a"], _samples(1))
    assert res.failures[url] == 1 and "ConnectionError" in res.messages[0]


def test_url_reward_sends_the_key_from_the_environment(server, monkeypatch):
    monkeypatch.delenv("GRPO_REWARD_API_KEY", raising=False)
    reward = HttpReward(server.url("/keyed"), timeout=5.0, retries=0)
    out = reward(["ab"], _samples(1))
    assert isinstance(out[0], RuntimeError) and "HTTP 401" in str(out[0])
    monkeypatch.setenv("GRPO_REWARD_API_KEY", "test-reward-key")
    assert reward(["ab"], _samples(1)) == [2.0]


def test_url_reward_answer_over_the_cap_fails_the_batch_without_retry(server, monkeypatch):
    from grpo.rewards import remote

    monkeypatch.setattr(remote, "MAX_REPLY_BYTES", 10_000)
    before = len(server.requests)
    out = HttpReward(server.url("/huge"), timeout=5.0, retries=2)(["ab", "c"], _samples(2))
    assert all(isinstance(x, ValueError) and "over the cap of 10000" in str(x) for x in out)
    assert len(server.requests) == before + 1


def test_a_timed_out_attempt_leaves_no_thread_behind(server):
    import threading

    def ours():  # this process's threads but the test server's handlers (which still sleep)
        return {t for t in threading.enumerate() if "process_request_thread" not in t.name}

    before = ours()
    out = HttpReward(server.url("/slow"), timeout=0.3, retries=1, backoff=0.01)(["ab"], _samples(1))
    assert isinstance(out[0], TimeoutError)
    assert ours() == before  # nothing of the client's still reads
