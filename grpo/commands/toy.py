"""A target-matching toy: GRPO versus REINFORCE, trained with grpo.core alone.

Seed 002 section 3: six prompts, each with a fixed random 8-bit target. The policy is a table of
logits per prompt, two per bit (one for 0, one for 1: the bit is 1 with probability
sigmoid(theta_1 - theta_0)); a completion is 8 sampled bits, its reward the share of bits that match
the target. Each iteration draws one prompt, samples a group of G = 16 completions, and takes one
plain gradient step (learning rate 0.8, ratio 1, no KL) with the chosen estimator; the group z-score
uses the population std + 1e-8, as the seed does. The exact-match rate is the share of sampled
completions equal to their target over the last 60 of 900 iterations.

Variant ``two_logit`` (the default) is the seed's setup with its random stream: one
``numpy.random.default_rng(seed)`` draws the targets, then each estimator in turn (no baseline, mean
baseline, GRPO) draws its prompts and samples from where the previous one stopped. On the seed's own
seed 3 it prints the seed's 0.695 / 0.675 / 0.986 and GRPO's prompt-0 probabilities.

Variant ``one_logit`` keeps one logit per bit: each step moves a bit's log-odds half as far as the
seed's two logits do (the two logits' gradients are equal and opposite), so the baselines learn more
slowly (about 0.44 / 0.43 / 0.97 on seeds 0-4); each estimator there has its own torch generator.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field

import numpy as np
import torch

from grpo.core import grpo_loss

ESTIMATORS = ("reinforce", "mean_baseline", "grpo")
VARIANTS = ("two_logit", "one_logit")
SEED_002 = 3  # the seed's numpy.random.default_rng(3)
PUBLISHED = {"reinforce": 0.695, "mean_baseline": 0.675, "grpo": 0.986}  # seed 002, its printed result


@dataclass
class ToyResult:
    estimator: str
    seed: int
    exact_match: float
    prompt0_p1: list[float] = field(default_factory=list)  # P(bit = 1) of prompt 0 after training


def _core_step(logp: torch.Tensor, reward: torch.Tensor, estimator: str) -> torch.Tensor:
    """The core's loss for one group: logp [G, T] of the sampled bits, reward [G]; the sequence
    log-probability is the sum over its bits (token-sum aggregation, L = 1); population std + 1e-8."""
    mask = torch.ones_like(logp)  # [G, T]: every bit is a completion token
    loss, _ = grpo_loss(logp, logp.detach(), None, reward[None], mask, kl_coef=0.0, estimator=estimator,
                        aggregation="seq_mean_token_sum_norm", norm_length=1, std_eps=1e-8, unbiased_std=False)
    return loss


@torch.no_grad()
def _sgd(param: torch.Tensor, lr: float) -> None:
    """One plain gradient step (torch.optim.SGD's arithmetic without its per-step dispatch)."""
    param -= lr * param.grad
    param.grad = None


def _two_logit(estimator: str, rng: np.random.Generator, targets: np.ndarray, *, group: int, lr: float,
               iterations: int) -> tuple[list[float], torch.Tensor]:
    """Seed 002's policy: theta [P, bits, 2]; the draws in the seed's order (prompt, then G x bits
    uniforms compared with P(bit = 1)). Returns the per-iteration exact-match rates and theta."""
    prompts, bits = targets.shape
    theta = torch.zeros(prompts, bits, 2, dtype=torch.float64, requires_grad=True)  # [P, bits, 2]
    hits = []
    for _ in range(iterations):
        p = int(rng.integers(0, prompts))
        logp_all = torch.log_softmax(theta[p], dim=-1)  # [bits, 2]
        p1 = logp_all[:, 1].exp().detach().numpy()  # [bits]
        seqs = (rng.random((group, bits)) < p1[None, :]).astype(np.int64)  # [G, bits]
        reward = torch.from_numpy((seqs == targets[p][None, :]).mean(axis=1))  # [G]
        sample = torch.from_numpy(seqs)  # [G, T]
        logp = logp_all[torch.arange(bits)[None, :], sample]  # [G, T]
        _core_step(logp, reward, estimator).backward()
        _sgd(theta, lr)
        hits.append(float((reward == 1.0).double().mean()))
    return hits, theta.detach()


def run_seed(seed: int = SEED_002, *, variant: str = "two_logit", prompts: int = 6, bits: int = 8,
             group: int = 16, lr: float = 0.8, iterations: int = 900, window: int = 60) -> list[ToyResult]:
    """Every estimator on one seed, in ESTIMATORS order; ``variant`` as in the module docstring."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown toy variant {variant!r}; valid: {list(VARIANTS)}")
    if variant == "one_logit":
        return [run_toy(e, seed=seed, prompts=prompts, bits=bits, group=group, lr=lr, iterations=iterations,
                        window=window) for e in ESTIMATORS]
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, 2, size=(prompts, bits))  # [P, bits], drawn first as in the seed
    out = []
    for e in ESTIMATORS:  # one stream, continued from estimator to estimator
        hits, theta = _two_logit(e, rng, targets, group=group, lr=lr, iterations=iterations)
        p1 = torch.softmax(theta[0], dim=-1)[:, 1]  # [bits]
        out.append(ToyResult(e, seed, float(np.mean(hits[-window:])), [round(float(x), 2) for x in p1]))
    return out


def run_toy(estimator: str, *, seed: int, prompts: int = 6, bits: int = 8, group: int = 16, lr: float = 0.8,
            iterations: int = 900, window: int = 60) -> ToyResult:
    """The one-logit variant: one Bernoulli logit per bit, one estimator, its own torch generator."""
    gen = torch.Generator().manual_seed(seed)
    targets = torch.randint(0, 2, (prompts, bits), generator=gen)  # [P, bits]
    logits = torch.zeros(prompts, bits, requires_grad=True)  # [P, bits]
    mask = torch.ones(group, bits)  # [G, T]: every bit is a completion token
    hits = []
    for it in range(iterations):
        p = int(torch.randint(0, prompts, (1,), generator=gen))
        probs = torch.sigmoid(logits[p]).detach().expand(group, bits)  # [G, T]
        sample = torch.bernoulli(probs, generator=gen)  # [G, T]
        reward = (sample == targets[p]).float().mean(1)  # [G]
        logp = -torch.nn.functional.binary_cross_entropy_with_logits(
            logits[p].expand(group, bits), sample, reduction="none")  # [G, T]
        loss, _ = grpo_loss(logp, logp.detach(), None, reward[None], mask, kl_coef=0.0, estimator=estimator,
                            aggregation="seq_mean_token_sum_norm", norm_length=1)
        loss.backward()
        _sgd(logits, lr)
        if it >= iterations - window:
            hits.append((reward == 1.0).float().mean().item())
    p1 = torch.sigmoid(logits[0]).detach()  # [bits]
    return ToyResult(estimator, seed, sum(hits) / len(hits), [round(float(x), 2) for x in p1])


def main(argv: list[str] | None = None) -> list[ToyResult]:
    ap = argparse.ArgumentParser(prog="grpo toy", description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, nargs="+", default=[SEED_002],
                    help=f"seeds to run (default: {SEED_002}, the seed whose rates the toy reproduces: 0.695, 0.675, 0.986)")
    ap.add_argument("--variant", choices=VARIANTS, default="two_logit",
                    help="two_logit: two logits per bit and the reference random stream; one_logit: one logit per bit")
    args = ap.parse_args(argv)
    results = [r for s in args.seed for r in run_seed(s, variant=args.variant)]
    print(f"{args.variant}: exact-match rate over the last 60 of 900 iterations (G = 16, lr 0.8)")
    print(f"{'seed':>6} " + " ".join(f"{e:>14}" for e in ESTIMATORS))
    for s in args.seed:
        row = [r.exact_match for r in results if r.seed == s]
        print(f"{s:>6} " + " ".join(f"{x:>14.3f}" for x in row))
    if len(args.seed) > 1:
        means = [statistics.mean(r.exact_match for r in results if r.estimator == e) for e in ESTIMATORS]
        print(f"{'mean':>6} " + " ".join(f"{x:>14.3f}" for x in means))
    for r in results:
        if r.estimator == "grpo":
            print(f"grpo prompt 0 P(bit = 1), seed {r.seed}: {r.prompt0_p1}")
    print(f"seed 002 (two_logit, seed {SEED_002}): " + ", ".join(f"{e} {v}" for e, v in PUBLISHED.items())
          + ", prompt 0 [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]")
    return results


if __name__ == "__main__":
    main()
