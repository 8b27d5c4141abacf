"""The fused decode step with its small ops in C: rotary embedding, KV-cache write and attention in
one call per layer, residual + RMSNorm and SiLU * up in one call each (decode_ops.c), between the
four oneDNN-packed products of fused.py.

Dimension letters: n live rows, N = B * G rows, B prompts, H hidden size, Hq / Hk query / key-value
heads, D head dim, I intermediate size, P prompt positions, C completion positions.

Why: on the 2-core CPU this project measures on, a batch-8 decode step of SmolLM2-135M took ~35 ms
in FusedDecoder, of which ~20 ms were the products (close to memory bandwidth) and ~9 ms the ~40
small PyTorch ops per layer around them (dispatch, and attention over a KV cache copied G times).
Here each layer makes 4 products and 4 C calls, and attention reads each prompt's keys and values
once for its G rows: the prompt's cache is kept once per prompt, each row's own tokens in a
per-row buffer indexed by global row, so a row that ends is simply no longer passed.

The C file is built on first use with the system C compiler (``cc``, ``-O3 -march=native``) into
``$XDG_CACHE_HOME/grpo`` (``~/.cache/grpo``), keyed by the source, the flags and the CPU; where no
compiler is found or the build fails, ``library()`` is None and the fast backend steps FusedDecoder
(PyTorch ops) instead. ``GRPO_NATIVE=0`` switches it off. It is built with ``-fopenmp`` so that
attention splits its rows over the threads of the OpenMP runtime PyTorch has loaded (a batch-8 step
on the 2-core machine: attention 4.4 -> 2.3 ms, the step 34 -> 29 ms); where that build fails, without
(one thread).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from grpo.rollout.fused import FusedDecoder, default_linear

SOURCE = Path(__file__).with_name("decode_ops.c")
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC"]
# without an OpenMP runtime to link: the same code, one thread (the pragmas' SIMD hints kept)
SERIAL_FLAGS = [f if f != "-fopenmp" else "-fopenmp-simd" for f in FLAGS]
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
SIGNATURES = {
    "add_rms": [_P, _P, _P, _P, _I, _I, _F],
    "silu_mul": [_P, _P, _I, _I],
    "gumbel_argmax": [_P, _I, _I, _P, _P, _P],
    "decode_attention": [_P, _P, _P, _P, _P, _P, _I, _I, _P, _P, _I, _I, _P, _I, _I, _I, _I, _I, _F, _P, _P],
    "attention_threads": [],
    "panel_linear8": [_P, _I, _P, _I, _P],
}
_last_error: list[str] = []


def _cpu_id() -> str:
    """What -march=native compiles for: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    return "\n".join(sorted({x for x in lines if x.startswith(("model name", "flags", "Features"))}))


@functools.cache
def library() -> ctypes.CDLL | None:
    """decode_ops.c built and loaded (once per process; the build is cached on disk), or None where
    it cannot be (``unavailable_reason()`` says why)."""
    if os.environ.get("GRPO_NATIVE", "1") == "0":
        _last_error.append("GRPO_NATIVE=0")
        return None
    cc = compiler()
    if cc is None:
        _last_error.append("no C compiler (cc or gcc) on PATH")
        return None
    errors = []
    for flags in (FLAGS, SERIAL_FLAGS):
        try:
            return load(built(cc, flags))
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", b"") or b""
            errors.append(f"{' '.join(flags)}: {e} {detail.decode(errors='replace')[:400]}")
    _last_error.append(f"building {SOURCE.name} failed: " + " | ".join(errors))
    return None


def load(path: Path) -> ctypes.CDLL:
    """A built decode_ops library, its functions' signatures set."""
    lib = ctypes.CDLL(str(path))
    for name, args in SIGNATURES.items():
        getattr(lib, name).argtypes, getattr(lib, name).restype = args, None
    lib.attention_threads.restype = ctypes.c_int64
    return lib


def built(cc: str, flags: list[str]) -> Path:
    """The shared library of decode_ops.c built with ``flags``: from the cache, or compiled into it.
    With -fopenmp it links libgomp.so.1, which resolves to the copy PyTorch's CPU wheels load (one
    OpenMP runtime, one thread pool in the process)."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([cc, *flags]).encode() + _cpu_id().encode()).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "grpo"
    path = cache / f"decode_ops-{key}.so"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".so")
        os.close(fd)
        try:  # built beside its final name, then renamed: a concurrent process never loads half a file
            subprocess.run([cc, *flags, "-o", tmp, str(SOURCE)], check=True, capture_output=True, timeout=120)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return path


def compiler() -> str | None:
    """The C compiler decode_ops.c is built with: $CC, else cc or gcc on PATH (None: none found)."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def unavailable_reason() -> str | None:
    """Why ``library()`` is None (None when it loaded)."""
    return None if library() is not None else (_last_error[-1] if _last_error else "unknown")


PANEL_ROWS = 8


def _panel_linear(lib: ctypes.CDLL, fallback, weight: torch.Tensor, bias: torch.Tensor | None):
    """x [n, in] -> x @ weight.T + bias [n, out] for n <= 8 through decode_ops.c's panel_linear8, the
    weight [out, in] repacked once into panels [out / 32, in, 32] (a copy; where out is no multiple of
    32, ``fallback``'s product instead). x must be the first n rows of a contiguous buffer of at
    least 8 (the kernel computes 8; rows past n are ignored). The result is a view of a buffer the next
    call overwrites.

    Why: at 8 rows, oneDNN's inner product ran at ~15-20 GB/s here, the machine's bandwidth being ~28;
    this kernel reads each weight once for the 8 rows at ~21-29 GB/s (a batch-8 step's four products,
    30 layers of SmolLM2: 23.3 -> 16.3 ms)."""
    n_out, k = weight.shape
    if n_out % 32:
        return fallback(weight, bias)
    panels = weight.view(n_out // 32, 32, k).transpose(1, 2).contiguous()  # [out / 32, in, 32]
    out = torch.empty(PANEL_ROWS, n_out)  # [8, out]

    def forward(x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        lib.panel_linear8(x.data_ptr(), k, panels.data_ptr(), n_out, out.data_ptr())
        y = out[:x.shape[0]]
        return y + bias if bias is not None else y
    return forward


class NativeDecoder(FusedDecoder):
    """FusedDecoder's products with decode_ops.c between them (module docstring). Same interface:
    ``start`` with the prefilled prompt cache, then ``step`` per token."""

    def __init__(self, model, lib: ctypes.CDLL, *, packed: bool = True, rows: int | None = None):
        """``rows``: the rollout's N rows; at most PANEL_ROWS of them, the products run panel_linear8
        (weights in panels, read once per step at close to memory bandwidth) instead of oneDNN."""
        self.panels = rows is not None and rows <= PANEL_ROWS
        linear = functools.partial(_panel_linear, lib, default_linear(packed)) if self.panels else None
        super().__init__(model, packed=packed, linear=linear)
        self.lib = lib
        self.hidden = model.config.hidden_size

    def start(self, cache, prompt_mask: torch.Tensor, g: int, capacity: int) -> None:
        """Take each layer's prompt keys and values [B, Hk, P, D] from ``cache`` after the prefill
        (one copy per prompt, not G), and make the completion buffers for ``capacity`` new tokens."""
        b, p = prompt_mask.shape
        n_rows, d = b * g, self.d
        p16, c16 = -(-p // 16) * 16, -(-capacity // 16) * 16  # the C code reads whole blocks of 16 positions
        # keys transposed [B, Hk, D, P16] (rows padded with zeros), values [B, Hk, P, D], per layer
        self.pk = [torch.nn.functional.pad(layer.keys.transpose(-1, -2), (0, p16 - p)).contiguous()
                   for layer in cache.layers]
        self.pv = [layer.values.contiguous() for layer in cache.layers]
        self.ck = [torch.zeros(n_rows, self.hk, d, c16) for _ in self.layers]  # [N, Hk, D, C16] keys transposed
        self.cv = [torch.zeros(n_rows, self.hk, c16, d) for _ in self.layers]  # [N, Hk, C16, D]
        padded = bool((prompt_mask == 0).any())
        self.pmask = prompt_mask.to(torch.uint8).contiguous() if padded else None  # [B, P]
        self.g, self.p, self.p16, self.c16, self.capacity, self.t = g, p, p16, c16, capacity, 0
        self.work = torch.empty(self.lib.attention_threads(), self.hq // self.hk, p + c16 + 16)  # scratch scores
        rows = max(n_rows, PANEL_ROWS) if self.panels else n_rows  # panel_linear8 reads 8 rows
        self.x = torch.zeros(rows, self.hidden)  # [N, H] the normed input of the next product
        self.att = torch.zeros(rows, self.hq * d)  # [N, Hq D]
        self.act = torch.zeros(rows, self.inter)  # [N, I]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Feed tokens [n] of global rows ``rows`` [n] (ascending) at positions [n, 1]; returns the
        final normed hidden states [n, H]."""
        if self.t >= self.capacity:
            raise ValueError(f"NativeDecoder: more than {self.capacity} steps after start")
        lib, n, hq, hk, d = self.lib, tokens.shape[0], self.hq, self.hk, self.d
        h = self.embed[tokens]  # [n, H] a fresh tensor: the residual stream, updated in place
        cos, sin = (c[:, 0].contiguous() for c in self.rotary(h[:, None], positions))  # [n, D]
        rows = rows.to(torch.int64).contiguous()
        x, att, act = self.x[:n], self.att[:n], self.act[:n]  # contiguous prefixes of the buffers
        pmask = None if self.pmask is None else self.pmask.data_ptr()
        lib.add_rms(h.data_ptr(), None, x.data_ptr(), None, n, self.hidden, self.layers[0]["eps1"])
        for i, w in enumerate(self.layers):
            qkv = w["qkv"](x)  # [n, (Hq + 2 Hk) D]
            lib.decode_attention(qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(), self.pk[i].data_ptr(),
                                 self.pv[i].data_ptr(), pmask, self.p, self.p16, self.ck[i].data_ptr(),
                                 self.cv[i].data_ptr(), self.c16, self.t, rows.data_ptr(), self.g, n, hq, hk, d, w["scale"],
                                 self.work.data_ptr(), att.data_ptr())
            o = w["o"](att)  # [n, H] (held: a temporary's memory could be reused before the call)
            lib.add_rms(h.data_ptr(), o.data_ptr(), x.data_ptr(), None, n, self.hidden, w["eps2"])
            gu = w["gate_up"](x)  # [n, 2 I]
            lib.silu_mul(gu.data_ptr(), act.data_ptr(), n, self.inter)
            down = w["down"](act)  # [n, H]
            last = i + 1 == len(self.layers)  # the final norm has its weight; the others are folded
            eps = self.norm[1] if last else self.layers[i + 1]["eps1"]
            weight = self.norm[0].data_ptr() if last else None
            lib.add_rms(h.data_ptr(), down.data_ptr(), x.data_ptr(), weight, n, self.hidden, eps)
        self.t += 1
        return x.clone()  # [n, H]
