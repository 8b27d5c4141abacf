"""pass@k against brute-force enumeration; evaluation output shape."""

import itertools

import pytest

from grpo.evaluate import pass_at_k


@pytest.mark.parametrize("n, c, k", [(4, 0, 1), (4, 1, 1), (4, 1, 2), (5, 2, 3), (6, 6, 4), (8, 3, 8)])
def test_pass_at_k_equals_enumeration(n, c, k):
    # probability that a random k-subset of n samples (c correct) holds at least one correct one
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expected = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_rejects_k_above_n():
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)
