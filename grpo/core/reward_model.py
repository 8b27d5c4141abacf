"""Losses and accuracies of a reward model trained during the run (seed 001 Algorithm 1, step 4: the
reward model keeps learning from the policy's new samples; seed 003 section 3.3: distilled from a
stronger teacher's soft targets).

A reward model's score is a logit: > 0 means "good" (a one-label head's logit, or the difference of
a two-label head's last and first logits). Labels are the verifier's rewards in [0, 1].

A process reward model (Math-Shepherd, arXiv 2312.08935) scores each step by its good and bad label
words' logits at the step's tag: the margin log p(good) - log p(bad) is that step's score logit, and its
sigmoid p(good) / (p(good) + p(bad)) the step reward; it trains with the same cross-entropy.

Dimension letters: N examples, P pairs, L labels of a head, B groups, G group size, S step tags.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def head_scores(logits: torch.Tensor) -> torch.Tensor:
    """Scores [N] from a head's logits [N, L]: the logit of a one-label head, else last minus first."""
    return logits[:, 0] if logits.shape[1] == 1 else logits[:, -1] - logits[:, 0]  # [N]


def label_word_margin(pair: torch.Tensor) -> torch.Tensor:
    """Step score logits [S] from a PRM's (good, bad) label-word logits [S, 2] at the step tags."""
    return pair[:, 0] - pair[:, 1]  # [S]


def pointwise_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of scores [N] (logits) against labels [N] in [0, 1] (soft labels allowed)."""
    return F.binary_cross_entropy_with_logits(scores, labels.to(scores.dtype))


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Bradley-Terry: -log sigmoid(s_better - s_worse), averaged over the pairs [P]."""
    return -F.logsigmoid(chosen - rejected).mean()


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, *, temperature: float = 1.0) -> torch.Tensor:
    """The teacher's soft targets (Hinton et al. 2015), scaled by T^2 so gradients keep their size as T
    changes. Logits [N, L] of the same head shape: L = 1 is a sigmoid head (cross-entropy of the
    student's sigmoid(s/T) against the teacher's sigmoid(t/T)); L > 1 the KL divergence
    KL(softmax(t/T) || softmax(s/T)), averaged over the N examples."""
    if student.shape != teacher.shape:
        raise ValueError(f"distillation_loss: student logits {tuple(student.shape)} vs teacher {tuple(teacher.shape)}")
    t = temperature
    if student.shape[1] == 1:
        target = torch.sigmoid(teacher[:, 0] / t)  # [N]
        return F.binary_cross_entropy_with_logits(student[:, 0] / t, target) * t * t
    log_p_student = F.log_softmax(student / t, dim=-1)  # [N, L]
    log_p_teacher = F.log_softmax(teacher / t, dim=-1)  # [N, L]
    return F.kl_div(log_p_student, log_p_teacher, log_target=True, reduction="batchmean") * t * t


def group_pairs(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (better, worse) pair within a group of labels [B, G] whose labels differ: flat indices
    (b * G + i) of the better [P] and the worse [P] completion, groups in order, i < j within a group."""
    b, g = labels.shape
    i, j = torch.triu_indices(g, g, offset=1)  # [G(G-1)/2] each
    li, lj = labels[:, i], labels[:, j]  # [B, G(G-1)/2]
    keep = li != lj
    rows = torch.arange(b).unsqueeze(1).expand_as(li)[keep] * g  # [P]
    first_better = (li > lj)[keep]  # [P]
    ii, jj = i.expand_as(li)[keep], j.expand_as(li)[keep]  # [P]
    better = rows + torch.where(first_better, ii, jj)
    worse = rows + torch.where(first_better, jj, ii)
    return better, worse


def pointwise_accuracy(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Share of examples [E] where the score's sign agrees with the label (label >= 0.5 is good): a scalar."""
    return ((scores > 0) == (labels >= 0.5)).double().mean()


def pairwise_accuracy(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Share of pairs [P] the model orders as the labels do (a tie counts as wrong)."""
    return (chosen > rejected).double().mean()
