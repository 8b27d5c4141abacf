"""A paged KV cache and a decode step over it, for continuous (iteration-level) batching.

Dimension letters: M tokens of one step, R rows of the step, W pages per row (the step's widest),
S positions per page, H hidden size, Hq / Hk query / key-value heads, D head dim, L layers.

Why: a batch whose rows share one cache tensor pads every row to the longest, and a row that arrives
while the batch decodes waits for the whole batch. Here every row owns a list of fixed-size pages
(vLLM's PagedAttention, Kwon et al. 2023): one step feeds any mix of rows, each at its own position,
a decoding row one token and a row being prefilled a chunk of its prompt (Orca's iteration-level
scheduling, Yu et al. 2022; chunked prefill, Agrawal et al. 2023, Sarathi). The step is one set of
matrix products over all M tokens, which on a CPU costs about what one row costs (the products read
every weight once for all rows); attention reads each row's own pages.

Prefix caching: a page holding a full block of S prompt tokens is kept in ``PrefixCache`` under the
exact tokens up to its end; a later prompt that begins with those tokens starts with those pages
(refcounted, shared, never copied) and prefills only the rest. The chat template's system prompt is
such a prefix for every chat request.

The arithmetic is HF's Llama-family step (TorchDecoder's fused, packed products, RMSNorm folded in),
attention in decode_ops.c's ``paged_attention`` where the C file builds, else in PyTorch here.
"""

from __future__ import annotations

import collections
import math

import torch

from grpo.rollout.decoder import TorchDecoder

PAGE = 16  # positions per page: the C attention reads 16 positions at a time


class PagePool:
    """Page ids 0..pages-1 of a cache, each with a reference count; freed pages are reused last in,
    first out (the memory already touched is reused before new memory is)."""

    def __init__(self, pages: int):
        self.pages = pages
        self.free = list(range(pages - 1, -1, -1))
        self.refs = [0] * pages

    def available(self) -> int:
        return len(self.free)

    def take(self) -> int:
        page = self.free.pop()
        self.refs[page] = 1
        return page

    def ref(self, page: int) -> None:
        self.refs[page] += 1

    def release(self, page: int) -> None:
        self.refs[page] -= 1
        if self.refs[page] == 0:
            self.free.append(page)


class PrefixCache:
    """Full prompt pages kept for reuse, keyed by the exact token ids from position 0 to the page's
    end (equal keys hold equal keys and values: a position's KV depends only on the tokens up to it).
    Holds one reference per kept page; ``evict`` drops the least recently used pages no row holds."""

    def __init__(self, pool: PagePool, *, max_pages: int):
        self.pool, self.max_pages = pool, max_pages
        self.entries: collections.OrderedDict[tuple, int] = collections.OrderedDict()
        self.hits = self.misses = 0  # pages found and pages computed, over the prompts matched

    def match(self, ids: list[int]) -> list[int]:
        """The kept pages of ``ids``' longest cached run of full pages from position 0, leaving at least
        its last token to compute (its logits give the first new token)."""
        pages = []
        for k in range((len(ids) - 1) // PAGE):
            page = self.entries.get(tuple(ids[:(k + 1) * PAGE]))
            if page is None:
                break
            self.entries.move_to_end(tuple(ids[:(k + 1) * PAGE]))
            pages.append(page)
        self.hits += len(pages)
        self.misses += (len(ids) - 1) // PAGE - len(pages)
        return pages

    def add(self, ids: list[int], pages: list[int]) -> None:
        """Keep the full pages of the prompt ``ids`` (a row's first pages, prefilled)."""
        if self.max_pages <= 0:
            return
        for k in range(len(ids) // PAGE):
            key = tuple(ids[:(k + 1) * PAGE])
            if key in self.entries:
                continue
            while len(self.entries) >= self.max_pages and self._evict_one():
                pass
            if len(self.entries) >= self.max_pages:
                return
            self.entries[key] = pages[k]
            self.pool.ref(pages[k])

    def evict(self, need: int) -> None:
        """Free kept pages, oldest first, until ``need`` pages are free (or none more can be)."""
        while self.pool.available() < need and self._evict_one():
            pass

    def clear(self) -> None:
        """Drop every kept page no row holds."""
        while self._evict_one():
            pass

    def _evict_one(self) -> bool:
        for key, page in self.entries.items():
            if self.pool.refs[page] == 1:  # only the cache holds it
                del self.entries[key]
                self.pool.release(page)
                return True
        return False


class PagedDecoder(TorchDecoder):
    """Steps of a Llama-family model over a paged KV cache of ``pages`` pages: ``forward(tokens,
    table, row, pos)`` feeds any rows' tokens at their positions and returns the final hidden states.
    ``lib``: decode_ops.c (native.library()) for the small ops and the attention; None: PyTorch."""

    def __init__(self, model, *, pages: int, lib=None, linears: dict | None = None):
        super().__init__(model, linears=linears)
        self.lib, self.pages = lib, pages
        self.hidden = model.config.hidden_size
        # torch.empty: the pages are only read at positions a row wrote, and memory is touched as used
        self.kp = [torch.empty(pages, self.hk, self.d, PAGE) for _ in self.layers]  # [pages, Hk, D, S] keys transposed
        self.vp = [torch.empty(pages, self.hk, PAGE, self.d) for _ in self.layers]  # [pages, Hk, S, D]

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, table: torch.Tensor, row: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """tokens [M] of rows ``row`` [M] (indices into table [R, W], each row's pages) at positions
        pos [M]; a row's tokens are consecutive positions, in order. Returns the normed hidden states
        [M, H] (the output layer is the caller's)."""
        h = self.embed[tokens]  # [M, H] a fresh tensor: the residual stream, updated in place
        cos, sin = self.rotary(h[:, None], pos[:, None])  # [M, 1, D]
        if self.lib is None:
            return self._forward_torch(h, cos, sin, table, row, pos)
        return self._forward_native(h, cos[:, 0].contiguous(), sin[:, 0].contiguous(), table, row, pos)

    def _forward_native(self, h, cos, sin, table, row, pos) -> torch.Tensor:
        lib, m, hq, hk, d = self.lib, h.shape[0], self.hq, self.hk, self.d
        table, row, pos = (t.to(torch.int64).contiguous() for t in (table, row, pos))
        x, att, act = torch.empty(m, self.hidden), torch.empty(m, hq * d), torch.empty(m, self.inter)
        work = torch.empty(lib.attention_threads(), hq // hk, table.shape[1] * PAGE + 16)
        lib.add_rms(h.data_ptr(), None, x.data_ptr(), None, m, self.hidden, self.layers[0]["eps1"])
        for i, w in enumerate(self.layers):
            qkv = w["qkv"](x).contiguous()  # [M, (Hq + 2 Hk) D]
            lib.paged_attention(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), self.kp[i].data_ptr(),
                                self.vp[i].data_ptr(), PAGE, table.data_ptr(), table.shape[1], row.data_ptr(),
                                pos.data_ptr(), m, hq, hk, d, w["scale"], work.data_ptr(), att.data_ptr())
            o = w["o"](att)  # [M, H] (held: a temporary's memory could be reused before the call)
            lib.add_rms(h.data_ptr(), o.data_ptr(), x.data_ptr(), None, m, self.hidden, w["eps2"])
            gu = w["gate_up"](x).contiguous()  # [M, 2 I]
            lib.silu_mul(gu.data_ptr(), act.data_ptr(), m, self.inter)
            down = w["down"](act)  # [M, H]
            last = i + 1 == len(self.layers)  # the final norm has its weight; the others are folded
            eps = self.norm[1] if last else self.layers[i + 1]["eps1"]
            weight = self.norm[0].data_ptr() if last else None
            lib.add_rms(h.data_ptr(), down.contiguous().data_ptr(), x.data_ptr(), weight, m, self.hidden, eps)
        return x

    def _forward_torch(self, h, cos, sin, table, row, pos) -> torch.Tensor:
        m, hq, hk, d = h.shape[0], self.hq, self.hk, self.d
        page, at = table[row, pos // PAGE], pos % PAGE  # [M] each
        segments = _segments(row)
        for i, w in enumerate(self.layers):
            qkv = w["qkv"](self._rms(h, w["eps1"]))  # [M, (Hq + 2 Hk) D]
            qk = self._rope(qkv[:, :(hq + hk) * d].view(m, hq + hk, d), cos, sin)  # [M, Hq + Hk, D]
            self.kp[i][page, :, :, at] = qk[:, hq:]  # [M, Hk, D] into the pages
            self.vp[i][page, :, at, :] = qkv[:, (hq + hk) * d:].view(m, hk, d)
            att = torch.cat([self._attend_rows(qk[a:b, :hq], table[int(row[a])], pos[a:b], i, w["scale"])
                             for a, b in segments])  # [M, Hq D]
            h = h + w["o"](att)  # [M, H]
            gu = w["gate_up"](self._rms(h, w["eps2"]))  # [M, 2 I]
            h = h + w["down"](torch.nn.functional.silu(gu[:, :self.inter]) * gu[:, self.inter:])  # [M, H]
        return self._rms(h, self.norm[1]) * self.norm[0]  # [M, H]

    def _attend_rows(self, q: torch.Tensor, pages: torch.Tensor, pos: torch.Tensor, layer: int,
                     scale: float) -> torch.Tensor:
        """One row's queries q [k, Hq, D] at positions pos [k] over its pages: [k, Hq D] (causal)."""
        k, hq, d = q.shape
        length = int(pos[-1]) + 1
        used = pages[:math.ceil(length / PAGE)]
        keys = self.kp[layer][used].permute(1, 0, 3, 2).reshape(self.hk, -1, d)[:, :length]  # [Hk, L, D]
        values = self.vp[layer][used].permute(1, 0, 2, 3).reshape(self.hk, -1, d)[:, :length]  # [Hk, L, D]
        g = hq // self.hk
        keys, values = keys.repeat_interleave(g, 0), values.repeat_interleave(g, 0)  # [Hq, L, D]
        s = torch.matmul(q.transpose(0, 1), keys.transpose(-1, -2)) * scale  # [Hq, k, L]
        s.masked_fill_(torch.arange(length)[None, None, :] > pos[None, :, None], float("-inf"))
        return torch.matmul(torch.softmax(s, -1), values).transpose(0, 1).reshape(k, hq * d)  # [k, Hq D]


def _segments(row: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each run of equal consecutive entries of row [M]."""
    values = row.tolist()
    out, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            out.append((start, i))
            start = i
    return out
