"""The serving scheme's entropy early stop (seed 003, 5.3), by hand."""

import math

import torch

from grpo.core.entropy_stop import entropy_run_step, entropy_stop_lengths, next_token_entropy


def test_entropy_of_hand_distributions():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, -1e9, -1e9, -1e9], [math.log(3), 0.0, -1e9, -1e9]])
    want = [math.log(4), 0.0, -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))]
    assert torch.allclose(next_token_entropy(logits), torch.tensor(want), atol=1e-6)


def test_three_low_tokens_in_a_row_stop_by_hand():
    # threshold 0.5, run 3: row 0 is low at t = 1, 2, 3 -> keeps 4 tokens (the run ends at index 3);
    # row 1 is interrupted at t = 2 and never gets three in a row; row 2 gets its run only past its mask
    e = torch.tensor([[0.9, 0.1, 0.2, 0.3, 0.1, 0.9],
                      [0.1, 0.1, 0.7, 0.1, 0.1, 0.8],
                      [0.1, 0.1, 0.9, 0.1, 0.1, 0.1]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    assert entropy_stop_lengths(e, mask, threshold=0.5, run_length=3).tolist() == [4, 6, 5]
    # equal to the threshold is not below it
    assert entropy_stop_lengths(torch.full((1, 4), 0.5), torch.ones(1, 4), threshold=0.5, run_length=3).tolist() == [4]
    assert entropy_stop_lengths(torch.full((1, 4), 0.4), torch.ones(1, 4), threshold=0.5, run_length=3).tolist() == [3]
    # run_length 0 switches the stop off
    assert entropy_stop_lengths(torch.zeros(2, 5), torch.ones(2, 5), threshold=0.5, run_length=0).tolist() == [5, 5]


def test_step_form_counts_and_resets():
    run = torch.tensor([0, 2, 2])
    out = entropy_run_step(torch.tensor([0.0, 0.0, 1.0]), run, threshold=0.5, run_length=3)
    assert out.run.tolist() == [1, 3, 0] and out.stop.tolist() == [False, True, False]


def test_step_form_agrees_with_the_sequence_form():
    g = torch.Generator().manual_seed(0)
    e = torch.rand(64, 20, generator=g)  # [N, T]
    lengths = torch.randint(1, 21, (64,), generator=g)
    mask = (torch.arange(20)[None, :] < lengths[:, None]).long()
    want = entropy_stop_lengths(e, mask, threshold=0.4, run_length=3)
    run, got = torch.zeros(64, dtype=torch.long), lengths.clone()
    done = torch.zeros(64, dtype=torch.bool)
    for t in range(20):
        step = entropy_run_step(e[:, t], run, threshold=0.4, run_length=3)
        run = step.run
        first = step.stop & ~done & mask[:, t].bool()
        got[first] = t + 1
        done |= first
    assert torch.equal(got, want) and (want < lengths).any() and (want == lengths).any()
