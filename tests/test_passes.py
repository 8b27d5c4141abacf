"""Token-budgeted forward passes and the rows that can have a gradient, by hand."""

import torch

from grpo.train.split import forward_chunks, mini_batch_rows, rows_with_gradient


def _masks(prompt_lens, completion_lens, p=6, t=5):
    pm = torch.stack([(torch.arange(p) >= p - n).long() for n in prompt_lens])  # left-padded [N, P]
    cm = torch.stack([(torch.arange(t) < n).long() for n in completion_lens])  # [N, T]
    return pm, cm


def test_passes_count_a_shared_prompt_once_per_pass():
    # two groups of 2 (group_size 2): prompts of 4 and 3 tokens, completions of 5, 2, 3, 1 tokens
    pm, cm = _masks([4, 4, 3, 3], [5, 2, 3, 1])
    rows = torch.arange(4)
    got = forward_chunks(pm, cm, rows, budget=11, group_size=2, share_prompt=True)
    assert [p.tolist() for p in got] == [[0, 1], [2, 3]]  # 4 + 5 + 2 = 11; then 3 + 3 + 1 = 7
    got = forward_chunks(pm, cm, rows, budget=11, group_size=2, share_prompt=False)
    assert [p.tolist() for p in got] == [[0], [1], [2, 3]]  # 9 | 6 (+ 6 = 12 > 11) | 6 + 4 = 10
    got = forward_chunks(pm, cm, rows, budget=8, group_size=2, share_prompt=True)
    assert [p.tolist() for p in got] == [[0], [1], [2, 3]]  # a row over the budget alone; 3 + 3 + 1 = 7
    assert [p.tolist() for p in forward_chunks(pm, cm, rows, budget=0, group_size=2, share_prompt=True)] == [[0, 1, 2, 3]]


def test_rows_with_gradient_keeps_nonzero_advantages_on_counted_tokens():
    adv = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.5, 0.5], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0], [0, 0], [1, 1]])
    assert rows_with_gradient(adv, mask, group_size=2).tolist() == [1]  # row 2's tokens do not count
    none = rows_with_gradient(torch.zeros(4, 2), mask, group_size=2)
    assert none.tolist() == [0, 1]  # nothing to learn: the first group still runs, for its metrics


def test_mini_batches_take_every_other_group():
    # 4 groups of 2 rows, 2 mini-batches: groups 0 and 2 (rows 0, 1, 4, 5), then groups 1 and 3
    assert [m.tolist() for m in mini_batch_rows(4, 2, 2)] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert [m.tolist() for m in mini_batch_rows(3, 1, 1)] == [[0, 1, 2]]
    assert [m.tolist() for m in mini_batch_rows(1, 2, 2)] == [[0, 1], []]  # fewer groups than mini-batches
