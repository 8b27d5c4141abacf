"""core.staleness on hand-computed cases."""

from __future__ import annotations

import math

import torch

from grpo.core import staleness as st


def test_staleness_is_the_step_minus_the_oldest_version_of_a_group():
    versions = torch.tensor([[3, 3, 4], [4, 4, 0], [5, 5, 5], [2, 9, 9]])  # [N=4, T=3]
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [0, 1, 1]])  # row 1's 0 and row 3's 2 are padding
    assert st.oldest_version(versions, mask).tolist() == [3, 4, 5, 9]
    # groups of 2 rows: oldest 3 and 5, at step 5
    assert st.sample_staleness(versions, mask, step=5, group_size=2).tolist() == [2, 0]
    assert st.sample_staleness(versions, mask, step=5, group_size=1).tolist() == [2, 1, 0, 0]
    empty = torch.zeros(2, 3, dtype=torch.long)
    assert st.sample_staleness(versions[:2], empty, step=7, group_size=2).tolist() == [0]  # no tokens: never stale


def test_histogram_counts_each_staleness_and_those_over_the_bound_last():
    counts = st.staleness_histogram(torch.tensor([0, 1, 1, 2, 5, 3]), max_staleness=2)
    assert counts.tolist() == [1, 2, 1, 2]


def test_stale_tokens_are_those_of_older_versions_within_the_mask():
    versions = torch.tensor([[1, 2, 2], [2, 1, 1]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert st.stale_tokens(versions, mask, step=2).tolist() == [[True, False, False], [False, True, False]]


def test_token_correction_weighs_stale_tokens_only_by_their_ratio():
    train = torch.tensor([[-1.0, -2.0, -0.5]])
    engine = torch.tensor([[-1.5, -1.0, -0.5]])
    mask = torch.ones(1, 3)
    stale = torch.tensor([[True, True, False]])
    got = st.stale_correction(train, engine, mask, stale, level="token", mode="truncate", low=None, high=1.2)
    # token 0: exp(0.5) = 1.65 truncated to 1.2; token 1: exp(-1) = 0.368; token 2 fresh: exactly 1
    assert torch.allclose(got.weights, torch.tensor([[1.2, math.exp(-1.0), 1.0]]))
    assert got.weights[0, 2].item() == 1.0
    masked = st.stale_correction(train, engine, mask, stale, level="token", mode="mask", low=0.5, high=2.0)
    assert torch.allclose(masked.weights, torch.tensor([[math.exp(0.5), 0.0, 1.0]]))


def test_sequence_correction_covers_the_whole_row_and_fresh_rows_weigh_one():
    train = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]])
    engine = torch.tensor([[-1.2, -1.1, -1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    stale = torch.tensor([[True, True, False], [False, False, False]])
    got = st.stale_correction(train, engine, mask, stale, level="sequence", mode="truncate", low=None, high=3.0)
    w = math.exp(0.2 + 0.1)  # the product of row 0's stale-token ratios
    assert torch.allclose(got.weights, torch.tensor([[w, w, w], [1.0, 1.0, 0.0]]))
    out = st.stale_correction(train, engine, mask, stale, level="sequence", mode="mask", low=None, high=1.2)
    assert out.weights[0].tolist() == [0.0, 0.0, 0.0] and out.weights[1].tolist() == [1.0, 1.0, 0.0]
