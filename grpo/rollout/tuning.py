"""Which kernel runs each matrix product of a decode step on this machine: measured, not assumed.

Dimension letters: n rows of the step, K input features, O output features, L layers.

Why: the same kernel is the fastest on one CPU and the slowest on another. On a 2-core AMD EPYC with
AVX-512, oneDNN's packed inner product beat MKL's sgemm by 1.6-2.5x at 8 rows and decode_ops.c's panel
product beat both; on the same EPYC family with AVX2 only, one core, the panel product built for
AVX-512's width ran at 0.6 GB/s (its accumulators spilled), oneDNN at 13-16 GB/s and MKL at 10.5.
So, as cuDNN's benchmark mode does, the first rollout at a new (CPU, build flags, threads, model
shapes, rows) times every available product on L distinct weights of each role's shape, one after
the other (the weights then come from memory as in a real step, not from a warm cache), keeps the fastest
per role, and writes the choice to the cache folder (``grpo.infra.cache_folder``: ``$GRPO_CACHE`` or
``~/.cache/grpo``; ``kernels-<key>.json``); later rollouts and runs read it. ``decode_kernels`` overrides any role.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from grpo.infra.cache_folder import cache_dir
from grpo.infra.process_cache import ProcessCache
from grpo.registry import Registry
from grpo.rollout import native
from grpo.rollout.kernels import head_chunks, onednn_available, packed_linear

ROLES = ("qkv", "o", "gate_up", "down", "head")  # the products of a Llama-family decode step
MEASURED = ProcessCache("the kernel plans (KernelPlan) and auto's backend choices (grpo.rollout.choice) measured or "
                        "read in this process, by plan_key", stale_when="never within a process: the key holds the "
                        "machine, the build, the threads, the model's shapes and the rows")


@dataclass(frozen=True)
class Product:
    """A way to compute x [n, K] -> x @ weight.T + bias [n, O] for a weight fixed for a rollout."""
    make: Callable  # (weight [O, K], bias [O] or None) -> (x [n, K] -> [n, O])
    unavailable: Callable[[], str | None]  # why it cannot run here (None: it can)
    doc: str
    precision: str = "float32"  # the weights' as the product reads them (PRECISIONS)


def _mkl(weight: torch.Tensor, bias: torch.Tensor | None):
    """F.linear; an output layer's rows in blocks (kernels.head_chunks: bitwise the same, ~1.5x faster)."""
    if weight.shape[0] <= 8192:
        return functools.partial(F.linear, weight=weight, bias=bias)
    chunks = head_chunks(weight, bias)
    return lambda x: torch.cat([F.linear(x, w, b) for w, b in chunks], -1)


def _panel(weight: torch.Tensor, bias: torch.Tensor | None):
    return native.panel_product(native.library(), weight, bias)


def _panel_bf16(weight: torch.Tensor, bias: torch.Tensor | None):
    return native.panel_product(native.library(), weight, bias, bfloat16=True)


PRODUCTS: Registry[Product] = Registry("decode kernel", field="decode_kernels")
PRODUCTS.register("panel", Product(_panel, native.unavailable_reason, "decode_ops.c's panel product: each weight "
                                   "read once for all rows, 8 at a time, with the vector width of the build"))
PRODUCTS.register("onednn", Product(packed_linear, lambda: None if onednn_available() else "torch built without oneDNN",
                                    "oneDNN's inner product on the weight reordered once into its blocked layout"))
PRODUCTS.register("mkl", Product(_mkl, lambda: None, "F.linear (MKL's sgemm on the [O, K] layout)"))
PRODUCTS.register("panel_bf16", Product(_panel_bf16, native.unavailable_reason, "the panel product on the weight "
                                        "rounded to bfloat16 (half the bytes read; float32 sums)", "bfloat16"))
# what a plan may choose from: exact float32 products (rollouts: the policy's own distribution), or also
# products on weights rounded to bfloat16 (serving: --dtype)
PRECISIONS = {"float32": ("float32",), "bfloat16": ("bfloat16",), "auto": ("float32", "bfloat16")}


def needs_native(name: str) -> bool:
    """Whether product ``name`` runs in decode_ops.c (unavailable where the native ops are off)."""
    return PRODUCTS[name].unavailable is native.unavailable_reason


def parse_override(text: str, *, dtype: str = "float32") -> dict[str, str]:
    """``decode_kernels`` as role -> product: 'auto' (every role measured), one product name for every
    role, or 'role=name,...' (the roles not named are measured), each product one whose precision
    ``dtype`` allows (PRECISIONS). Raises ValueError naming the bad part."""
    text = (text or "auto").strip()
    if text == "auto":
        return {}
    if "=" not in text:
        return dict.fromkeys(ROLES, _check_product(text, dtype))
    out = {}
    for part in text.split(","):
        role, _, name = (s.strip() for s in part.partition("="))
        if role not in ROLES:
            raise ValueError(f"decode_kernels: unknown role {role!r} in {text!r}; roles: {', '.join(ROLES)}")
        out[role] = _check_product(name, dtype)
    return out


def _check_product(name: str, dtype: str) -> str:
    if name not in PRODUCTS:
        raise ValueError(f"decode_kernels: unknown product {name!r}; valid: auto, {', '.join(PRODUCTS)}")
    allowed = PRECISIONS[dtype]
    if PRODUCTS[name].precision not in allowed:
        valid = ", ".join(n for n, p in PRODUCTS.items() if p.precision in allowed)
        raise ValueError(f"decode_kernels: {name} reads the weights in {PRODUCTS[name].precision}; this decode runs "
                         f"{dtype} (products: {valid}; serving rounds the weights with grpo serve --dtype)")
    return name


@dataclass
class KernelPlan:
    """The product each role runs, and the per-layer seconds each candidate took (empty for a role
    set by the config)."""
    products: dict[str, str]
    seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = "measured"  # measured | cache | config

    def factory(self, role: str) -> Callable:
        """The (weight, bias) -> product for ``role``."""
        return PRODUCTS[self.products[role]].make

    def describe(self, rows: int) -> str:
        parts = []
        for role in ROLES:  # the chosen product and its time (every candidate's: the cache file, ``seconds``)
            t = self.seconds.get(role, {}).get(self.products[role])
            parts.append(f"{role} {self.products[role]}" + (f" {t * 1e3:.2f} ms" if t is not None else ""))
        return f"decode kernels ({self.source}, {rows} rows, {machine_summary()}): " + ", ".join(parts)


def machine_summary() -> str:
    """The CPU class and threads, as every figure should say."""
    flags = set(native.cpu_flags())
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    emulated = os.environ.get("GRPO_NATIVE_MARCH") or os.environ.get("ATEN_CPU_CAPABILITY")
    return f"{isa}{' (as ' + emulated + ')' if emulated else ''}, {torch.get_num_threads()} threads"


def role_weights(model) -> dict[str, list[tuple[int, int]]]:
    """Each role's weight shapes (O, K), one per layer, of a Llama-family CausalLM."""
    cfg = model.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    h, inter, hq, hk = cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads
    layers = cfg.num_hidden_layers
    return {"qkv": [((hq + 2 * hk) * d, h)] * layers, "o": [(h, hq * d)] * layers,
            "gate_up": [(2 * inter, h)] * layers, "down": [(h, inter)] * layers,
            "head": [(model.get_output_embeddings().weight.shape[0], h)]}


def time_products(shapes: list[tuple[int, int]], rows: int, names: list[str], *, repeats: int = 3,
                  seed: int = 0) -> dict[str, float]:
    """Seconds per product of each candidate in ``names`` over L distinct weights of ``shapes`` (a
    constant value: the time does not depend on it, and no denormals), the best of ``repeats`` sweeps
    over all L. Draws no global random numbers (a run's RNG state is the same with or without it)."""
    weights = [torch.full((o, k), 0.01) for o, k in shapes]  # L x [O, K]
    x = torch.randn(rows, shapes[0][1], generator=torch.Generator().manual_seed(seed))  # [n, K]
    out = {}
    for name in names:
        fns = [PRODUCTS[name].make(w, None) for w in weights]
        for fn in fns[:2]:
            fn(x)  # first calls: lazy set-up (oneDNN primitives, page faults of packed copies)
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            for fn in fns:
                fn(x)
            best = min(best, (time.perf_counter() - t) / len(fns))
        out[name] = best
        del fns
    return out


def _cache_path(key: str) -> Path:
    return cache_dir() / f"kernels-{key}.json"


def plan_key(model, rows: int, kind: str = "products") -> str:
    """What a measured choice depends on: the CPU and its emulation switches, the C build, torch and
    its threads, the weight shapes, the rows."""
    env = {k: os.environ.get(k) for k in ("GRPO_NATIVE", "GRPO_NATIVE_MARCH", "ONEDNN_MAX_CPU_ISA",
                                          "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")}
    parts = [kind, _build_id(), torch.get_num_threads(), env, role_weights(model), rows]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


@functools.cache
def _build_id() -> str:
    """The parts of a key fixed for the process (the CPU, the C source, torch), read once: keys are
    made at every rollout, and these are a file read each."""
    return native.cpu_id() + native.SOURCE.read_text() + torch.__version__


def read_cached(key: str) -> dict | None:
    try:
        return json.loads(_cache_path(key).read_text())
    except (OSError, ValueError):
        return None


def write_cached(key: str, value: dict) -> None:
    """Written beside its final name and renamed (a concurrent process reads all of it or nothing);
    a read-only cache folder only costs the next run a measurement."""
    path = _cache_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(value))
        os.replace(tmp, path)
    except OSError:
        pass


def kernel_plan(model, rows: int, override: str = "auto", *, dtype: str = "float32") -> KernelPlan:
    """The products a decode step of ``rows`` rows runs for ``model``: ``override``'s roles as given,
    the others measured once per key (this process, then the cache folder), among the products whose
    precision ``dtype`` allows (PRECISIONS: rollouts keep float32; serving may round to bfloat16)."""
    fixed = parse_override(override, dtype=dtype)
    allowed = PRECISIONS[dtype]
    key = plan_key(model, rows, "products" if dtype == "float32" else f"products {dtype}")
    measured = MEASURED.get(key)
    if measured is None and len(fixed) < len(ROLES):
        cached = read_cached(key)
        if cached is not None and set(cached.get("products", {})) == set(ROLES):
            measured = KernelPlan(cached["products"], cached.get("seconds", {}), source="cache")
        else:
            names = [n for n, p in PRODUCTS.items() if p.precision in allowed and p.unavailable() is None]
            if not names:
                reasons = "; ".join(f"{n}: {p.unavailable()}" for n, p in PRODUCTS.items() if p.precision in allowed)
                raise ValueError(f"dtype {dtype}: no product can run here ({reasons})")
            seconds = {role: time_products(shapes, rows, names) for role, shapes in role_weights(model).items()}
            measured = KernelPlan({r: min(s, key=s.get) for r, s in seconds.items()}, seconds)
            write_cached(key, {"products": measured.products, "seconds": seconds})
        MEASURED[key] = measured
        note(measured.describe(rows))
    if not fixed:
        return measured
    products = {**(measured.products if measured else {}), **fixed}
    for name in set(fixed.values()):
        reason = PRODUCTS[name].unavailable()
        if reason is not None:
            raise ValueError(f"decode_kernels: {name} cannot run here: {reason}")
    seconds = {r: s for r, s in (measured.seconds if measured else {}).items() if r not in fixed}
    return KernelPlan(products, seconds, source="config" if len(fixed) == len(ROLES) else "config + measured")


def note(message: str) -> None:
    """Keep ``message`` (what a choice measured or read) for the trainer's log (take_messages)."""
    MEASURED.note(message)


def take_messages() -> list[str]:
    """The decisions made since the last call (each logged once)."""
    return MEASURED.take_notes()
