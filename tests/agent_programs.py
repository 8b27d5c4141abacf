"""Agent programs written against the OpenAI API, as users write them (used by tests/test_agent_programs.py)."""

from __future__ import annotations

from grpo.agent.calculator import calc


def ask_then_compute(client, row):
    """Two calls per episode and a tool between them: the model writes an expression for the question,
    the program evaluates it with the calculator, and the model answers from the result; the reward is
    whether the final reply holds the answer."""
    question = [{"role": "user", "content": f"Write only the expression that answers: {row['prompt']}"}]
    first = client.chat.completions.create(model="policy", messages=question, max_tokens=24)
    expression = first.choices[0].message.content
    try:
        value = calc(expression)  # the program's own tool
    except ValueError:
        value = "an error"
    follow = question + [{"role": "assistant", "content": expression},
                         {"role": "user", "content": f"The calculator says {value}. What is the answer?"}]
    second = client.chat.completions.create(model="policy", messages=follow)
    return 1.0 if str(row["answer"]) in second.choices[0].message.content else 0.0


def grade_elsewhere(client, row):
    """One call, no reward returned: the run's rewards grade the reply."""
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    return None
