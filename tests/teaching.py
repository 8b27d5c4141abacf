"""Teaching the tiny test model a few fixed continuations (a random tiny model never writes a tool call):
a few dozen supervised steps on (context ids, what to write after it) pairs, then saved."""

from __future__ import annotations

import torch


def teach(model_dir, out, pairs: list[tuple[list[int], list[int]]], *, max_steps: int = 400,
          target_loss: float = 0.003) -> None:
    """Fine-tune the model at ``model_dir`` to write each pair's target after its context; save it at ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    width = max(len(c) + len(t) for c, t in pairs)
    ids = torch.full((len(pairs), width), tok.pad_token_id)  # [K, L]
    mask = torch.zeros(len(pairs), width, dtype=torch.long)  # [K, L]
    labels = torch.full((len(pairs), width), -100)  # [K, L] loss on the written part only
    for i, (ctx, target) in enumerate(pairs):
        n = len(ctx) + len(target)
        ids[i, :n], mask[i, :n] = torch.tensor(ctx + target), 1
        labels[i, len(ctx):n] = torch.tensor(target)
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # short rows: more threads only wait on each other
    try:
        for _ in range(max_steps):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            if loss.item() < target_loss:
                break
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    assert loss.item() < target_loss, f"the tiny model did not learn its lines (loss {loss.item():.4f})"
    model.save_pretrained(out)
    tok.save_pretrained(out)
