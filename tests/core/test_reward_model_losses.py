"""Reward-model losses by hand: Bradley-Terry, pointwise, teacher distillation, within-group pairs."""

import math

import pytest
import torch

from grpo.core import (bradley_terry_loss, distillation_loss, group_pairs, head_scores, pairwise_accuracy,
                       pointwise_accuracy, pointwise_loss)


def test_bradley_terry_by_hand():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    # -log sigmoid(1) = log(1 + e^-1); -log sigmoid(-1) = log(1 + e)
    want = (math.log(1 + math.exp(-1)) + math.log(1 + math.e)) / 2
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(want)
    assert pairwise_accuracy(chosen, rejected).item() == 0.5


def test_pointwise_by_hand():
    scores, labels = torch.tensor([0.0, math.log(3.0)]), torch.tensor([1.0, 0.0])
    # sigmoid(0) = 1/2 against 1: log 2; sigmoid(log 3) = 3/4 against 0: -log(1/4) = log 4
    assert pointwise_loss(scores, labels).item() == pytest.approx((math.log(2) + math.log(4)) / 2)
    assert pointwise_accuracy(torch.tensor([0.5, -1.0, 0.2]), torch.tensor([1.0, 0.0, 0.0])).item() == pytest.approx(2 / 3)
    assert head_scores(torch.tensor([[1.0, 3.0]])).tolist() == [2.0] and head_scores(torch.tensor([[-1.5]])).tolist() == [-1.5]


def test_distillation_by_hand():
    # two labels: teacher logits (0, log 3) -> p = (1/4, 3/4); student (0, 0) -> q = (1/2, 1/2)
    student, teacher = torch.tensor([[0.0, 0.0]]), torch.tensor([[0.0, math.log(3.0)]])
    kl = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert distillation_loss(student, teacher).item() == pytest.approx(kl)
    # T = 2: teacher (0, log 3)/2 -> p = (1/(1+sqrt 3), sqrt 3/(1+sqrt 3)); student uniform; times T^2 = 4
    p1 = math.sqrt(3) / (1 + math.sqrt(3))
    kl2 = (1 - p1) * math.log((1 - p1) / 0.5) + p1 * math.log(p1 / 0.5)
    assert distillation_loss(student, teacher, temperature=2.0).item() == pytest.approx(4 * kl2)
    # one label: soft target sigmoid(log 3) = 3/4 for the student's sigmoid(0) = 1/2: -(3/4 log 1/2 + 1/4 log 1/2)
    one = distillation_loss(torch.tensor([[0.0]]), torch.tensor([[math.log(3.0)]]))
    assert one.item() == pytest.approx(math.log(2))
    assert distillation_loss(teacher, teacher).item() == pytest.approx(0.0, abs=1e-7)  # its own targets: no loss
    with pytest.raises(ValueError):
        distillation_loss(student, torch.zeros(1, 1))


def test_group_pairs_by_hand():
    labels = torch.tensor([[1.0, 0.0, 1.0], [0.5, 0.5, 0.5], [0.0, 0.0, 1.0]])  # [B=3, G=3]
    better, worse = group_pairs(labels)
    # group 0: (0 > 1), (2 > 1); group 1: all equal, no pair; group 2: (8 > 6), (8 > 7)
    assert sorted(zip(better.tolist(), worse.tolist())) == [(0, 1), (2, 1), (8, 6), (8, 7)]
