"""The Rollout of one step: prompts, completions, masks, truncation flags and sampling log-probs.

Two masks: ``completion_mask`` is what is in the model's context (a prefix of each row: the tokens up
to and including the first EOS), ``loss_mask`` what is trained on, a subset that may have holes
(tokens the model reads but did not choose, e.g. a tool's output in a multi-turn rollout). The model
runs on the context; losses, advantages and their metrics count the loss tokens. A single-turn
rollout trains on every token of its context: loss_mask == completion_mask.

Dimension letters: B prompts, G group size, N = B*G sequences (group by group: sequence n belongs
to prompt n // G), P prompt tokens (left-padded), T completion tokens (right-padded).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from grpo.models.packing import check_masks


@dataclass
class Rollout:
    """One sampling call's rows. ``loss_mask`` defaults to ``completion_mask`` (the same tensor); code
    that replaces ``completion_mask`` (``dataclasses.replace``) passes the matching ``loss_mask`` too."""

    prompt_ids: Tensor  # [N, P] left-padded
    prompt_mask: Tensor  # [N, P] 1 on real prompt tokens
    completion_ids: Tensor  # [N, T] right-padded
    completion_mask: Tensor  # [N, T] 1 on completion tokens in the context: up to and including the first EOS
    truncated: Tensor  # [N] bool: no EOS within the token limit
    sampling_logp: Tensor | None  # [N, T] log-prob of each sampled token under the sampling policy
    texts: list[str]  # decoded completions, special tokens removed
    engine: str  # the rollout engine that produced it (its ROLLOUT_ENGINES name)
    seconds: float  # wall time of sampling
    prompts_truncated: int = 0  # prompts (not rows) the sampling call cut to max_prompt_length (0 in a selection)
    loss_mask: Tensor | None = None  # [N, T] 1 on tokens trained on, within completion_mask; None: all of it
    episodes: list[dict] | None = None  # per row, a multi-turn episode's transcript and counts (grpo.agent)
    versions: Tensor | None = None  # [N, T] int64: the policy version (trainer step) that drew each token; None: current

    def __post_init__(self):
        # only the shape is checked here (no device sync on every selection); check_masks checks values
        if self.loss_mask is None:
            self.loss_mask = self.completion_mask
        elif self.loss_mask.shape != self.completion_mask.shape:
            raise ValueError(f"loss_mask: shape {tuple(self.loss_mask.shape)} is not completion_mask's "
                             f"{tuple(self.completion_mask.shape)}")

    @property
    def lengths(self) -> Tensor:  # [N] tokens in the context (overlong penalty, length metrics)
        return self.completion_mask.sum(1)

    def completion_id_lists(self) -> list[list[int]]:
        """Each row's completion token ids (its context: ``completion_mask``), as lists."""
        return [ids[:n].tolist() for ids, n in zip(self.completion_ids.cpu(), self.lengths.cpu().tolist())]

    def check(self) -> None:
        """Raise ValueError unless completion_mask is a prefix mask and loss_mask lies within it."""
        check_masks(self.completion_mask, self.loss_mask)


def encode_prompts(tokenizer, prompts: list, max_length: int) -> tuple[Tensor, Tensor, int]:
    """Token ids [B, P] and mask [B, P] of rendered prompts (text, or token ids as a list of ints: a
    multi-turn episode's context so far, which must not be re-tokenized), left-padded, each cut to its last
    ``max_length`` tokens, and how many were cut. The end is kept because the chat template puts the
    generation prompt (the assistant header) there: cut from the right, the model would continue the
    user's text instead of answering. Padding and truncation are done here rather than through the
    tokenizer's ``padding_side`` / ``truncation_side`` so a caller's tokenizer is left as it was."""
    if tokenizer.pad_token_id is None:
        raise ValueError("tokenizer: no pad token (set tokenizer.pad_token, e.g. to its eos_token)")
    texts = [p for p in prompts if isinstance(p, str)]
    encoded = iter(tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"] if texts else [])
    rows = [next(encoded) if isinstance(p, str) else [int(t) for t in p] for p in prompts]
    n_cut = sum(len(r) > max_length for r in rows)
    rows = [r[len(r) - max_length:] if len(r) > max_length else r for r in rows]
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)  # [B, P]
    mask = torch.zeros(len(rows), width, dtype=torch.long)  # [B, P]
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids, mask, n_cut


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every token that ends a completion: the generation config's EOS ids and the tokenizer's."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


@dataclass
class EncodedPrompts:
    """A sampling call's prompts as every backend starts from them."""

    ids: Tensor  # [B, P] left-padded, on the model's device
    mask: Tensor  # [B, P] 1 on real prompt tokens
    cut: int  # prompts cut to max_prompt_length
    eos: list[int]  # the tokens that end a completion
    group_size: int

    def rows(self) -> tuple[Tensor, Tensor]:
        """Prompt ids and mask repeated for the G rows of each group (row n: prompt n // G)."""
        g = self.group_size
        return self.ids.repeat_interleave(g, 0), self.mask.repeat_interleave(g, 0)  # [N, P] each


def encode_for_rollout(model, tokenizer, prompts: list, *, group_size: int, max_prompt_length: int,
                       keys: list[int] | None) -> EncodedPrompts:
    """The prelude shared by the backends: prompts encoded (``encode_prompts``) onto the model's
    device, the EOS ids, and ``keys`` checked to hold one key per row (None: nothing to check)."""
    ids, mask, n_cut = encode_prompts(tokenizer, prompts, max_prompt_length)  # [B, P] each
    n_rows = ids.shape[0] * group_size
    if keys is not None and len(keys) != n_rows:
        raise ValueError(f"keys: {len(keys)} given for {n_rows} rows")
    device = next(model.parameters()).device
    return EncodedPrompts(ids.to(device), mask.to(device), n_cut, eos_token_ids(model, tokenizer), group_size)


def completion_mask_from_ids(ids: Tensor, eos_ids: list[int]) -> dict[str, Tensor]:
    """Mask of tokens up to and including the first EOS, and whether a row never ended.

    ids: [N, T] -> {"mask": [N, T] long, "truncated": [N] bool}.
    """
    is_eos = torch.isin(ids, torch.tensor(eos_ids, device=ids.device))  # [N, T]
    seen_before = (is_eos.long().cumsum(1) - is_eos.long()) > 0  # [N, T]: an EOS strictly earlier
    mask = (~seen_before).long()  # [N, T]
    return {"mask": mask, "truncated": ~is_eos.any(1)}


def finish_rollout(tokenizer, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor, eos_ids: list[int], *,
                   sampling_logp: Tensor | None, engine: str, seconds: float,
                   prompts_truncated: int = 0) -> Rollout:
    """The Rollout of sampled ids [N, T] as every backend returns it: the mask up to the first EOS
    (context and loss mask alike: every sampled token was chosen by the model), padding after it,
    sampling log-probs zeroed off the mask, decoded texts."""
    done = completion_mask_from_ids(completion_ids, eos_ids)
    mask = done["mask"]  # [N, T]
    completion_ids = torch.where(mask.bool(), completion_ids, tokenizer.pad_token_id)  # [N, T]
    if sampling_logp is not None:
        sampling_logp = sampling_logp * mask  # [N, T]
    texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                   completion_mask=mask, truncated=done["truncated"], sampling_logp=sampling_logp, texts=texts,
                   engine=engine, seconds=seconds, prompts_truncated=prompts_truncated, loss_mask=mask)


def select_rollout(ro: Rollout, idx: torch.Tensor) -> Rollout:
    """The sequences ``idx`` [n] of a rollout, in that order."""
    il = idx.tolist()
    return Rollout(ro.prompt_ids[idx], ro.prompt_mask[idx], ro.completion_ids[idx], ro.completion_mask[idx],
                   ro.truncated[idx], None if ro.sampling_logp is None else ro.sampling_logp[idx],
                   [ro.texts[i] for i in il], ro.engine, ro.seconds, loss_mask=ro.loss_mask[idx],
                   episodes=None if ro.episodes is None else [ro.episodes[i] for i in il],
                   versions=None if ro.versions is None else ro.versions[idx])


def concat_rollouts(parts: list[Rollout], pad_id: int) -> Rollout:
    """Rollouts of several sampling rounds as one: prompts left-padded, completions right-padded."""
    if len(parts) == 1:
        return parts[0]
    p = max(r.prompt_ids.shape[1] for r in parts)
    t = max(r.completion_ids.shape[1] for r in parts)

    def left(x, width, value):  # [n, w] -> [n, width]
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x, width, value):
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    logps = [r.sampling_logp for r in parts]
    versions = [r.versions for r in parts]
    return Rollout(torch.cat([left(r.prompt_ids, p, pad_id) for r in parts]),
                   torch.cat([left(r.prompt_mask, p, 0) for r in parts]),
                   torch.cat([right(r.completion_ids, t, pad_id) for r in parts]),
                   torch.cat([right(r.completion_mask, t, 0) for r in parts]),
                   torch.cat([r.truncated for r in parts]),
                   None if any(x is None for x in logps) else torch.cat([right(x, t, 0.0) for x in logps]),
                   [s for r in parts for s in r.texts], parts[0].engine, sum(r.seconds for r in parts),
                   loss_mask=torch.cat([right(r.loss_mask, t, 0) for r in parts]),
                   episodes=None if any(r.episodes is None for r in parts) else [e for r in parts for e in r.episodes],
                   versions=None if any(v is None for v in versions) else torch.cat([right(v, t, 0) for v in versions]))


def rollout_to(ro: Rollout, device) -> Rollout:
    """The rollout with its tensors on ``device``."""
    return dataclasses.replace(ro, **{f.name: getattr(ro, f.name).to(device) for f in dataclasses.fields(ro)
                                      if isinstance(getattr(ro, f.name), torch.Tensor)})
