"""Rollout engines: a sampler built once per run on a model, with a lifecycle, found by name.

Every engine takes the same constructor arguments (the model it samples from, its tokenizer, whether
generation is synced across processes, the fast loop's kernel setting, and ``options``: an instance
of the engine's own ``Options`` dataclass, whose fields carry their defaults; the Config field
``<name>_<field>`` sets each, e.g. ``vllm_gpu_memory_utilization`` the vllm engine's
``gpu_memory_utilization``), samples groups of completions with ``generate``, hears about each
optimizer step through ``sync_weights`` and is released with ``close``. Capabilities are declared on the class so callers can check them without
building one. The engines live next to their code (hf.py, fast.py, choice.py, vllm/colocated.py, vllm/client.py) and register here;
``grpo.rollout`` imports them all, so ``ROLLOUT_ENGINES`` is complete once that package is imported.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

import torch
from torch import Tensor

from grpo.registry import Registry
from grpo.rollout.types import Rollout


@dataclass(frozen=True)
class SamplingSettings:
    """How completions are drawn: the token budget, the warpers, and the prompt length kept."""

    max_new_tokens: int
    temperature: float  # temperature: no default here, so none can differ from the run's
    max_prompt_length: int  # max_prompt_length: likewise
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    def processing(self) -> dict:
        """The keyword settings of ``core.processed_scores`` (the distribution q the engines draw from)."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p,
                "repetition_penalty": self.repetition_penalty}

    def as_kwargs(self) -> dict:
        """The settings as the keyword arguments of ``generate_rollout`` / ``fast_rollout``."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class NoOptions:
    """The options of an engine that has none."""


class RolloutEngine:
    """A sampler bound to one model for a run.

    ``Options``: the engine's options, a frozen dataclass with a default for every field (each field
    ``x`` is set by the Config field ``<name>_x``); ``options=None`` builds it with those defaults.

    ``same_tokens_for_keys``: given the same keys, draws the same tokens as every other engine that
    declares it (so choosing among them changes no result). ``returns_sampling_logprobs``: fills
    ``Rollout.sampling_logp`` when asked (``with_logprobs=True``, not greedy). ``own_kernels``:
    samples with a model and kernels of its own (a copy of the weights), so its log-probs differ
    from the trainer's and the train/inference mismatch correction applies by default.
    ``serves_evaluation``: evaluation and the consistency probe sample with this engine too (one
    costly engine per run) instead of an hf engine beside it. ``supports_stop``: it ends a row where
    ``generate``'s ``stop`` says so (other engines ignore ``stop``; their callers cut the rows).
    ``standalone``: the engine that samples alike in this process, for a command that evaluates one
    model on its own (``grpo eval``) where this one serves other runs too (a shared server whose
    weights it must not replace); None: this engine itself.
    """

    name: ClassVar[str] = ""
    same_tokens_for_keys: ClassVar[bool] = False
    returns_sampling_logprobs: ClassVar[bool] = False
    own_kernels: ClassVar[bool] = False
    serves_evaluation: ClassVar[bool] = False
    supports_stop: ClassVar[bool] = False  # honours generate(stop=...)
    standalone: ClassVar[str | None] = None
    Options: ClassVar[type] = NoOptions

    def __init__(self, model, tokenizer, *, synced: bool = False, kernels: str = "auto", options=None):
        self.model, self.tokenizer, self.synced, self.kernels = model, tokenizer, synced, kernels
        if options is None:
            options = self.Options()
        if not isinstance(options, self.Options):
            raise TypeError(f"rollout engine {self.name!r}: options must be a {self.Options.__name__}, "
                            f"not {type(options).__name__}")
        self.options = options
        self.closed = False

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this engine cannot be built in this environment (a missing package, naming the extra
        that installs it), checked when the config is validated; None when it can."""
        return None

    def generate(self, prompts: list[str] | list[list[int]], *, group_size: int, sampling: SamplingSettings,
                 keys: Sequence[int] | Tensor | None = None, with_logprobs: bool = False, greedy: bool = False,
                 stop: Callable[[int, list[int]], bool] | None = None) -> Rollout:
        """``group_size`` completions of each rendered prompt, grouped by prompt (N = len(prompts) *
        group_size rows). A prompt is text or a list of token ids (taken as they are: a multi-turn
        episode's exact context). ``keys`` (one int per row, grpo.rollout.keys.row_keys; a list or an int64
        tensor [N]): each row draws from its own key instead of the global RNG; ``greedy``: argmax
        decoding (keys ignored). ``stop(row, new_ids)``, asked after each token where the engine
        ``supports_stop``, ends that row there when true (a tool call complete); the tokens before
        are those drawn without it, and the row's completion has no EOS (padding follows)."""
        if self.closed:
            raise RuntimeError(f"rollout engine {self.name!r}: generate after close()")
        if keys is not None:
            keys = keys.tolist() if isinstance(keys, Tensor) else [int(k) for k in keys]
        extra = {"stop": stop} if stop is not None and self.supports_stop else {}
        return self._generate(prompts, group_size=group_size, sampling=sampling, keys=keys,
                              with_logprobs=with_logprobs, greedy=greedy, **extra)

    def _generate(self, prompts: list[str], *, group_size: int, sampling: SamplingSettings, keys: list[int] | None,
                  with_logprobs: bool, greedy: bool) -> Rollout:
        raise NotImplementedError

    def sync_weights(self, policy) -> None:
        """Make the next ``generate`` sample from ``policy``'s current weights (called once per
        training step, after its optimizer steps, and after a resume). An in-process engine samples from the very module the optimizer updates and
        packs its fast weights anew at each rollout, so there is nothing to copy; it only checks that
        it was built on ``policy``."""
        if policy is not self.model:
            raise ValueError(f"rollout engine {self.name!r} samples from the model it was built on; "
                             "sync_weights got another one")

    def publish(self, policy, *, version: int) -> None:
        """``policy``'s current weights, those after ``version`` optimizer steps, are what the engine samples
        next: ``sync_weights``, for an engine that does not number its weights (the trainer's Engines call
        this after each update and after a resume)."""
        self.sync_weights(policy)

    def sync_metrics(self) -> dict:
        """Metrics of the latest ``sync_weights`` (what it moved and how long it took); {} where it moves nothing."""
        return {}

    def close(self) -> None:
        """Release what the engine holds; later calls do nothing."""
        self.closed = True


def row_stopper(stop: Callable[[int, list[int]], bool]):
    """``stop(row, new_ids)`` as the fast loop's ``stop_rows(t, scores, tokens [n], live [n])`` hook:
    each live row's tokens are collected as they are drawn."""
    seqs: dict[int, list[int]] = {}

    def stop_rows(t, scores, tokens, live):
        out = []
        for r, tok in zip(live.tolist(), tokens.tolist()):
            seqs.setdefault(r, []).append(tok)
            out.append(bool(stop(r, seqs[r])))
        return torch.tensor(out, dtype=torch.bool, device=tokens.device)  # [n]

    return stop_rows


ROLLOUT_ENGINES: Registry[type[RolloutEngine]] = Registry("rollout engine", field="rollout_engine",
                                                      name_of=lambda cls: cls.name)


def engine_class(name: str) -> type[RolloutEngine]:
    """The engine registered as ``name``; an UnknownName (a ConfigError) listing the valid names otherwise."""
    return ROLLOUT_ENGINES[name]


def make_engine(name: str, model, tokenizer, *, synced: bool = False, kernels: str = "auto",
                options=None) -> RolloutEngine:
    """An engine of kind ``name`` (a ``rollout_engine`` value) on ``model``; ``options``: an instance
    of its ``Options`` (None: their defaults)."""
    return engine_class(name)(model, tokenizer, synced=synced, kernels=kernels, options=options)
