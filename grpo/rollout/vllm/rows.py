"""What the colocated vLLM engine (colocated.py), its server (grpo vllm-serve, server.py) and the server's
client engine (client.py) share: one request per row in plain JSON-able form, the vLLM calls that serve
them, and the engine base class that turns their answers into a Rollout.

A row's sampling settings travel as a dict of ``SamplingParams`` keyword arguments
(``request_params``), so the same settings reach vLLM in this process or over HTTP; the answers are
token ids and, per sampled token, its log q (``logprobs_mode="processed_logprobs"``: after the penalty,
temperature and truncation), which the mismatch correction compares with the trainer's log q.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import time
from dataclasses import dataclass

import torch

from grpo.errors import EngineError
from grpo.rollout.types import Rollout, encode_for_rollout, finish_rollout
from grpo.rollout.engine import RolloutEngine, SamplingSettings
from grpo.rollout.vllm.worker import PARENT_ENV

WORKER_EXTENSION = "grpo.rollout.vllm.worker.WeightSync"


@dataclass
class SampledRows:
    """vLLM's answer to one request per row: each row's tokens, and each sampled token's log-prob
    (None where none was asked for)."""

    token_ids: list[list[int]]
    logprobs: list[list[float]] | None


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


def request_params(sampling: SamplingSettings, *, greedy: bool, seed: int | None, with_logprobs: bool,
                   eos: list[int]) -> dict:
    """One row's ``SamplingParams`` keyword arguments (n = 1: vLLM's CPU build cannot seed a request
    with n > 1, and a row seeded alone draws the same tokens in any batch)."""
    return {"n": 1, "max_tokens": sampling.max_new_tokens, "stop_token_ids": list(eos), "ignore_eos": False,
            "temperature": 0.0 if greedy else sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1, "min_p": sampling.min_p,
            "repetition_penalty": sampling.repetition_penalty,
            "seed": None if greedy or seed is None else seed % (2 ** 63),
            "logprobs": 0 if with_logprobs and not greedy else None, "detokenize": False}


@dataclass(frozen=True)
class VLLMOptions:
    """A vLLM engine's options: the colocated engine's (Config fields ``vllm_*``), and ``grpo vllm-serve``'s."""

    gpu_memory_utilization: float = 0.2  # the share of memory vLLM may take for the model and KV cache
    enable_sleep_mode: bool = False  # GPU: weights and KV cache released between rollout and update
    enforce_eager: bool | None = None  # no CUDA graphs / compilation (None: eager on the CPU only)


def cpu_kv_cache_bytes(folder: str, *, share: float, dtype: str, total_bytes: int) -> int:
    """The KV cache grpo asks vLLM's CPU build for: ``share`` of the machine's memory less the weights.

    Given only a share, that build sizes the cache as share x the NUMA node's memory less the resident
    memory of its worker process, which holds Python, torch and vLLM (about 0.8 GiB) before any
    weight: a share of 0.05 that starts on a 24 GiB machine is refused on a 15 GiB one. Sizing the
    cache explicitly (vLLM's ``kv_cache_memory_bytes``) makes the share mean the same on any machine.
    ValueError naming the setting where the share does not hold the weights."""
    from grpo.rollout.vllm.requests import model_tensors

    per = {"float32": 4, "float64": 8}.get(dtype, 2)
    weights = sum(math.prod(shape) for shape in (model_tensors(folder) or {}).values()) * per
    kv = int(share * total_bytes) - weights
    if kv <= 0:
        raise ValueError(f"vllm_gpu_memory_utilization={share:g} of {total_bytes / 2**30:.1f} GiB does not hold "
                         f"the model's {weights / 2**30:.2f} GiB of weights; raise it")
    return kv


def start_llm(folder: str, *, dtype: str, cpu: bool, options: VLLMOptions):
    """A vLLM ``LLM`` on ``folder`` with grpo's worker extension (weights reloaded from a file). Its
    engine processes die with this process (worker.die_with_parent_plugin). ValueError naming
    the folder where vLLM cannot load the model."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ[PARENT_ENV] = str(os.getpid())
    from vllm import LLM

    eager = options.enforce_eager
    memory = {"gpu_memory_utilization": options.gpu_memory_utilization}
    if cpu:
        import psutil

        memory = {"kv_cache_memory_bytes": cpu_kv_cache_bytes(folder, share=options.gpu_memory_utilization,
                                                              dtype=dtype, total_bytes=psutil.virtual_memory().total)}
    try:
        return LLM(model=folder, dtype=dtype, skip_tokenizer_init=True, seed=0, **memory,
                   enforce_eager=cpu if eager is None else eager,
                   enable_sleep_mode=options.enable_sleep_mode,
                   logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION,
                   max_num_seqs=256, enable_prefix_caching=True,
                   # a prompt split across engine steps discards the token sampled after its first part and
                   # rewinds the request's generator, which vLLM's CPU build cannot do for a seeded request
                   # ("CPU Generator does not use offset", met at 128 rows in bench/engines.py)
                   enable_chunked_prefill=False)
    except Exception as e:  # an architecture vLLM does not know, a memory share refused, ...
        raise ValueError(f"vLLM could not load the model in {folder}: "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e


def llm_sample(llm, prompts: list[list[int]], params: list[dict]) -> SampledRows:
    """Sample one request per row (prompt token ids, ``request_params`` dict) on ``llm``."""
    from vllm import SamplingParams

    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], [SamplingParams(**d) for d in params],
                        use_tqdm=False)
    seqs = [o.outputs[0] for o in outs]
    ids = [list(s.token_ids) for s in seqs]
    if not params or params[0].get("logprobs") is None:
        return SampledRows(ids, None)
    return SampledRows(ids, [[lp[t].logprob for t, lp in zip(s.token_ids, s.logprobs)] for s in seqs])


def llm_scores(llm, rows: list[list[int]]) -> list[list[float]]:
    """The log-prob (temperature 1) of each token of each row given the tokens before it (vLLM's
    prompt log-probs; the first token has none)."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": r} for r in rows], params, use_tqdm=False)
    return [[d[t].logprob for t, d in zip(r[1:], o.prompt_logprobs[1:])] for r, o in zip(rows, outs)]


def llm_load_weights(llm, path: str) -> int:
    """Load the safetensors file ``path`` into ``llm``'s model (worker.WeightSync) and drop the
    cached prefixes, whose keys and values the old weights computed. Returns the tensors loaded."""
    loaded = llm.collective_rpc("load_grpo_weights", args=(path,))
    llm.reset_prefix_cache()
    return int(loaded[0]) if loaded else 0


def shared_memory_dir() -> str | None:
    """/dev/shm where it is writable (the weights file never touches a disk), else the temp folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class VLLMRowsEngine(RolloutEngine):
    """An engine that samples on vLLM, here or elsewhere: subclasses give ``_sample``, ``_score`` and
    ``_load_file`` (a safetensors file of the policy's merged weights, removed after the call)."""

    same_tokens_for_keys = False
    returns_sampling_logprobs = True
    own_kernels = True
    serves_evaluation = True
    sync_seconds = 0.0  # the last sync_weights' wall time

    def _sample(self, prompts: list[list[int]], params: list[dict], *, group_size: int = 1) -> SampledRows:
        """One request per row; rows come in whole groups of ``group_size`` (a group's rows together)."""
        raise NotImplementedError

    def _score(self, rows: list[list[int]]) -> list[list[float]]:
        raise NotImplementedError

    def _load_file(self, path: str) -> None:
        raise NotImplementedError

    def _weights_folder(self) -> str | None:
        """Where the weights file of ``sync_weights`` is written (None: the temp folder)."""
        return shared_memory_dir()

    def _generate(self, prompts: list[str], *, group_size: int, sampling: SamplingSettings, keys: list[int] | None,
                  with_logprobs: bool, greedy: bool) -> Rollout:
        start = time.perf_counter()
        enc = encode_for_rollout(self.model, self.tokenizer, prompts, group_size=group_size,
                                 max_prompt_length=sampling.max_prompt_length, keys=keys)
        prompt_ids, prompt_mask = enc.rows()  # [N, P] each
        rows = [ids[m.bool()].tolist() for ids, m in zip(enc.ids.cpu(), enc.mask.cpu())]  # the real prompt tokens
        n = len(rows) * group_size
        params = [request_params(sampling, greedy=greedy, seed=None if keys is None else keys[i],
                                 with_logprobs=with_logprobs, eos=enc.eos) for i in range(n)]
        out = self._sample([rows[i // group_size] for i in range(n)], params, group_size=group_size)
        width = max([len(t) for t in out.token_ids] + [1])
        ids = torch.full((n, width), self.tokenizer.pad_token_id, dtype=torch.long)  # [N, T]
        logp = torch.zeros(n, width) if out.logprobs is not None else None  # [N, T]
        for i, toks in enumerate(out.token_ids):
            ids[i, :len(toks)] = torch.tensor(toks, dtype=torch.long)
            if logp is not None:
                logp[i, :len(toks)] = torch.tensor(out.logprobs[i], dtype=torch.float32)
        dev = prompt_ids.device
        return finish_rollout(self.tokenizer, prompt_ids, prompt_mask, ids.to(dev), enc.eos,
                              sampling_logp=None if logp is None else logp.to(dev), engine=self.name,
                              seconds=time.perf_counter() - start, prompts_truncated=enc.cut)

    def sequence_logprobs(self, rows: list[list[int]]) -> list[list[float]]:
        """The engine model's log-prob (temperature 1) of each token of each row given the tokens
        before it: what the trainer's forward gives on the same tokens when the weights agree."""
        return self._score(rows)

    def sync_weights(self, policy) -> None:
        """Push ``policy``'s weights (LoRA merged) into the engine's model through its ``load_weights``.
        An engine found dead here is remembered, not raised: the step that called this has already
        taken its optimizer steps and ends normally; the next ``generate`` raises, so the trainer's
        checkpoint holds whole steps."""
        try:
            self._push(policy)
        except EngineError:
            pass

    def _push(self, policy) -> None:
        """Send ``policy``'s weights (LoRA merged) to the engine as one safetensors file."""
        RolloutEngine.sync_weights(self, policy)  # the model it was built on
        start = time.perf_counter()
        with self._weights_file(policy) as path:
            self._load_file(path)
        self.sync_seconds = time.perf_counter() - start

    @contextlib.contextmanager
    def _weights_file(self, policy):
        """``policy``'s weights (LoRA merged) as one safetensors file in ``_weights_folder``, removed after."""
        from safetensors.torch import save_file

        weights = {k: v.cpu() for k, v in merged_weights(policy)}
        with tempfile.TemporaryDirectory(prefix="grpo-weights-", dir=self._weights_folder()) as tmp:
            path = os.path.join(tmp, "weights.safetensors")
            save_file(weights, path)
            del weights
            yield path
