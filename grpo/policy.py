"""Per-token log-probs and entropies of completions under a model (policy or reference).

Dimension letters: N sequences, P prompt tokens, T completion tokens, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.core import token_logprobs_and_entropy


def trim_padding(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                 completion_mask: Tensor) -> dict[str, Tensor]:
    """Drop prompt columns that are padding in every row (left) and completion columns that are
    padding in every row (right), so a micro-batch costs only its longest real sequence."""
    keep_p = prompt_mask.any(0).nonzero()  # [k, 1]
    p0 = int(keep_p[0]) if len(keep_p) else prompt_mask.shape[1]
    keep_t = completion_mask.any(0).nonzero()
    t1 = int(keep_t[-1]) + 1 if len(keep_t) else 1
    return {"prompt_ids": prompt_ids[:, p0:], "prompt_mask": prompt_mask[:, p0:],
            "completion_ids": completion_ids[:, :t1], "completion_mask": completion_mask[:, :t1]}


def model_inputs(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                 completion_mask: Tensor) -> dict[str, Tensor]:
    """Prompt + completion as one padded-trimmed batch: input ids, attention mask and positions
    [N, P' + T'] that follow the mask (left padding does not shift them, as during generation), plus
    the trimmed completion ids [N, T']."""
    tr = trim_padding(prompt_ids, prompt_mask, completion_ids, completion_mask)
    ids = torch.cat([tr["prompt_ids"], tr["completion_ids"]], 1)  # [N, P' + T']
    attn = torch.cat([tr["prompt_mask"], tr["completion_mask"]], 1)  # [N, P' + T']
    pos = (attn.cumsum(1) - 1).clamp(min=0)  # [N, P' + T']
    return {"input_ids": ids, "attention_mask": attn, "position_ids": pos, "completion_ids": tr["completion_ids"]}


def completion_logprobs(model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                        completion_mask: Tensor, *, temperature: float, with_entropy: bool = False,
                        autocast: bool = False) -> dict:
    """Run the model on prompt + completion and return {"logp": [N, T], "entropy": [N, T] or None}
    for the completion tokens (zero beyond the trimmed length T' <= T, which the caller pads back).

    Positions follow the attention mask (left padding does not shift them), as during generation.
    Only the last T + 1 positions go through the LM head (``logits_to_keep``). ``autocast`` runs the
    transformer body in bf16 (see ``models.keep_head_fp32`` for the head).
    """
    n, t_full = completion_ids.shape
    inp = model_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
    comp = inp.pop("completion_ids")  # [N, T']
    t = comp.shape[1]
    with torch.autocast(comp.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(**inp, use_cache=False, logits_to_keep=t + 1).logits  # [N, T' + 1, V]
    out = token_logprobs_and_entropy(logits[:, :-1], comp, temperature=temperature)
    logp = out["logp"]  # [N, T']
    ent = out["entropy"] if with_entropy else out["entropy"].detach()
    pad = t_full - t
    if pad:
        logp = torch.nn.functional.pad(logp, (0, pad))  # [N, T]
        ent = torch.nn.functional.pad(ent, (0, pad))  # [N, T]
    return {"logp": logp, "entropy": ent}
