"""The episode runner: G independent multi-turn episodes per prompt, one batched engine call per turn.

Each turn every live episode's context (its exact token ids so far, never re-tokenized text) is
sampled by the engine; the block of calls it wrote is found (``CallFormat.block``: one or several
calls in a row) and the turn is cut right after its last call (the tokens sampled later do not change
the tokens before them, so the cut turn is exactly what sampling would give had it stopped there);
every call of every episode runs concurrently (``execute.run_calls``, each under its deadline); the
result turn (the chat template's tokens around the format's result messages, in the order the calls
were written) is appended. An episode ends at EOS or a turn without a call, at
``max_turns`` model turns (flagged; a call in the last turn is counted but not run) or when its
tokens (model and tool tokens together) reach the budget, ``max_completion_length``.

The result is one Rollout: ``completion_ids`` all turns concatenated, ``completion_mask`` the whole
context, ``loss_mask`` 1 only on the model's own tokens (the tool and template tokens are read, not
trained), ``sampling_logp`` 0 off them, ``texts`` the last model turn (the final answer, what rewards
grade), ``episodes`` each episode's transcript and counts.

Keys: turn k of a row draws from ``turn_key(key, k)``, so an episode's tokens depend on its key alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from grpo.agent.execute import ToolResult, run_calls
from grpo.agent.formats import Call, CallFormat
from grpo.agent.tools import Tool
from grpo.rollout.types import Rollout, eos_token_ids
from grpo.rollout.engine import RolloutEngine, SamplingSettings
from grpo.rollout.keys import _mix64



def turn_key(key: int, turn: int) -> int:
    """The sampling key of a row's ``turn``-th model turn (turn 0: the row's own key)."""
    return key if turn == 0 else _mix64((key * 1_000_003 + turn) % 2**64) % 2**62


@dataclass
class Episode:
    """One completion's conversation as it is sampled."""

    prompt: list[int]  # the start context's token ids
    tools: dict[str, Tool]
    messages: list[dict]  # the transcript: the start messages, then each turn's
    key: int | None = None
    env: object = None  # the environment instance (environment_factory), if any
    ids: list[int] = field(default_factory=list)  # completion tokens: model and tool turns
    trained: list[int] = field(default_factory=list)  # 1 on the model's own tokens
    logp: list[float] = field(default_factory=list)
    versions: list[int] | None = None  # the policy version of each token, where the engine numbers them
    final_text: str = ""
    turns: int = 0
    calls: int = 0  # calls found (well-formed or not)
    well_formed: int = 0  # calls read into a known tool with fitting arguments
    errors: int = 0
    timeouts: int = 0
    max_turns_hit: bool = False
    truncated: bool = False  # ended by the token budget
    done: bool = False
    start: int = -1  # how many of ``messages`` the episode started from (set from them when not given)

    def __post_init__(self):
        if self.start < 0:
            self.start = len(self.messages)

    def add(self, ids: list[int], *, trained: bool, logp: list[float] | None = None,
            versions: list[int] | None = None) -> None:
        """Append tokens; a tool turn's (``versions`` None) take the version of the turn before them."""
        self.ids += ids
        self.trained += [int(trained)] * len(ids)
        self.logp += logp if logp is not None else [0.0] * len(ids)
        if versions is not None or self.versions is not None:
            last = self.versions[-1] if self.versions else 0
            self.versions = (self.versions or []) + (versions if versions is not None else [last] * len(ids))

    def info(self) -> dict:
        """What rewards and metrics see of the episode (merged into its sample for rewards; TRL-form
        rewards get ``completion_messages`` as their completion and ``environment`` in ``environments``)."""
        return {"transcript": self.messages, "completion_messages": self.messages[self.start:], "turns": self.turns,
                "tool_calls": self.calls, "well_formed_calls": self.well_formed, "tool_errors": self.errors,
                "tool_timeouts": self.timeouts, "max_turns_hit": self.max_turns_hit, "environment": self.env}


USER_MARK = "\u2063GRPO-USER\u2063"  # the user's text in a conversation rendered to find a result turn


def decode_for(fmt: CallFormat, tokenizer, ids: list[int]) -> str:
    """The text the format reads calls in: with special tokens where the family's markers are special."""
    return tokenizer.decode(ids, skip_special_tokens=not fmt.special_tokens)


def result_turn_ids(tokenizer, fmt: CallFormat, calls: list[Call], results: list[str]) -> list[int]:
    """The token ids between the end of the model's calls and the start of its next turn: the chat
    template's end of the calling turn, the results (``fmt.result_messages``, in the calls' order) and the
    generation prompt. Found by rendering a conversation that makes the same calls (the template's own
    rendering of them) and taking the text after the call block the format finds in it; so the model's
    sampled tokens are never re-rendered, whatever the template does to past turns."""
    results_msgs = [m for c, r in zip(calls, results) for m in fmt.result_messages(c, r)]
    if not getattr(tokenizer, "chat_template", None):
        return tokenizer("\n" + "\n".join(m["content"] for m in results_msgs) + "\n",
                         add_special_tokens=False)["input_ids"]
    # the family's own call message first; a template that does not render tool_calls gets the calls as text
    as_text = {"role": "assistant", "content": "\n".join(fmt.render_call(c.name, c.arguments or {}) for c in calls)}
    for call_msg in (fmt.calls_message(calls), as_text):
        try:
            full = tokenizer.apply_chat_template([{"role": "user", "content": USER_MARK}, call_msg] + results_msgs,
                                                 tokenize=False, add_generation_prompt=True)
        except Exception:  # noqa: BLE001  a template that refuses this shape (Llama 3.x: one call per turn)
            continue
        at = full.rfind(USER_MARK) + len(USER_MARK)
        block = fmt.block(full[at:]) if at >= len(USER_MARK) else None
        if block is not None and sum(len(fmt.parse_all(full[at + s:at + e], {})) for s, e in block.spans) == len(calls):
            return tokenizer(full[at + block.end:], add_special_tokens=False)["input_ids"]
    raise ValueError(f"chat template: the {fmt.name} format finds no call in the template's rendering of one "
                     "(tool_format does not match this chat template)")


def _calls_prefix(tokenizer, ids: list[int], fmt: CallFormat, units: int) -> int:
    """The fewest leading tokens of ``ids`` whose text holds ``units`` complete units of the first call
    block (the count only grows with the prefix, so a binary search finds it)."""
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        block = fmt.block(decode_for(fmt, tokenizer, ids[:mid]))
        if block is not None and len(block.spans) >= units:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _model_turn(tokenizer, ep: Episode, ids: list[int], logp: list[float] | None, eos: set[int],
                fmt: CallFormat, versions: list[int] | None = None) -> list[Call]:
    """Append the model's turn, cut after its block of calls; the calls in the order written, [] when
    the episode ends."""
    block = fmt.block(decode_for(fmt, tokenizer, ids)) if ep.tools else None
    if block is not None:
        k = _calls_prefix(tokenizer, ids, fmt, len(block.spans))
        ids, logp = ids[:k], None if logp is None else logp[:k]
        versions = None if versions is None else versions[:k]
        text = decode_for(fmt, tokenizer, ids)
        block = fmt.block(text)
    ep.add(ids, trained=True, logp=logp, versions=versions)
    ep.turns += 1
    ep.final_text = fmt.answer_text(decode_for(fmt, tokenizer, ids), tokenizer.decode(ids, skip_special_tokens=True))
    ep.messages.append({"role": "assistant", "content": ep.final_text})
    if block is None:
        ep.done = True
        ep.truncated = not (ids and ids[-1] in eos)
        return []
    calls = [c for s, e in block.spans for c in fmt.parse_all(text[s:e], ep.tools)]
    if fmt.native:  # the transcript keeps the calls as tool_calls and the text before them as the content
        ep.messages[-1] = {**fmt.calls_message(calls), "content": text[:block.spans[0][0]].strip()}
    ep.calls += len(calls)
    return calls


def _result_turn(tokenizer, ep: Episode, calls: list[Call], results: list[ToolResult], fmt: CallFormat,
                 budget: int) -> None:
    for call, res in zip(calls, results):
        ep.well_formed += int(res.ran)
        ep.errors += int(res.error)
        ep.timeouts += int(res.timeout)
        ep.messages += fmt.result_messages(call, res.text)
    try:
        ids = result_turn_ids(tokenizer, fmt, calls, [r.text for r in results])
    except ValueError:  # the template cannot render these calls (e.g. an id it refuses): the episode ends here
        ep.errors += 1
        ep.done = True
        return
    room = budget - len(ep.ids)
    ep.add(ids[:room], trained=False)
    if len(ids) >= room:  # no room left for the model to answer
        ep.done = ep.truncated = True


def _call_stop(tok, fmt: CallFormat, has_tools: list[bool]):
    """``stop(row, new_ids)`` for RolloutEngine.generate: true once the row's text holds a call block that
    cannot go on (text after its last call that starts no other call)."""
    def stop(row: int, ids: list[int]) -> bool:
        if not has_tools[row]:
            return False
        block = fmt.block(decode_for(fmt, tok, ids))
        return block is not None and not block.open

    return stop


def _grouped(contexts: list[list[int]], g: int) -> bool:
    """Whether every run of ``g`` consecutive contexts is one context repeated."""
    return g > 1 and len(contexts) % g == 0 and all(contexts[i] == contexts[i - i % g] for i in range(len(contexts)))


def run_episodes(engine: RolloutEngine, episodes: list[Episode], *, fmt: CallFormat, sampling: SamplingSettings,
                 max_turns: int, tool_timeout: float, with_logprobs: bool = False, greedy: bool = False,
                 group_size: int = 1) -> None:
    """Sample every episode to its end (the module docstring), in place; episodes come in groups of
    ``group_size`` (G episodes of one prompt, consecutive)."""
    tok = engine.tokenizer
    eos = set(eos_token_ids(engine.model, tok))
    budget = sampling.max_new_tokens
    live = list(episodes)
    for turn in range(max_turns):
        contexts = [ep.prompt + ep.ids for ep in live]
        room = [budget - len(ep.ids) for ep in live]
        s = dataclasses.replace(sampling, max_new_tokens=max(room),
                                max_prompt_length=max(len(c) for c in contexts))
        keys = None if greedy or live[0].key is None else [turn_key(ep.key, turn) for ep in live]
        g = group_size if turn == 0 and _grouped(contexts, group_size) else 1
        # the first turn of a group starts from one context: the engine may prefill it once for its G rows
        # where the engine can, a row ends as soon as its text holds a complete call (else it is cut below)
        stop = _call_stop(tok, fmt, [bool(ep.tools) for ep in live])
        ro = engine.generate(contexts[::g], group_size=g, sampling=s, keys=keys, with_logprobs=with_logprobs,
                             greedy=greedy, stop=stop)
        jobs = []
        for i, ep in enumerate(live):
            n = min(int(ro.completion_mask[i].sum()), room[i])
            logp = ro.sampling_logp[i, :n].tolist() if ro.sampling_logp is not None else None
            vers = ro.versions[i, :n].tolist() if ro.versions is not None else None
            calls = _model_turn(tok, ep, ro.completion_ids[i, :n].tolist(), logp, eos, fmt, vers)
            if not calls:
                continue
            if turn == max_turns - 1:  # no turn left to read the result in
                ep.done = ep.max_turns_hit = True
            elif len(ep.ids) >= budget:
                ep.done = ep.truncated = True
            else:
                jobs += [(ep, c) for c in calls]
        results = run_calls([(c, ep.tools) for ep, c in jobs], timeout=tool_timeout)  # every call of every episode at once
        for ep in {id(ep): ep for ep, _ in jobs}.values():
            mine = [(c, r) for (e, c), r in zip(jobs, results) if e is ep]
            _result_turn(tok, ep, [c for c, _ in mine], [r for _, r in mine], fmt, budget)
        live = [ep for ep in live if not ep.done]
        if not live:
            break


def episodes_rollout(episodes: list[Episode], *, pad_id: int, with_logprobs: bool, engine: str, seconds: float,
                     prompts_truncated: int, device=None) -> Rollout:
    """The episodes as one Rollout (the module docstring): prompts left-padded, completions right-padded."""
    n = len(episodes)
    p = max(len(ep.prompt) for ep in episodes)
    t = max([len(ep.ids) for ep in episodes] + [1])
    prompt_ids = torch.full((n, p), pad_id, dtype=torch.long)  # [N, P]
    prompt_mask = torch.zeros(n, p, dtype=torch.long)  # [N, P]
    ids = torch.full((n, t), pad_id, dtype=torch.long)  # [N, T]
    mask = torch.zeros(n, t, dtype=torch.long)  # [N, T] the whole context
    loss = torch.zeros(n, t, dtype=torch.long)  # [N, T] the model's own tokens
    logp = torch.zeros(n, t) if with_logprobs else None  # [N, T]
    for i, ep in enumerate(episodes):
        lp, lc = len(ep.prompt), len(ep.ids)
        prompt_ids[i, p - lp:] = torch.tensor(ep.prompt, dtype=torch.long)
        prompt_mask[i, p - lp:] = 1
        if lc:
            ids[i, :lc] = torch.tensor(ep.ids, dtype=torch.long)
            mask[i, :lc] = 1
            loss[i, :lc] = torch.tensor(ep.trained, dtype=torch.long)
            if logp is not None:
                logp[i, :lc] = torch.tensor(ep.logp) * loss[i, :lc]
    versions = None
    if any(ep.versions is not None for ep in episodes):  # [N, T] the policy version of each token
        versions = torch.zeros(n, t, dtype=torch.long)
        for i, ep in enumerate(episodes):
            if ep.versions:
                versions[i, :len(ep.versions)] = torch.tensor(ep.versions, dtype=torch.long)
        versions = versions.to(device) if device is not None else versions
    truncated = torch.tensor([ep.truncated or ep.max_turns_hit for ep in episodes], dtype=torch.bool)
    tensors = [x.to(device) if device is not None and x is not None else x
               for x in (prompt_ids, prompt_mask, ids, mask, truncated, logp, loss)]
    return Rollout(*tensors[:6], texts=[ep.final_text for ep in episodes], engine=engine, seconds=seconds,
                   prompts_truncated=prompts_truncated, loss_mask=tensors[6],
                   episodes=[ep.info() for ep in episodes], versions=versions)


def episode_counts(info: dict) -> dict:
    """An episode's info without its transcripts and environment instance: what crosses processes."""
    return {k: v for k, v in info.items() if k not in ("transcript", "completion_messages", "environment", "agent_calls")}


def episode_metrics(infos: list[dict]) -> dict:
    """Per-step tool metrics of the episodes' infos: the tool-call rate (share with at least one
    well-formed call), calls and turns per episode, tool errors and timeouts, share ended by max_turns."""
    n = max(len(infos), 1)
    if any("agent_call_count" in e for e in infos):  # agent programs (grpo.agent.programs)
        return {"agent/calls_per_episode": sum(e.get("agent_call_count", 0) for e in infos) / n,
                "agent/errors": sum(bool(e.get("agent_error")) for e in infos),
                "agent/restarted_chains": sum(max(e.get("agent_chains", 1) - 1, 0) for e in infos),
                "agent/truncated_share": sum(bool(e.get("agent_truncated")) for e in infos) / n}
    return {"tools/call_rate": sum(e["well_formed_calls"] > 0 for e in infos) / n,
            "tools/calls_per_episode": sum(e["tool_calls"] for e in infos) / n,
            "tools/turns": sum(e["turns"] for e in infos) / n,
            "tools/errors": sum(e["tool_errors"] for e in infos),
            "tools/timeouts": sum(e["tool_timeouts"] for e in infos),
            "tools/max_turns_share": sum(e["max_turns_hit"] for e in infos) / n}
