"""A rollout engine in a process of its own, sampling while the trainer trains.

The trainer's weights reach the engine process through shared memory: ``publish`` copies the
policy's parameters into one shared buffer per dtype and raises the version counter under a lock;
the engine process copies the newest version into its own model before each sampling call (and,
with partial rollouts, between segments: ``segments.sample_versioned``), so a copy never stops the
other side for longer than a memory copy. Only the first version moves every parameter: after it,
only the trainable ones (all of a full fine-tune; a LoRA policy's adapters, the frozen base held once
by the engine process, which wraps its model with the policy's own LoRA config). A QLoRA base is sent
once dequantized: the engine process samples it unquantized, with the same values the 4-bit layers
multiply by. The engine process is started from the trainer's main thread and dies with it
(``infra.processes.die_with_parent``); a call whose process died is an EngineError naming its exit
code, and so is every later call.

Any registered engine runs inside (``make_engine`` with the run's settings): the in-process engines
sample from the process's own copy of the weights; a vLLM engine gets them through its own
``sync_weights``.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from grpo.errors import EngineError
from grpo.infra.processes import die_with_parent
from grpo.rollout.types import Rollout
from grpo.rollout.engine import RolloutEngine, SamplingSettings, engine_class, make_engine
from grpo.rollout.segments import sample_versioned
from grpo.rollout.whole import architecture, lora_config, replica_model, whole_weights

POLL_SECONDS = 0.2  # how often a waiting call checks that the engine process is alive


@dataclass(frozen=True)
class EngineProcessSettings:
    """How the engine process is built (train/settings.py builds it from the Config): the engine (a
    rollout_engine value), its kernel setting and options, its CPU threads (0: torch's default),
    partial-rollout segments (0: off) and how long it may take to start."""

    engine: str  # rollout_engine: its ROLLOUT_ENGINES name
    kernels: str  # decode_kernels
    options: object  # an instance of the engine's Options (None: their defaults)
    threads: int  # async_engine_threads, else half the cores (0: torch's default)
    segment_tokens: int = 0  # partial_rollout_tokens where partial_rollouts (0: off)
    start_timeout: float = 600.0


def _layout(weights: dict[str, torch.Tensor]) -> list[tuple[str, str, int, tuple]]:
    """(name, dtype, offset, shape) of each parameter in its dtype's flat buffer."""
    offsets: dict[str, int] = {}
    out = []
    for name, p in weights.items():
        key = str(p.dtype).removeprefix("torch.")
        out.append((name, key, offsets.get(key, 0), tuple(p.shape)))
        offsets[key] = offsets.get(key, 0) + p.numel()
    return out


def _views(flat: dict[str, torch.Tensor], layout) -> dict[str, torch.Tensor]:
    return {name: flat[key][off:off + int(np.prod(shape, dtype=np.int64))].view(shape)
            for name, key, off, shape in layout}


def _copy(dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, t in dst.items():
            t.copy_(src[name])


def pack_rollout(ro: Rollout) -> dict:
    """A Rollout as plain data (numpy arrays): what crosses the pipe without shared-memory handles."""
    return {f.name: getattr(ro, f.name).cpu().numpy() if isinstance(getattr(ro, f.name), torch.Tensor)
            else getattr(ro, f.name) for f in dataclasses.fields(ro)}


def unpack_rollout(d: dict) -> Rollout:
    return Rollout(**{k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in d.items()})


class _LoadedWeights:
    """The engine process's side of the shared weights: its model, and ``refresh`` copying a newer
    version in (every weight the first time, the trainable ones after) before telling ``engine``."""

    def __init__(self, w: SharedWeights):
        self.w = w
        dtype = getattr(torch, w.layout[0][1]) if w.layout else torch.float32
        self.model = replica_model(w.model_config, dtype, w.peft_config)
        self.mine, self.shared = dict(self.model.named_parameters()), _views(w.flat, w.layout)
        self.changing = {name: self.shared[name] for name in w.trainable}
        self.version, self.engine = -1, None

    def refresh(self) -> int:
        w = self.w
        if w.version.value != self.version:
            with w.lock:
                names = self.changing if self.version >= 0 else self.shared  # the frozen rest is copied once
                _copy({n: self.mine[n] for n in names}, self.shared)
                self.version = w.version.value
            if self.engine is not None:
                self.engine.sync_weights(self.model)
        return self.version


def _engine_main(conn, settings: EngineProcessSettings, weights: SharedWeights, tokenizer, parent_pid: int) -> None:
    """The engine process: its own model of the policy's architecture, the shared weights copied in
    (after the first version only the trainable ones), then one request at a time from ``conn`` until None."""
    die_with_parent(parent_pid)
    try:
        if settings.threads:
            torch.set_num_threads(settings.threads)
        loaded = _LoadedWeights(weights)
        refresh, model = loaded.refresh, loaded.model
        refresh()
        engine = loaded.engine = make_engine(settings.engine, model, tokenizer, kernels=settings.kernels,
                                             options=settings.options)
        conn.send(("ready", None))
    except BaseException as e:  # noqa: BLE001 - reported to the trainer, which raises it
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    try:
        while True:
            msg = conn.recv()
            if msg is None:
                break
            try:
                ro = sample_versioned(engine, segment_tokens=settings.segment_tokens, refresh=refresh, **msg)
                conn.send(("ok", pack_rollout(ro)))
            except Exception as e:  # noqa: BLE001 - a bad request: the trainer raises it, the process serves on
                conn.send(("error", f"{type(e).__name__}: {e}"))
    except EOFError:  # the trainer closed its end
        pass
    finally:
        engine.close()


@dataclass
class SharedWeights:
    """The policy's weights in shared memory, as both processes see them: the flat buffers (one per
    dtype) and where each parameter lies in them, which parameters change between versions (the
    trainable ones), the architecture (and LoRA config) the engine process builds, the version
    counter and the lock a copy holds."""

    flat: dict
    layout: list
    trainable: tuple
    model_config: object
    peft_config: object
    version: object
    lock: object


class EngineProcess:
    """The parent's handle on the engine process (started here, from the calling thread, which
    should be the trainer's main thread: the child dies when it ends). ``last_publish_bytes``: what
    the latest ``publish`` copied (every parameter the first time, the trainable ones after);
    ``full_bytes``: what a publish of every parameter copies."""

    def __init__(self, model, tokenizer, settings: EngineProcessSettings, *, version: int = 0):
        ctx = torch.multiprocessing.get_context("spawn")
        self.settings, self.layout = settings, _layout(whole_weights(model))
        sizes: dict[str, int] = {}
        for _, key, off, shape in self.layout:
            sizes[key] = max(sizes.get(key, 0), off + int(np.prod(shape, dtype=np.int64)))
        self.flat = {key: torch.empty(n, dtype=getattr(torch, key)).share_memory_() for key, n in sizes.items()}
        self.views = _views(self.flat, self.layout)
        self.trainable = tuple(name for name, p in model.named_parameters() if p.requires_grad)
        self.weights = SharedWeights(self.flat, self.layout, self.trainable, architecture(model), lora_config(model),
                                     ctx.Value("q", -1, lock=False), ctx.Lock())
        self.version, self.lock = self.weights.version, self.weights.lock
        self.last_publish_bytes = 0
        self.full_bytes = sum(v.numel() * v.element_size() for v in self.views.values())
        self.publish(model, version)
        self.conn, child = ctx.Pipe()
        # a vLLM engine starts its engine core in a process of its own, which a daemonic process may
        # not; either way the engine process dies with the trainer (die_with_parent) and close() ends it
        daemon = not engine_class(settings.engine).own_kernels
        self.proc = ctx.Process(target=_engine_main, daemon=daemon, name="grpo-rollout-engine",
                                args=(child, settings, self.weights, tokenizer, os.getpid()))
        self.proc.start()
        child.close()
        self.dead: str | None = None
        self.closed = False
        self._call_lock = threading.Lock()  # one request on the pipe at a time
        self._wait("start", deadline=time.monotonic() + settings.start_timeout)

    @property
    def published(self) -> int:
        return int(self.version.value)

    def publish(self, model, version: int) -> None:
        """``model``'s current parameters become the engine's next weights, numbered ``version``: all of
        them the first time, then the trainable ones (the frozen rest cannot have changed)."""
        first = self.version.value < 0
        views = self.views if first else {n: self.views[n] for n in self.trainable}
        params = whole_weights(model, None if first else set(self.trainable))
        with self.lock:
            _copy(views, params)
            self.version.value = version
        self.last_publish_bytes = sum(t.numel() * t.element_size() for t in views.values())

    def generate(self, **request) -> Rollout:
        """One sampling call (``sample_versioned``'s keywords but the engine) in the engine process."""
        with self._call_lock:
            if self.dead is not None:
                raise EngineError(self.dead)
            try:
                self.conn.send(request)
            except (BrokenPipeError, OSError):
                self._died("sampling")
            return unpack_rollout(self._wait("sampling"))

    def _wait(self, what: str, deadline: float | None = None):
        while not self.conn.poll(POLL_SECONDS):
            if not self.proc.is_alive() or self.closed:
                self._died(what)
            if deadline is not None and time.monotonic() > deadline:
                self.dead = (f"the rollout engine process (pid {self.proc.pid}) did not start within "
                             f"{self.settings.start_timeout:g} s")
                self.close()
                raise EngineError(self.dead)
        try:
            kind, payload = self.conn.recv()
        except (EOFError, OSError):
            self._died(what)
        if kind == "error":
            if what == "start":
                self.close()
                raise EngineError(f"the rollout engine process could not start its {self.settings.engine!r} "
                                  f"engine: {payload}")
            raise RuntimeError(f"rollout engine process: {payload}")
        return payload

    def _died(self, what: str):
        self.proc.join(timeout=1.0)
        code = self.proc.exitcode
        if self.closed:
            self.dead = "the rollout engine process was closed"
        else:
            how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
            self.dead = f"the rollout engine process (pid {self.proc.pid}, {self.settings.engine}) {how} while {what}"
        raise EngineError(self.dead)

    def close(self) -> None:
        """Ask the process to end, then end it; later calls do nothing."""
        if self.closed:
            return
        self.closed = True
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=5.0)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5.0)
        self.conn.close()


class ProcessEngine(RolloutEngine):
    """A RolloutEngine whose sampling runs in an EngineProcess: what the asynchronous producer samples
    with (multi-turn episodes included). Every Rollout it returns carries ``versions``. It declares
    the capabilities of the engine inside, but not ``supports_stop`` (a stop function stays in this
    process: the episode runner cuts the rows itself)."""

    name = "process"

    def __init__(self, model, tokenizer, *, process: EngineProcess):
        inner = engine_class(process.settings.engine)
        super().__init__(model, tokenizer)
        self.process = process
        self.same_tokens_for_keys = inner.same_tokens_for_keys
        self.returns_sampling_logprobs = inner.returns_sampling_logprobs
        self.own_kernels = inner.own_kernels

    def _generate(self, prompts, *, group_size: int, sampling: SamplingSettings, keys: list[int] | None,
                  with_logprobs: bool, greedy: bool) -> Rollout:
        return self.process.generate(prompts=list(prompts), group_size=group_size, sampling=sampling, keys=keys,
                                     with_logprobs=with_logprobs, greedy=greedy)

    def publish(self, policy, *, version: int) -> None:
        """``policy``'s current weights become the process's next, numbered ``version`` (the trainer's
        step), without stopping a sampling call in progress."""
        self.process.publish(policy, version)

    def sync_weights(self, policy) -> None:
        """Nothing: the process's weights arrive numbered, by ``publish`` (which the run's Engines call)."""

    def sync_metrics(self) -> dict:
        """The bytes the latest publish copied, against a publish of every weight."""
        return {"async/publish_bytes": self.process.last_publish_bytes, "async/full_publish_bytes": self.process.full_bytes}

    def close(self) -> None:
        self.process.close()
        super().close()
