"""Supervised data: chat rows (``messages``, tool turns included) and prompt/completion rows, tokenized
with the tokenizer's chat template into token ids and the mask of the tokens the loss is on.

The loss is on the assistant's turns only (of the completion, for prompt/completion rows): the text of
each assistant message as the template writes it, up to and including the end-of-turn token (the
model must learn to stop), never the turn's header (``<|im_start|>assistant\\n``), the system, user or
tool turns, or what the template puts after the end-of-turn token. The conversation is rendered one
message at a time: a message's text is what rendering the conversation up to it adds to the rendering
up to the message before (so the template's own markup is kept exactly), and each piece is tokenized
on its own, as an agent episode's turns are (grpo.agent.episodes), so a transcript trains the tokens
the model later sees and writes during rollouts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from grpo.errors import DataError

ROLES = ("system", "user", "assistant", "tool")


@dataclass
class SFTExample:
    """One row: ``ids`` the token ids, ``trained[i]`` whether the loss is on token i (predicted from
    the tokens before it), ``truncated`` whether the row was cut at max_length."""

    ids: list[int]
    trained: list[bool]
    truncated: bool = False


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a .jsonl file (one JSON object a line) or a .json file (a list of objects)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"sft_data: {p} is not a file")
    text = p.read_text()
    if p.suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"sft_data: {p} is not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(rows, list):
            raise DataError(f"sft_data: {p} holds a {type(rows).__name__}, not a list of rows")
    else:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"sft_data: {p} line {n} is not valid JSON ({e.msg})") from None
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise DataError(f"sft_data: {p} row {n} is a {type(row).__name__}, not a JSON object")
    if not rows:
        raise DataError(f"sft_data: {p} holds no rows")
    return rows


def _messages(value, where: str, default_role: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": default_role, "content": value}]
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: text or a non-empty list of messages expected, got {type(value).__name__}")
    for k, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content", ""), str):
            raise DataError(f"{where}: message {k} must be {{'role': one of {list(ROLES)}, 'content': text}}, "
                            f"got {str(m)[:80]!r}")
    return [dict(m) for m in value]


def row_conversation(row: dict, where: str) -> tuple[list[dict], list[bool]]:
    """A row's messages and, per message, whether the loss is on it (an assistant message; of the
    completion only, for a prompt/completion row)."""
    if "messages" in row:
        msgs = _messages(row["messages"], f"{where} messages", "user")
        return msgs, [m["role"] == "assistant" for m in msgs]
    if "prompt" in row and "completion" in row:
        prompt = _messages(row["prompt"], f"{where} prompt", "user")
        completion = _messages(row["completion"], f"{where} completion", "assistant")
        return prompt + completion, [False] * len(prompt) + [m["role"] == "assistant" for m in completion]
    raise DataError(f"{where}: a row needs 'messages', or 'prompt' and 'completion' (it has {sorted(row)[:8]})")


def _render(tokenizer, messages: list[dict], *, generation_prompt: bool) -> str:
    if not getattr(tokenizer, "chat_template", None):  # as the agent renders without a template
        return "".join(str(m["content"]) + "\n" for m in messages)
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def conversation_pieces(tokenizer, messages: list[dict], trained: list[bool], where: str) -> list[tuple[str, bool]]:
    """The conversation's text cut into (piece, trained) pieces whose concatenation is its rendering:
    the header before a trained message untrained, the message up to and including the end-of-turn
    token trained, the rest untrained."""
    pieces: list[tuple[str, bool]] = []
    done = ""
    eos = tokenizer.eos_token or ""
    for i, train in enumerate(trained):
        steps = [(_render(tokenizer, messages[:i], generation_prompt=True), False)] if train else []
        steps.append((_render(tokenizer, messages[:i + 1], generation_prompt=False), train))
        for text, is_trained in steps:
            if not text.startswith(done):
                raise DataError(f"{where}: the chat template does not render message {i} after the messages before "
                                "it (a rendering that is not a prefix of the next); the loss mask cannot be found")
            piece, done = text[len(done):], text
            cut = piece.find(eos) + len(eos) if is_trained and eos and eos in piece else len(piece)
            pieces += [(piece[:cut], is_trained), (piece[cut:], False)]
    if not getattr(tokenizer, "chat_template", None) and eos:  # no template: an answer still ends in EOS
        pieces = [(p + eos, t) if t else (p, t) for p, t in pieces]
    return [(p, t) for p, t in pieces if p]


def encode_row(tokenizer, row: dict, *, max_length: int, where: str) -> SFTExample:
    """One row as token ids and its loss mask (module docstring), cut to ``max_length`` tokens."""
    messages, trained = row_conversation(row, where)
    if not any(trained):
        raise DataError(f"{where}: no assistant message to train on")
    ids: list[int] = []
    mask: list[bool] = []
    for piece, is_trained in conversation_pieces(tokenizer, messages, trained, where):
        piece_ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
        ids += piece_ids
        mask += [is_trained] * len(piece_ids)
    cut = len(ids) > max_length
    ids, mask = ids[:max_length], mask[:max_length]
    if not any(mask[1:]):  # token 0 has nothing before it to be predicted from
        raise DataError(f"{where}: no trained token within sft_max_length={max_length} tokens")
    return SFTExample(ids, mask, cut)


def load_examples(path: str | Path, tokenizer, *, max_length: int) -> list[SFTExample]:
    """Every row of ``path`` encoded (``encode_row``); a bad row is a DataError naming the file and row."""
    return [encode_row(tokenizer, row, max_length=max_length, where=f"sft_data: {path} row {n}")
            for n, row in enumerate(read_rows(path), 1)]
