"""The vocabulary's identifier and operator tokens, which token_weight_gamma weighs in the advantage
(seed 003 section 5.1: function and variable names, keywords such as ``for``, operators such as ``=``)."""

from __future__ import annotations

import torch

OPERATOR_CHARS = set("=+-*/%<>!&|^~@:")


def is_code_token(text: str) -> bool:
    """Whether a token's text (surrounding spaces stripped) is an identifier or keyword, or is made of
    operator characters only ('=', '+=', '**', '->', '==', ...)."""
    t = text.strip()
    return bool(t) and (t.isidentifier() or all(c in OPERATOR_CHARS for c in t))


def code_token_vocab(tokenizer, vocab_size: int) -> torch.Tensor:
    """[V] bool: which token ids decode to an identifier or operator (special tokens never do)."""
    special = set(tokenizer.all_special_ids)
    marks = torch.zeros(vocab_size, dtype=torch.bool)  # [V]
    for i in range(min(vocab_size, len(tokenizer))):
        if i not in special:
            marks[i] = is_code_token(tokenizer.decode([i]))
    return marks
