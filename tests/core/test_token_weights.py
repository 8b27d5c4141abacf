"""Token weights on the advantage, by hand (seed 003 section 5.1: gamma = 2.0 on identifiers/operators)."""

import torch

from grpo.core import token_weights, weighted_advantages


def test_marked_tokens_get_gamma_by_hand():
    vocab = torch.tensor([False, True, False, True])  # ids 1 and 3 are identifier/operator tokens
    ids = torch.tensor([[0, 1, 3, 2], [3, 3, 0, 7]])  # [N=2, T=4]; 7 is past the vocabulary: unmarked
    assert token_weights(ids, vocab, gamma=2.0).tolist() == [[1, 2, 2, 1], [2, 2, 1, 1]]
    adv = torch.tensor([[0.5, 0.5, 0.5, 0.5], [-1.0, -1.0, -1.0, -1.0]])  # [N, T]
    assert weighted_advantages(adv, ids, vocab, gamma=2.0).tolist() == [[0.5, 1.0, 1.0, 0.5],
                                                                         [-2.0, -2.0, -1.0, -1.0]]
    assert torch.equal(weighted_advantages(adv, ids, vocab, gamma=1.0), adv)  # gamma 1: off


def test_code_token_classification():
    from grpo.train.code_tokens import is_code_token

    assert all(is_code_token(t) for t in [" for", "x", " total_sum", "=", " +=", "**", "->", " =="])
    assert not any(is_code_token(t) for t in ["", " ", "(", "42", ".", " 3x", "\n"])
