"""The serving engines' continuous batching, observed by counting steps (never by timing): rows of
different lengths in one batch give the tokens each gives alone (and greedy ``generate``'s); a
request that arrives mid-batch makes its first token in the next step, its long prompt prefilled in
chunks while the running rows keep decoding; the prefix cache gives the same tokens as no cache and
feeds fewer; the paged decode step equals HF's forward (C and PyTorch attention); the scheduler
lets the fallback take a step only while the GRPO rows that can make their deadline still would."""

from __future__ import annotations

import time

import pytest
import torch

from grpo.rollout import native
from grpo.rollout.paged import PAGE, PagedDecoder
from grpo.serve.batcher import Lane, Scheduler
from grpo.serve.engines import FastServeEngine, HFServeEngine, Job
from grpo.errors import ConfigError
from tests.conftest import TEST_SEED, build_tiny_model, build_tokenizer, need_native

PROMPTS = ["What is 2 + 3?", "hi", "Once upon a time there was a prompt that went on for a while. " * 3]


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    model = build_tiny_model(len(tok), seed=TEST_SEED, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return tok, model


def _engine(kind: str, tiny, **kw):
    tok, model = tiny
    if kind == "hf":
        return HFServeEngine(model, tok, max_rows=4, max_len=512)
    engine = FastServeEngine(model, tok, kernels="mkl", max_rows=4, max_len=512, **kw)
    if kind == "fast-torch":  # the PyTorch attention (no C compiler), the same pages
        engine.decoder = PagedDecoder(model, pages=engine.pool.pages, lib=None)
    return engine


def _run(engine, jobs):
    for j in jobs:
        engine.admit(j)
    while engine.rows:
        engine.step()
    return [j.future.result() for j in jobs]


def _greedy(tiny, prompt: str, cap: int) -> str:
    tok, model = tiny
    ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=cap, do_sample=False, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


KINDS = ["fast", "hf"] + (["fast-torch"] if native.library() is not None else [])


@pytest.mark.parametrize("kind", KINDS)
def test_rows_of_different_lengths_in_one_batch_give_the_tokens_each_gives_alone(tiny, kind):
    engine = _engine(kind, tiny)
    caps = [12, 3, 9]
    jobs = [Job(p, cap=c) for p, c in zip(PROMPTS, caps)]
    together = _run(engine, jobs)
    steps_together = engine.steps
    alone = [_run(engine, [Job(p, cap=c)])[0] for p, c in zip(PROMPTS, caps)]
    assert [g.text for g in together] == [a.text for a in alone] == [_greedy(tiny, p, c) for p, c in zip(PROMPTS, caps)]
    tokens = [g.tokens for g in together]  # each at its own cap or its EOS (the random model may end early)
    assert tokens == [a.tokens for a in alone] and all(t <= c for t, c in zip(tokens, caps))
    # the mechanism: the rows shared their steps (the longest row's count, not the sum)
    assert steps_together <= max(tokens) + 1 and engine.steps - steps_together >= sum(tokens)


@pytest.mark.parametrize("kind", ["fast", "hf"])
def test_a_request_arriving_mid_batch_starts_decoding_in_the_next_step(tiny, kind):
    engine = _engine(kind, tiny)
    first = Job(PROMPTS[0], cap=20)
    engine.admit(first)
    for _ in range(3):
        engine.step()
    late = Job(PROMPTS[1], cap=6)
    running = engine.rows[0] if engine.rows else None  # None: the first ended at an EOS already
    engine.admit(late)
    row = engine.rows[-1]
    engine.step()  # the very next step: its prefill (and first token) beside the running row's token
    assert row.first_token_step == 3 and len(row.out) == 1
    assert running is None or first.future.done() or len(running.out) == 4
    while engine.rows:
        engine.step()
    assert late.future.result().text == _greedy(tiny, PROMPTS[1], 6)
    assert first.future.result().text == _greedy(tiny, PROMPTS[0], 20)


def test_a_long_prompt_is_prefilled_in_chunks_while_the_running_row_decodes(tiny):
    tok, _ = tiny
    engine = _engine("fast", tiny, max_step_tokens=24)  # at least max_rows + one page: 4 + 16 -> 24
    running = Job(PROMPTS[0], cap=30)
    engine.admit(running)
    engine.step()
    long = Job(PROMPTS[2], cap=5)
    n_long = len(tok(PROMPTS[2], add_special_tokens=False)["input_ids"])
    engine.admit(long)
    chunks = -(-n_long // (24 - 1))  # the running row takes one token of each step's budget
    for _ in range(chunks):
        before = len(engine.rows[0].out)
        engine.step()
        assert len(engine.rows[0].out) == before + 1  # the running row decoded in every prefill step
    assert len(engine.rows[1].out) == 1 and engine.rows[1].first_token_step == chunks  # prefilled over `chunks` steps
    while engine.rows:
        engine.step()
    assert long.future.result().text == _greedy(tiny, PROMPTS[2], 5)
    assert running.future.result().text == _greedy(tiny, PROMPTS[0], 30)


def test_the_prefix_cache_gives_the_same_tokens_as_no_cache_and_computes_the_prefix_once(tiny):
    system = "You are a helpful assistant. Answer briefly, and state the result. "  # 67 tokens: 4 full pages
    prompts = [system + q for q in ("What is 2 + 3?", "What is 10 + 7?", "hi there", "Name a colour.")]
    prompts.append(system[:2 * PAGE])  # exactly two pages: its last token is computed, not taken
    on, off = _engine("fast", tiny, prefix_pages=64), _engine("fast", tiny, prefix_pages=0)
    cached = [_run(on, [Job(p, cap=8)])[0].text for p in prompts[:2]]
    cached += [g.text for g in _run(on, [Job(p, cap=8) for p in prompts[2:]])]  # together, sharing pages
    plain = [_run(off, [Job(p, cap=8)])[0].text for p in prompts]
    assert cached == plain
    assert on.prefix.hits >= 4 * (len(prompts) - 2) and on.fed < off.fed - 3 * 4 * PAGE
    assert off.prefix.hits == 0 and not off.prefix.entries
    assert on.pool.available() == on.pool.pages - len(on.prefix.entries)  # every row's pages came back
    small = _engine("fast", tiny, prefix_pages=2)  # a cache of two pages: the rest evicted, the tokens the same
    assert [_run(small, [Job(p, cap=8)])[0].text for p in prompts] == plain and len(small.prefix.entries) <= 2


def test_bfloat16_weights_serve_the_float32_distribution_to_their_rounding(tiny, tmp_path, monkeypatch):
    """--dtype bfloat16: every product reads the weights rounded to bfloat16, so the next-token
    log-probs move by that rounding (not 0, and small); a float32 kernel cannot be forced on it."""
    need_native()
    monkeypatch.setenv("GRPO_CACHE", str(tmp_path))
    tok, model = tiny
    exact = _engine("fast", tiny)
    half = FastServeEngine(model, tok, kernels="auto", dtype="bfloat16", max_rows=4, max_len=512)
    moved = []
    for p in PROMPTS:
        a = _run(exact, [Job(p, cap=1, top_logprobs=5)])[0].logprobs[0]
        b = dict(_run(half, [Job(p, cap=1, top_logprobs=5)])[0].logprobs[0].top)
        moved += [abs(lp - b[t]) for t, lp in a.top if t in b]
    # float32 kernels differ from each other by ~1e-6 here, the rounding by ~5e-4
    assert len(moved) >= 10 and 2e-5 < max(moved) < 0.05, max(moved)
    with pytest.raises(ConfigError, match="mkl reads the weights in float32; this decode runs bfloat16"):
        FastServeEngine(model, tok, kernels="mkl", dtype="bfloat16", max_rows=4, max_len=512)


@pytest.mark.parametrize("use_native", [False, True])
def test_the_paged_step_equals_hf_forward_for_chunks_of_rows_of_any_length(tiny, use_native):
    lib = native.library() if use_native else None
    if use_native and lib is None:
        pytest.skip(f"decode_ops.c does not build here: {native.unavailable_reason()}")
    _, model = tiny
    torch.manual_seed(0)
    ids = [torch.randint(0, 200, (n,)) for n in (5, 23, 40)]
    with torch.no_grad():
        want = [model.model(input_ids=x[None]).last_hidden_state[0] for x in ids]  # [n, H]
    decoder = PagedDecoder(model, pages=16, lib=lib)
    table = torch.tensor([[3, 1, 2], [0, 7, 5], [9, 8, 6]])  # pages in any order
    got = {0: [], 1: [], 2: []}
    for feed in ([(0, 0, 5), (1, 0, 10), (2, 0, 17)], [(1, 10, 23), (2, 17, 40)]):  # (row, from, to)
        tokens = torch.cat([ids[r][a:b] for r, a, b in feed])
        rows = torch.cat([torch.full((b - a,), r) for r, a, b in feed])
        pos = torch.cat([torch.arange(a, b) for _, a, b in feed])
        h, i = decoder.forward(tokens, table, rows, pos), 0
        for r, a, b in feed:
            got[r].append(h[i:i + b - a])
            i += b - a
    for r in range(3):
        torch.testing.assert_close(torch.cat(got[r]), want[r], atol=1e-5, rtol=1e-4)


def test_the_fallback_takes_a_step_only_while_the_grpo_rows_that_can_meet_their_deadline_still_would(tiny):
    grpo, fallback = _engine("fast", tiny), _engine("fast", tiny)
    lane = Lane(grpo)
    sched = Scheduler([lane, Lane(fallback, name="base")])
    sched.stop()  # its rule alone, on rows admitted by hand
    grpo.step_seconds = fallback.step_seconds = 0.03
    now = 1000.0
    grpo.admit(Job(PROMPTS[1], cap=100, deadline=now + 1.0, lane=lane))
    need = grpo.rows[0].steps_left(lane.expected_tokens(), grpo.max_step_tokens)  # its prefill + 16 tokens
    assert need * 0.03 <= 1.0 < need * 0.06  # in time alone, not when sharing the cores
    assert not sched.fallback_fits(grpo, fallback, now=now)
    assert sched.fallback_fits(grpo, fallback, now=now - 1.0)  # two seconds left: room for both
    assert sched.fallback_fits(grpo, fallback, now=now + 0.9)  # late even alone: not waited for
    for n in (2, 2, 2, 2):  # short complete answers seen: the estimate follows them
        lane.record_length(n)
    assert sched.fallback_fits(grpo, fallback, now=now)


def test_the_scheduler_gives_the_fallback_no_step_that_would_make_a_grpo_row_miss_its_deadline(tiny):
    """The scheduler's choice itself (its _pick, on rows admitted by hand, its rule not loosened): after
    a GRPO step, the fallback's turn comes only where fallback_fits says the GRPO rows keep their room."""
    grpo, fallback = _engine("fast", tiny), _engine("fast", tiny)
    lane = Lane(grpo)
    sched = Scheduler([lane, Lane(fallback, name="base")])
    sched.stop()
    grpo.step_seconds = fallback.step_seconds = 0.03
    fallback.admit(Job(PROMPTS[0], cap=100, deadline=None))
    sched.last = grpo  # the GRPO model took the last step: the fallback's turn, if the rule allows it
    grpo.admit(Job(PROMPTS[1], cap=100, deadline=time.monotonic() + 3600))
    assert sched._pick() is fallback  # an hour to go: the fallback takes its turn
    grpo.rows.clear()
    grpo.admit(Job(PROMPTS[1], cap=100, deadline=None))
    need = grpo.rows[0].steps_left(lane.expected_tokens(), grpo.max_step_tokens)
    grpo.rows[0].job.deadline = time.monotonic() + need * 0.045  # in time alone (x 0.03), not sharing (x 0.06)
    assert sched._pick() is grpo


def test_two_lanes_alternate_steps_while_the_grpo_rows_have_room(tiny):
    grpo, fallback = _engine("fast", tiny), _engine("fast", tiny)
    order = []
    for name, engine in (("grpo", grpo), ("base", fallback)):
        step = engine.step
        engine.step = lambda step=step, name=name: (order.append(name), step())[1]
    g, f = Lane(grpo), Lane(fallback, name="base")
    sched = Scheduler([g, f])
    try:
        long = f.submit(PROMPTS[0], cap=60, deadline=None)
        while len(order) < 3:  # the fallback decodes alone first
            time.sleep(0.001)
        short = g.submit(PROMPTS[1], cap=10, deadline=time.monotonic() + 3600)
        arrived = len(order)  # steps begun by now: at least those begun before it was queued
        short.result(timeout=60)
        long.result(timeout=60)
    finally:
        sched.stop()
    first, last = order.index("grpo"), len(order) - 1 - order[::-1].index("grpo")
    assert order[:first] == ["base"] * first and first <= arrived + 1  # it started within one step
    span = order[first:last + 1]
    assert all(a == "grpo" or b == "grpo" for a, b in zip(span, span[1:]))  # never two fallback steps in a row
    assert "base" in span  # with an hour to go, the fallback took its turns


def test_the_entropy_bound_from_top_logprobs_is_exact_when_all_are_given_and_never_below_the_entropy():
    import math

    from grpo.core.entropy_stop import next_token_entropy
    from grpo.serve.vllm_lanes import entropy_upper_bound

    # (0.5, 0.25, 0.25) with only the top token given: the rest spread evenly is the distribution itself
    assert math.isclose(entropy_upper_bound([math.log(0.5)], 3), 1.5 * math.log(2), rel_tol=1e-9)
    gen = torch.Generator().manual_seed(0)
    for scale in (0.5, 3.0, 12.0):  # flat to peaked distributions over 500 tokens
        logits = torch.randn(500, generator=gen, dtype=torch.float64) * scale
        logp = torch.log_softmax(logits, -1)
        exact = float(next_token_entropy(logits[None])[0])
        assert math.isclose(entropy_upper_bound(logp.tolist(), 500), exact, rel_tol=1e-4, abs_tol=1e-6)
        for k in (1, 5, 20):
            assert entropy_upper_bound(logp.topk(k).values.tolist(), 500) >= exact - 1e-6
