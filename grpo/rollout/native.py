"""The fused decode step with its small ops in C: rotary embedding, KV-cache write and attention in
one call per layer, residual + RMSNorm and SiLU * up in one call each (decode_ops.c), between the
four oneDNN-packed products of decoder.py.

Dimension letters: n live rows, N = B * G rows, B prompts, H hidden size, Hq / Hk query / key-value
heads, D head dim, I intermediate size, P prompt positions, C completion positions.

Why: on the 2-core CPU this project measures on, a batch-8 decode step of SmolLM2-135M took ~35 ms
in TorchDecoder, of which ~20 ms were the products (close to memory bandwidth) and ~9 ms the ~40
small PyTorch ops per layer around them (dispatch, and attention over a KV cache copied G times).
Here each layer makes 4 products and 4 C calls, and attention reads each prompt's keys and values
once for its G rows: the prompt's cache is kept once per prompt, each row's own tokens in a
per-row buffer indexed by global row, so a row that ends is simply no longer passed.

The C file is built on first use with the system C compiler (``cc``, ``-O3 -march=native``) into
the cache folder (``grpo.infra.cache_folder``: ``$GRPO_CACHE`` or ``~/.cache/grpo``), keyed by the
source, the flags and the CPU; where no compiler is found or the build fails, ``library()`` is None and the fast backend steps TorchDecoder
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
from dataclasses import dataclass
from pathlib import Path

import torch

from grpo.infra.cache_folder import cache_dir
from grpo.rollout.decoder import TorchDecoder

SOURCE = Path(__file__).with_name("decode_ops.c")


def march() -> str:
    """The -march the C file is built for: ``native`` (this CPU), or ``$GRPO_NATIVE_MARCH``, e.g.
    ``x86-64-v3`` (AVX2 + FMA, no AVX-512) to run an AVX-512 machine's build as an AVX2 one's
    (docs/benchmarks/history.md: emulating the other CPU class)."""
    return os.environ.get("GRPO_NATIVE_MARCH", "native")


def flags() -> list[str]:
    """The compiler flags: with OpenMP (attention and the panel products split rows over PyTorch's
    threads)."""
    return ["-O3", f"-march={march()}", "-fno-math-errno", "-fno-trapping-math", "-fopenmp", "-shared", "-fPIC"]


def serial_flags() -> list[str]:
    """Without an OpenMP runtime to link: the same code, one thread (the pragmas' SIMD hints kept)."""
    return [f if f != "-fopenmp" else "-fopenmp-simd" for f in flags()]

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
SIGNATURES = {
    "add_rms": [_P, _P, _P, _P, _I, _I, _F],
    "silu_mul": [_P, _P, _I, _I],
    "gumbel_argmax": [_P, _I, _I, _P, _P, _P],
    "decode_attention": [_P, _P, _P, _P, _P, _P, _I, _I, _P, _P, _I, _I, _P, _I, _I, _I, _I, _I, _F, _P, _P],
    "attention_threads": [],
    "vector_lanes": [],
    "panel_width": [],
    "panel_linear": [_P, _I, _I, _P, _I, _P],
    "panel_linear_bf16": [_P, _I, _I, _P, _I, _P],
    "paged_attention": [_P, _P, _P, _P, _P, _I, _P, _I, _P, _P, _I, _I, _I, _I, _F, _P, _P],
}
_COUNTS = ("attention_threads", "vector_lanes", "panel_width")  # functions returning an int64


def cpu_id() -> str:
    """What -march=native compiles for: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    return "\n".join(sorted({x for x in lines if x.startswith(("model name", "flags", "Features"))}))


def cpu_flags() -> list[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty where there is none)."""
    for line in cpu_id().splitlines():
        if line.startswith(("flags", "Features")):
            return line.split(":", 1)[1].split()
    return []


@dataclass(frozen=True)
class Loaded:
    """The outcome of building and loading decode_ops.c: the library, or None and why."""

    lib: ctypes.CDLL | None
    reason: str | None = None


@functools.cache  # a per-process cache: built and loaded once (the build itself is cached on disk)
def load_library() -> Loaded:
    """decode_ops.c built and loaded, or why it cannot be."""
    if os.environ.get("GRPO_NATIVE", "1") == "0":
        return Loaded(None, "GRPO_NATIVE=0")
    cc = compiler()
    if cc is None:
        return Loaded(None, "no C compiler (cc or gcc) on PATH")
    errors = []
    for options in (flags(), serial_flags()):
        try:
            return Loaded(load(built(cc, options)))
        except (OSError, subprocess.SubprocessError) as e:
            detail = getattr(e, "stderr", b"") or b""
            errors.append(f"{' '.join(options)}: {e} {detail.decode(errors='replace')[:400]}")
    return Loaded(None, f"building {SOURCE.name} failed: " + " | ".join(errors))


def library() -> ctypes.CDLL | None:
    """decode_ops.c built and loaded (once per process: ``load_library``), or None where it cannot be
    (``unavailable_reason()`` says why)."""
    return load_library().lib


def load(path: Path) -> ctypes.CDLL:
    """A built decode_ops library, its functions' signatures set."""
    lib = ctypes.CDLL(str(path))
    for name, args in SIGNATURES.items():
        getattr(lib, name).argtypes, getattr(lib, name).restype = args, None
    for name in _COUNTS:
        getattr(lib, name).restype = ctypes.c_int64
    return lib


def built(cc: str, options: list[str]) -> Path:
    """The shared library of decode_ops.c built with ``flags``: from the cache, or compiled into it.
    With -fopenmp it links libgomp.so.1, which resolves to the copy PyTorch's CPU wheels load (one
    OpenMP runtime, one thread pool in the process)."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([cc, *options]).encode() + cpu_id().encode()).hexdigest()[:16]
    cache = cache_dir()
    path = cache / f"decode_ops-{key}.so"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".so")
        os.close(fd)
        try:  # built beside its final name, then renamed: a concurrent process never loads half a file
            subprocess.run([cc, *options, "-o", tmp, str(SOURCE)], check=True, capture_output=True, timeout=120)
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
    return load_library().reason


def panel_product(lib: ctypes.CDLL, weight: torch.Tensor, bias: torch.Tensor | None, *, bfloat16: bool = False):
    """x [n, in] -> x @ weight.T + bias [n, out] through decode_ops.c's panel_linear, the weight
    [out, in] repacked once into panels [out / W, in, W] of W = ``lib.panel_width()`` output columns
    (32 on AVX-512, 8 on AVX2; a copy; where out is no multiple of W, F.linear instead). The kernel
    works on blocks of 8 rows, then on the rows left one at a time. The result is a buffer the next
    call with as many rows overwrites.
    ``bfloat16``: the panels hold the weight rounded to bfloat16 (half the bytes; panel_linear_bf16),
    the sums stay float32: the product of x and the rounded weight.

    Why: at 8 rows oneDNN's inner product and MKL's sgemm read the weights below memory bandwidth
    (AVX-512 core: oneDNN ~15-20 GB/s of ~28; AVX2 core: MKL 10.5, oneDNN 13-16 of ~20); this kernel
    reads each weight once for all the rows (AVX-512: 21-29 GB/s; AVX2, one core: 19.6-20.1 GB/s).
    Whether it wins on a machine and shape is measured (grpo.rollout.tuning)."""
    n_out, k = weight.shape
    width = lib.panel_width()
    if n_out % width:
        w = weight.to(torch.bfloat16).float() if bfloat16 else weight
        return functools.partial(torch.nn.functional.linear, weight=w, bias=bias)
    panels = weight.view(n_out // width, width, k).transpose(1, 2).contiguous()  # [out / W, in, W]
    if bfloat16:
        panels = panels.to(torch.bfloat16)  # round to nearest even; the kernel reads the 16-bit patterns
    kernel = lib.panel_linear_bf16 if bfloat16 else lib.panel_linear
    buffers = {}  # rows -> y [n, out], made on first use

    def forward(x: torch.Tensor) -> torch.Tensor:  # [n, in] -> [n, out]
        n = x.shape[0]
        if n not in buffers:
            buffers[n] = torch.empty(n, n_out)
        y = buffers[n]
        x = x.contiguous()
        kernel(x.data_ptr(), n, k, panels.data_ptr(), n_out, y.data_ptr())
        return y + bias if bias is not None else y
    return forward


class NativeDecoder(TorchDecoder):
    """TorchDecoder's products with decode_ops.c between them (module docstring). Same interface:
    ``start`` with the prefilled prompt cache, then ``step`` per token."""

    def __init__(self, model, lib: ctypes.CDLL, *, packed: bool = True, linears: dict | None = None):
        """``linears``: role -> product factory (grpo.rollout.tuning's plan); TorchDecoder's default
        for the roles not given."""
        super().__init__(model, packed=packed, linears=linears)
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
        self.x = torch.zeros(n_rows, self.hidden)  # [N, H] the normed input of the next product
        self.att = torch.zeros(n_rows, self.hq * d)  # [N, Hq D]
        self.act = torch.zeros(n_rows, self.inter)  # [N, I]

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
