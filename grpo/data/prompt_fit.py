"""Prompts longer than max_prompt_length: cut from the middle, never from the system message.

A prompt is cut so that its end stays (the chat template's generation prompt: cut there, the model
would continue the user's text instead of answering). Cutting from the left alone would drop the system
message first, and with it the tool schema a Hermes/Qwen template renders there, so a prompt keeps
whole everything before its first user content (its "head": the system message, the tools, the
header of the user's turn) and loses tokens just after that.
Where the head leaves fewer than ``MIN_TAIL`` tokens for the rest, no cut can keep both it and the end
of the question with the generation prompt: the run is refused at start-up with the length it needs
(``check_prompt_room``).
"""

from __future__ import annotations

from grpo.errors import ConfigError

MIN_TAIL = 8  # tokens left after the head: the end of the user's turn and the generation prompt


def cut_middle(ids: list[int], head: int, max_length: int) -> list[int]:
    """``ids`` cut to ``max_length`` tokens: its first ``head`` and its last ``max_length - head``
    (``head`` 0: its last ``max_length``); unchanged when it fits. A head that leaves fewer than
    MIN_TAIL tokens gives the left cut here; the callers refuse that case first (``fit_ids``)."""
    if len(ids) <= max_length:
        return ids
    head = head if 0 < head <= max_length - MIN_TAIL else 0
    return ids[:head] + ids[len(ids) - (max_length - head):]


def system_head(tokenizer, messages: list[dict], ids: list[int], **template_kw) -> int:
    """Tokens of ``ids`` (the rendering of ``messages`` with a generation prompt) before the first
    non-system message's content: the system message as the template renders it (with the tools it
    puts there, or its own default system prompt) and that message's header. Found as the tokens
    ``ids`` shares with the rendering of the same conversation with that content replaced, so it holds
    for any template; 0 without a chat template or a non-system message."""
    first = next((i for i, m in enumerate(messages) if m.get("role") != "system"), None)
    if first is None or not getattr(tokenizer, "chat_template", None):
        return 0
    other = [dict(m) for m in messages]
    other[first]["content"] = "\x01" if str(messages[first].get("content")) != "\x01" else "\x02"
    text = tokenizer.apply_chat_template(other, tokenize=False, add_generation_prompt=True, **template_kw)
    alt = tokenizer(text, add_special_tokens=False)["input_ids"]
    return next((i for i, (a, b) in enumerate(zip(ids, alt)) if a != b), min(len(ids), len(alt)))


def fit_ids(ids: list[int], head: int, max_length: int) -> list[int]:
    """``ids`` fitted to ``max_length`` (``cut_middle``), or the ConfigError of ``check_prompt_room``
    where its head leaves no room: a prompt past the rows checked at start-up is refused, never cut from
    the left without a word."""
    check_prompt_room([(head, len(ids))], max_length)
    return cut_middle(ids, head, max_length)


def chat_messages(prompt, system_prompt: str = "") -> list[dict]:
    """A row's prompt as chat messages, the run's system prompt first unless the row has its own."""
    messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    if system_prompt and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": system_prompt}] + messages
    return messages


def fit_rendered(tokenizer, text: str, messages: list[dict], max_length: int) -> str | list[int]:
    """``text`` (the rendering of ``messages``) as it goes to the engine: unchanged when it fits in
    ``max_length`` tokens or has no head to keep (no chat template: the engine cuts it from the left),
    else its token ids cut from the middle (``fit_ids``), everything before the first user content kept."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= max_length:
        return text
    head = system_head(tokenizer, messages, ids)
    return fit_ids(ids, head, max_length) if head else text


def prompt_lengths(tokenizer, text: str, messages: list[dict]) -> tuple[int, int]:
    """(system head, whole) token counts of ``text``, the rendering of ``messages``."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return system_head(tokenizer, messages, ids), len(ids)


def check_prompt_room(lengths: list[tuple[int, int]], max_length: int) -> None:
    """``lengths``: (head, whole) token counts of rendered prompts. A ConfigError naming max_prompt_length
    when a head leaves fewer than MIN_TAIL tokens, with the length the longest prompt needs."""
    crowded = [(h, n) for h, n in lengths if h > max_length - MIN_TAIL and n > max_length]
    if not crowded:
        return
    head = max(h for h, _ in crowded)
    need = -(-max(max(n for _, n in lengths), head + MIN_TAIL) // 64) * 64
    raise ConfigError(f"max_prompt_length: {max_length} tokens cannot hold the system message and tool schema "
                      f"({head} tokens as the chat template renders them) with the question; cutting would lose "
                      f"one of them. Set max_prompt_length={need} (the longest prompt checked needs "
                      f"{max(n for _, n in lengths)})")
