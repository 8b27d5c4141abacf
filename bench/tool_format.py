"""Which way of showing a calculator tool gives the untrained embedded model a usable GRPO signal?

SmolLM2-135M-Instruct's chat template has no tool support (it writes every message as
``<|im_start|>ROLE\\nCONTENT<|im_end|>``, ``tool`` included), so the format the tool is shown in is
ours to choose. For each candidate format this script runs full two-turn episodes with plain
``transformers`` ``generate`` (fp32, batched): the model's first turn is generated until the call's
closing text or EOS; a well-formed call is evaluated (a safe ``ast`` walk, arithmetic only), its
result appended as the next message through the chat template, and the final answer generated. It
prints per format: the tool-call rate (well-formed calls), the share of calls whose expression
evaluates to the right product, the final-answer exact match (last integer of the last assistant
text), that accuracy among episodes whose call was right (where the final turn loses answers), mean
model tokens and context tokens per episode, and seconds. The ``none`` row (no tool: the model
answers in its head) is the peer every other row is read against.

    PYTHONPATH=. python bench/tool_format.py [--problems 16] [--samples 4] [--threads 2] [--only a,b]
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import random
import re
import time
from dataclasses import dataclass, field

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from grpo.models import load_models
from grpo.models.loading import DEFAULT_MODEL

# ---------------------------------------------------------------- safe arithmetic

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def safe_eval(expression: str) -> float | int:
    """Evaluate numbers, + - * / // % ** and parentheses; anything else raises ValueError."""
    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
            return _UNOPS[type(node.op)](walk(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")
    try:
        return walk(ast.parse(expression.strip(), mode="eval"))
    except (SyntaxError, ZeroDivisionError, OverflowError, TypeError) as e:
        raise ValueError(str(e)) from e


def show_result(value) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


# ---------------------------------------------------------------- call syntaxes


@dataclass
class Call:
    end: int            # index in the text just past the call's closing text
    expression: str | None  # None: a call was started and closed but is malformed


def find_python_call(text: str, name: str) -> Call | None:
    """``name(EXPR)`` with balanced parentheses; None while no call is closed."""
    m = re.search(rf"\b{re.escape(name)}\s*\(", text)
    if m is None:
        return None
    depth = 1
    for i in range(m.end(), len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            inner = text[m.end():i].strip()
            # the model may quote the expression or name the argument: accept both forms
            inner = re.sub(r"^expression\s*=\s*", "", inner)
            if len(inner) >= 2 and inner[0] == inner[-1] and inner[0] in "'\"":
                inner = inner[1:-1]
            return Call(end=i + 1, expression=inner)
    return None


def find_hermes_call(text: str, name: str) -> Call | None:
    """``<tool_call>{"name": ..., "arguments": {"expression": ...}}</tool_call>``."""
    m = re.search(r"<tool_call>(.*?)</tool_call>", text, re.S)
    if m is None:
        return None
    try:
        obj = json.loads(m.group(1).strip())
        expr = obj["arguments"]["expression"] if obj.get("name") == name else None
        expr = expr if isinstance(expr, str) else None
    except (ValueError, KeyError, TypeError, AttributeError):
        expr = None
    return Call(end=m.end(), expression=expr)


# ---------------------------------------------------------------- candidate formats

PY_SYSTEM = ("You are a helpful assistant with a calculator. To compute an arithmetic expression, reply "
             "with calculator(EXPRESSION) and nothing else, for example calculator(12 * 34). The result "
             "is sent back to you; then give the final answer.")
CALC_SYSTEM = PY_SYSTEM.replace("calculator(", "calc(").replace("with a calculator", "with a calculator, calc")
HERMES_SYSTEM = ("You are a helpful assistant with one tool.\n<tools>\n"
                 '{"name": "calculator", "description": "Evaluate an arithmetic expression.", '
                 '"parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, '
                 '"required": ["expression"]}}\n</tools>\nTo call it, reply with\n<tool_call>\n'
                 '{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>\n'
                 "The result is sent back to you; then give the final answer.")
HERMES_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>'


@dataclass
class Format:
    name: str
    system: str | None                 # None: the template's default system prompt
    shots: list[dict] = field(default_factory=list)  # the worked exchange, before the real question
    syntax: str = "python"             # python | hermes | none
    tool_name: str = "calculator"
    result_role: str = "tool"          # the role the result comes back in
    result_prefix: str = ""            # text before the number in that message


def worked(call: str, *, result_role="tool", prefix="", final=True, result=True) -> list[dict]:
    msgs = [{"role": "user", "content": "What is 12 * 34?"}, {"role": "assistant", "content": call}]
    if result:
        msgs.append({"role": result_role, "content": prefix + "408"})
    if result and final:
        msgs.append({"role": "assistant", "content": "12 * 34 = 408"})
    return msgs


FORMATS = [
    Format("none", None, syntax="none"),
    Format("sys_py", PY_SYSTEM),
    Format("sys_hermes", HERMES_SYSTEM, syntax="hermes"),
    Format("py_tool_final", PY_SYSTEM, worked("calculator(12 * 34)")),
    Format("py_tool_final_nosys", None, worked("calculator(12 * 34)")),
    Format("py_user_final", PY_SYSTEM, worked("calculator(12 * 34)", result_role="user", prefix="Result: "),
           result_role="user", result_prefix="Result: "),
    Format("py_tool_nofinal", PY_SYSTEM, worked("calculator(12 * 34)", final=False)),
    Format("py_call_only", PY_SYSTEM, worked("calculator(12 * 34)", result=False)),
    Format("py_call_only_nosys", None, worked("calculator(12 * 34)", result=False)),
    Format("calc_call_only", CALC_SYSTEM, worked("calc(12 * 34)", result=False), tool_name="calc"),
    Format("calc_call_only_nosys", None, worked("calc(12 * 34)", result=False), tool_name="calc"),
    Format("calc_tool_final", CALC_SYSTEM, worked("calc(12 * 34)"), tool_name="calc"),
    Format("hermes_tool_final", HERMES_SYSTEM, worked(HERMES_CALL), syntax="hermes"),
]


def find_call(fmt: Format, text: str) -> Call | None:
    if fmt.syntax == "python":
        return find_python_call(text, fmt.tool_name)
    if fmt.syntax == "hermes":
        return find_hermes_call(text, fmt.tool_name)
    return None


# ---------------------------------------------------------------- generation


class CallClosed(StoppingCriteria):
    """Per row: stop once the new text holds a closed call (the rest of the turn is never needed)."""

    def __init__(self, fmt: Format, tokenizer, prompt_len: int):
        self.fmt, self.tok, self.prompt_len = fmt, tokenizer, prompt_len

    def __call__(self, input_ids, scores, **kwargs):
        texts = self.tok.batch_decode(input_ids[:, self.prompt_len:], skip_special_tokens=True)
        return torch.tensor([find_call(self.fmt, t) is not None for t in texts], dtype=torch.bool,
                            device=input_ids.device)


def generate(model, tok, prompts: list[str], *, sample: bool, max_new: int, fmt: Format | None):
    """Continue every prompt; return (texts, new-token counts, prompt-token counts)."""
    if not prompts:
        return [], [], []
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    width = enc.input_ids.shape[1]
    stops = StoppingCriteriaList([CallClosed(fmt, tok, width)]) if fmt is not None and fmt.syntax != "none" else None
    kw = dict(do_sample=True, temperature=0.8, top_p=1.0, top_k=0) if sample else dict(do_sample=False)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new, stopping_criteria=stops, pad_token_id=tok.pad_token_id,
                             **kw)
    new = out[:, width:]
    # pad is EOS here: a row's own tokens run up to and including its first EOS (or the padding that
    # follows a stop on a closed call, one token over)
    counts = [first_eos(row, tok) + 1 or len(row) for row in new]
    return (tok.batch_decode(new, skip_special_tokens=True), counts,
            [int(m.sum()) for m in enc.attention_mask])


def first_eos(row: torch.Tensor, tok) -> int:
    hits = (row == tok.eos_token_id).nonzero()
    return int(hits[0]) if len(hits) else -1


# ---------------------------------------------------------------- episodes


@dataclass
class Episode:
    a: int
    b: int
    greedy: bool
    messages: list[dict]
    called: bool = False
    call_right: bool = False
    final: str = ""
    gen_tokens: int = 0
    context_tokens: int = 0

    @property
    def correct(self) -> bool:
        nums = re.findall(r"-?\d[\d,]*", self.final)
        return bool(nums) and nums[-1].replace(",", "").rstrip(",") == str(self.a * self.b)


def run_phase(model, tok, eps: list[Episode], fmt: Format, *, max_new: int, stop_on_call: bool):
    """One assistant turn for every episode in ``eps``: sampled rows and greedy rows separately."""
    texts = {}
    for greedy in (False, True):
        part = [e for e in eps if e.greedy == greedy]
        prompts = [tok.apply_chat_template(e.messages, tokenize=False, add_generation_prompt=True) for e in part]
        outs, counts, plens = generate(model, tok, prompts, sample=not greedy, max_new=max_new,
                                       fmt=fmt if stop_on_call else None)
        for e, t, c, p in zip(part, outs, counts, plens):
            e.gen_tokens += c
            e.context_tokens = p + c
            texts[id(e)] = t
    return texts


def run_format(model, tok, fmt: Format, problems, samples: int, seed: int) -> dict:
    torch.manual_seed(seed)
    start = time.perf_counter()
    eps = []
    for a, b in problems:
        for greedy in [False] * samples + [True]:
            msgs = ([] if fmt.system is None else [{"role": "system", "content": fmt.system}]) + \
                [dict(m) for m in fmt.shots] + [{"role": "user", "content": f"What is {a} * {b}?"}]
            eps.append(Episode(a, b, greedy, msgs))
    first = run_phase(model, tok, eps, fmt, max_new=64, stop_on_call=True)
    second_round = []
    for e in eps:
        text = first[id(e)]
        call = find_call(fmt, text)
        value = None
        if call is not None and call.expression is not None:
            try:
                value = safe_eval(call.expression)
            except ValueError:
                value = None
        if value is None:  # no call, or a malformed one: the first turn is the final answer
            e.final = text
            e.messages.append({"role": "assistant", "content": text})
            continue
        e.called = True
        e.call_right = value == e.a * e.b
        e.messages.append({"role": "assistant", "content": text[:call.end]})
        e.messages.append({"role": fmt.result_role, "content": fmt.result_prefix + show_result(value)})
        second_round.append(e)
    second = run_phase(model, tok, second_round, fmt, max_new=48, stop_on_call=False)
    for e in second_round:
        e.final = second[id(e)]
        e.messages.append({"role": "assistant", "content": e.final})
    return summarize(fmt, eps, time.perf_counter() - start)


def summarize(fmt: Format, eps: list[Episode], seconds: float) -> dict:
    def rate(xs):
        return sum(xs) / len(xs) if xs else float("nan")
    row = {"format": fmt.name, "seconds": seconds}
    for tag, group in (("T0.8", [e for e in eps if not e.greedy]), ("greedy", [e for e in eps if e.greedy])):
        calls = [e for e in group if e.called]
        right = [e for e in calls if e.call_right]
        row[tag] = dict(n=len(group), call_rate=rate([e.called for e in group]),
                        call_right=rate([e.call_right for e in calls]), acc=rate([e.correct for e in group]),
                        acc_given_right_call=rate([e.correct for e in right]),
                        gen_tokens=rate([e.gen_tokens for e in group]),
                        context_tokens=rate([e.context_tokens for e in group]))
    sampled = [e for e in eps if not e.greedy]
    by_problem = {}
    for e in sampled:
        by_problem.setdefault((e.a, e.b), []).append(e.correct)
    # GRPO learns only from groups whose completions differ in reward
    row["mixed_groups"] = rate([0 < sum(v) < len(v) for v in by_problem.values()])
    row["example"] = eps[0].messages[-3:] if eps[0].called else eps[0].messages[-1:]
    return row


def problems_for(n: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        pair = (a, b) if rng.random() < 0.5 else (b, a)
        if pair not in out and sorted(pair) != [12, 34]:
            out.append(pair)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--problems", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--only", default="", help="comma-separated format names, run in that order")
    ap.add_argument("--show", action="store_true", help="print one transcript per format")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_models(args.model, need_reference=False)
    model, tok = loaded.policy.eval(), loaded.tokenizer
    problems = problems_for(args.problems, args.seed)
    by_name = {f.name: f for f in FORMATS}
    unknown = [n for n in args.only.split(",") if n and n not in by_name]
    if unknown:
        raise SystemExit(f"unknown format(s) {unknown}; known: {sorted(by_name)}")
    chosen = [by_name[n] for n in args.only.split(",")] if args.only else FORMATS
    print(f"problems ({len(problems)}): {problems}")
    head = (f"{'format':22s} {'mode':6s} {'call':>5s} {'right':>5s} {'acc':>5s} {'acc|rc':>6s} "
            f"{'gen':>5s} {'ctx':>5s} {'mixed':>5s} {'s':>5s}")
    rows = []
    for fmt in chosen:
        row = run_format(model, tok, fmt, problems, args.samples, args.seed)
        rows.append(row)
        print(head if len(rows) == 1 else "", end="\n" if len(rows) == 1 else "")
        for tag in ("T0.8", "greedy"):
            r = row[tag]
            print(f"{fmt.name:22s} {tag:6s} {r['call_rate']:5.2f} {r['call_right']:5.2f} {r['acc']:5.2f} "
                  f"{r['acc_given_right_call']:6.2f} {r['gen_tokens']:5.1f} {r['context_tokens']:5.0f} "
                  f"{row['mixed_groups'] if tag == 'T0.8' else float('nan'):5.2f} {row['seconds']:5.0f}",
                  flush=True)
        if args.show:
            print("   example:", json.dumps(row["example"])[:400], flush=True)
    base = next((r for r in rows if r["format"] == "none"), None)
    if base is not None:
        print(f"\nagainst the no-tool peer (T0.8 accuracy {base['T0.8']['acc']:.2f}):")
        for r in rows:
            print(f"  {r['format']:22s} accuracy {r['T0.8']['acc'] - base['T0.8']['acc']:+.2f}")


if __name__ == "__main__":
    main()
