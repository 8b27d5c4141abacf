"""Running the calls of many episodes at once: a thread pool, a deadline per call, faults as results.

Every fault (a call that could not be read, an unknown tool, arguments that do not fit the schema, a
tool that raises, one past ``timeout`` seconds) becomes an ``Error: ...`` text the model reads as the
tool's result, and is counted; nothing a tool does stops the run. An ``async def`` tool runs on an
event loop of its own in a worker thread, where ``asyncio.wait_for`` cancels it at the deadline; a
plain function past its deadline is abandoned (a Python thread cannot be stopped: it runs on in the
background), so a tool that may hang or runs untrusted code should bound itself (e.g. run code
through grpo's sandbox).
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import time
from dataclasses import dataclass

from grpo.agent.formats import Call
from grpo.agent.tools import Tool, argument_error

ASYNC_GRACE = 0.5  # seconds
MAX_RESULT_CHARS = 2000  # a longer result is cut (it costs context tokens)


@dataclass
class ToolResult:
    text: str  # what the model reads
    error: bool = False  # a fault (counted as a tool error)
    timeout: bool = False  # past the deadline (counted as a tool timeout, and as an error)
    ran: bool = False  # a well-formed call: a known tool with fitting arguments, called


def _invoke(tool: Tool, args: dict, timeout: float):
    if tool.is_async:
        coro = tool.fn(**args)
        return asyncio.run(asyncio.wait_for(coro, timeout) if timeout > 0 else coro)
    return tool.fn(**args)


def _as_text(value) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= MAX_RESULT_CHARS else text[:MAX_RESULT_CHARS] + " ...(cut)"


def precheck(call: Call, tools: dict[str, Tool]) -> ToolResult | None:
    """The error result of a call that must not run (malformed, unknown tool, bad arguments), else None."""
    if call.error is not None:
        return ToolResult(f"Error: malformed call: {call.error}", error=True)
    if call.name not in tools:
        return ToolResult(f"Error: unknown tool {call.name!r}; the tools are {', '.join(tools) or 'none'}", error=True)
    why = argument_error(tools[call.name], call.arguments)
    return None if why is None else ToolResult(f"Error: {call.name}: {why}", error=True)


def run_calls(jobs: list[tuple[Call, dict[str, Tool]]], *, timeout: float, max_workers: int = 32) -> list[ToolResult]:
    """The result of each (call, the episode's tools), the valid calls run concurrently; ``timeout``
    seconds per call (0: none), counted from when the batch starts (every call has a thread of its
    own, up to ``max_workers``; beyond that, calls wait for a thread within their deadline)."""
    results: list[ToolResult | None] = [precheck(c, t) for c, t in jobs]
    todo = [i for i, r in enumerate(results) if r is None]
    if not todo:
        return results
    pool = cf.ThreadPoolExecutor(max_workers=min(len(todo), max_workers), thread_name_prefix="grpo-tool")
    try:
        start = time.monotonic()
        futures = {i: pool.submit(_invoke, jobs[i][1][jobs[i][0].name], jobs[i][0].arguments, timeout) for i in todo}
        for i, fut in futures.items():
            name = jobs[i][0].name
            # an async tool is cancelled by its own wait_for at the deadline: wait a moment longer for that
            grace = ASYNC_GRACE if jobs[i][1][name].is_async else 0.0
            left = None if timeout <= 0 else max(0.0, start + timeout + grace - time.monotonic())
            try:
                results[i] = ToolResult(_as_text(fut.result(timeout=left)), ran=True)
            except (cf.TimeoutError, asyncio.TimeoutError):
                fut.cancel()
                results[i] = ToolResult(f"Error: {name} took longer than {timeout:g} s", error=True, timeout=True,
                                        ran=True)
            except Exception as e:  # the tool is user code: its failure is the episode's, not the run's
                results[i] = ToolResult(f"Error: {name} raised {type(e).__name__}: {e}", error=True, ran=True)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return results
