"""Whole multi-turn episodes in `grpo report`: a logged row's transcript (samples.jsonl and
eval_completions.jsonl keep every message: the prompt, each assistant turn with its tool calls, each
tool result) rendered turn by turn. Everything from the run folder is HTML-escaped."""

from __future__ import annotations

import html
import json

EPISODES_PER_RUN = 4  # full episodes shown per run and file


def message_text(message: dict) -> str:
    """One message as text: its content, then each tool call it makes as name(arguments)."""
    parts = [str(message.get("content") or "")]
    for call in message.get("tool_calls") or []:
        fn = call.get("function", call) if isinstance(call, dict) else {}
        parts.append(f"{fn.get('name', '?')}({json.dumps(fn.get('arguments', {}), ensure_ascii=False)})")
    return "\n".join(p for p in parts if p)


def transcript_html(transcript: list[dict] | None) -> str:
    """A transcript as an HTML list of turns, each labelled with its role (empty for none)."""
    if not transcript:
        return ""
    e = html.escape
    items = "".join(f'<li class="turn {e(str(m.get("role", "")))}"><b>{e(str(m.get("role", "?")))}</b>'
                    f'{" (" + e(str(m["name"])) + ")" if m.get("name") else ""}: '
                    f'<span>{e(message_text(m))}</span></li>' for m in transcript if isinstance(m, dict))
    return f'<ol class="episode">{items}</ol>'


def episode_sections(runs: list[dict]) -> list[str]:
    """The last few logged episodes of each run, from training samples and evaluation completions."""
    out = ["<h2>Episodes (every turn: prompt, assistant turns and tool calls, tool results)</h2>"]
    shown = 0
    for run in runs:
        for what, rows in (("training sample", run["samples"]), ("evaluation", run["eval_completions"])):
            with_episode = [r for r in rows if r.get("transcript")][-EPISODES_PER_RUN:]
            for r in with_episode:
                head = (f"{run['name']}, step {r.get('step')}, {what}" + (f", suite {r['suite']}" if r.get("suite") else "")
                        + f", reward {r.get('reward')}")
                out.append(f'<div class="episode-block"><h3>{html.escape(head)}</h3>{transcript_html(r["transcript"])}</div>')
                shown += 1
    if not shown:
        out.append("<p>No multi-turn episodes logged (a run without tools or environment).</p>")
    return out
