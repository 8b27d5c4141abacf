"""Keyed sampling, shared by every engine that draws the same tokens for the same keys: each row
samples from its own key (seed, step, global row; ``row_keys``), through a counter-based Gumbel draw
(splitmix64 of the key and the position), so a row's tokens depend on neither the batch it is in
nor the number of processes, nor on the global random state.

Dimension letters: n rows, V vocabulary.
"""

from __future__ import annotations

import torch

from grpo import core
from grpo.rollout import native


GOLDEN, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's constants


def _mix64(z: int) -> int:
    """splitmix64's output function on a 64-bit integer (Steele et al. 2014)."""
    z = ((z ^ (z >> 30)) * MIX1) % 2**64
    z = ((z ^ (z >> 27)) * MIX2) % 2**64
    return z ^ (z >> 31)


def row_base(key: int, t: int) -> int:
    """The start of row ``key``'s noise stream at decoding step ``t`` (a 64-bit integer)."""
    return _mix64((key * 1_000_003 + t + GOLDEN) % 2**64)


def _signed(x: int) -> int:
    """A 64-bit unsigned integer as the int64 with the same bits."""
    return x - 2**64 if x >= 2**63 else x


def _base_bits(bases: list[int], device=None) -> torch.Tensor:
    """The stream starts ``bases`` as an int64 tensor [n] (the bits the C ops read as uint64)."""
    return torch.tensor([_signed(b) for b in bases], dtype=torch.int64, device=device)


def keyed_gumbel(bases: list[int], vocab: int, device=None) -> torch.Tensor:
    """Gumbel noise [n, V] of the rows whose streams start at ``bases``: token v's uniform number is
    splitmix64 of base + (v + 1) * golden, its top 24 bits as (k + 0.5) / 2^24. PyTorch's int64 ops
    wrap like uint64 for +, * and ^; right shifts are masked to be logical. decode_ops.c's
    gumbel_argmax draws the same numbers."""
    def shr(z, s):  # logical right shift on int64
        return (z >> s) & ((1 << (64 - s)) - 1)

    base = _base_bits(bases, device)[:, None]  # [n, 1]
    z = base + torch.arange(1, vocab + 1, dtype=torch.int64, device=device) * _signed(GOLDEN)  # [n, V]
    z = (z ^ shr(z, 30)) * _signed(MIX1)
    z = (z ^ shr(z, 27)) * _signed(MIX2)
    z = z ^ shr(z, 31)
    u = (shr(z, 40).float() + 0.5) * 2.0**-24  # [n, V] in (0, 1)
    return -torch.log(-torch.log(u))


class KeyedSampler:
    """Sampling as a logits processor for greedy ``generate``: the repetition penalty, temperature, top-k,
    top-p and min-p exactly as ``generate`` applies them (core.processed_scores), then the Gumbel-max trick, argmax(logits + Gumbel noise), which draws
    exactly from softmax(logits) (Gumbel 1954; Maddison et al. 2014).

    The noise of row n at decoding step t is a stream fixed by (keys[n], t) (``keyed_gumbel``), so a
    completion depends on its key alone, not on which other rows share the batch: one process and
    N processes under torchrun (or a different micro-batching) sample the same tokens. Where the C
    ops of native.py build, the noise and argmax run there in one pass (8 x 49,152 scores: ~0.65 ms on
    an AVX-512 core against ~3.7 ms for per-row torch generators and two logarithms; ~1.8 ms on an
    AVX2 core against 8.2 ms for PyTorch's integer ops); their log differs from
    PyTorch's in the last bit, which changes a token only on an exact near-tie.

    (Gumbel-max rather than inverting the CDF at one uniform number: both draw exactly, but the CDF's
    boundaries among tail tokens are ~1e-6 apart, so the ~1e-5 logit differences between backends or
    batch layouts moved ~1 token in 1,000; Gumbel-max changes a token only when its two best
    perturbed scores are that close.)
    """

    def __init__(self, keys: list[int], prompt_len: int, *, temperature: float, top_p: float = 1.0, top_k: int = 0,
                 min_p: float = 0.0, repetition_penalty: float = 1.0, prompt_mask: torch.Tensor | None = None):
        self.keys, self.prompt_len, self.prompt_mask = keys, prompt_len, prompt_mask  # mask [n, P]: 1 on real tokens
        self.settings = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p,
                         "repetition_penalty": repetition_penalty}
        self.penalized = repetition_penalty != 1.0  # the context's tokens are needed (``seen``)

    def process(self, scores: torch.Tensor, seen: torch.Tensor | None = None) -> torch.Tensor:
        """q's scores [n, V] (core.processed_scores; ``seen`` [n, V] the context's tokens, for the penalty)."""
        return core.processed_scores(scores, seen=seen, **self.settings)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Scores for greedy ``generate``: 0 at the drawn token of each row, -inf elsewhere."""
        seen = core.seen_tokens(input_ids, self.real_tokens(input_ids), scores.shape[-1]) if self.penalized else None
        tokens = self.draw(scores, input_ids.shape[1] - self.prompt_len, self.keys, seen=seen)  # [n]
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens[:, None], 0.0)  # [n, V]

    def real_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[n, L] 1 on the real tokens of ``generate``'s rows (its left padding is not context)."""
        real = torch.ones_like(input_ids)
        if self.prompt_mask is not None:
            real[:, :self.prompt_mask.shape[1]] = self.prompt_mask
        return real

    def draw(self, scores: torch.Tensor, t: int, keys: list[int], *, use_native: bool = True,
             seen: torch.Tensor | None = None) -> torch.Tensor:
        """The sampled token [n] of rows ``keys`` at decoding step ``t`` from their scores [n, V] (also
        used by the fast backend on its live rows)."""
        scores = self.process(scores, seen).contiguous()  # [n, V] float32
        bases = [row_base(k, t) for k in keys]
        lib = native.library() if use_native and scores.device.type == "cpu" else None
        if lib is None:
            return (scores + keyed_gumbel(bases, scores.shape[1], scores.device)).argmax(-1)  # [n]
        n, vocab = scores.shape
        base = _base_bits(bases)  # [n]
        tokens, work = torch.empty(n, dtype=torch.int64), torch.empty(n, vocab)  # work: per-row scratch
        lib.gumbel_argmax(scores.data_ptr(), n, vocab, base.data_ptr(), work.data_ptr(), tokens.data_ptr())
        return tokens


def row_keys(seed: int, step: int, first_row: int, count: int) -> list[int]:
    """Sampling keys of global rows first_row .. first_row + count - 1 at a training step."""
    base = (seed % 2**20) * 2**42 + (step % 2**22) * 2**20
    return [base + first_row + i for i in range(count)]
