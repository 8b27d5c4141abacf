"""A judge model as reward (``rewards=judge``): a chat model behind an OpenAI-compatible API (``grpo
serve``, vLLM, any such server) reads a prompt made from the sample and the completion and answers
with a score, as verl's generative reward model and ROLL's LLM judge do, for tasks without a verifier.

- **pointwise**: one request per completion (at most ``concurrency`` in flight), the template's
  ``{completion}`` the completion's text and ``{final_answer}`` its final answer alone (``final_answer``);
- **group**: one request per prompt's group of completions, ``{completions}`` the group numbered from
  1 (``{final_answers}`` their final answers, numbered alike), the reply one line ``i: score`` per
  completion (the judge compares the group's answers, as ART's RULER does: GRPO only needs the scores'
  order within a group).

The score is read from the reply by ``parse_score``: ``yes_no`` (the first word), ``number`` (the first
number), or a regular expression whose first group is the number, divided by ``score_scale``; or, with
``yes_prob`` (pointwise), from the log-probs of the reply's one token: P(yes) / (P(yes) + P(no)), the
probability-weighted judgement of G-Eval (Liu et al. 2023, "G-Eval: NLG evaluation using GPT-4 with
better human alignment"), graded where the judge's words alone are nearly constant. Every
request goes through ``HttpReward``'s deadline, retries and timeout count (grpo.rewards.remote), so
``reward_timeout``, ``reward_retries`` and the run's failure accounting apply as to any remote reward;
a request that fails, or a reply that cannot be read, fails its completions (a group request: the
whole group), counted in reward_failures.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import re
import string
from dataclasses import dataclass

from grpo.errors import ConfigError
from grpo.rewards.answers import extract_answer
from grpo.rewards.remote import DEFAULT_CONCURRENCY, HttpReward, is_url

JUDGE_MODES = ("pointwise", "group")
SCORE_FORMS = ("yes_no", "yes_prob", "number")  # or a regular expression with one group
YES_PROB_TOP = 20  # alternatives asked for the one token yes_prob reads (OpenAI's chat maximum)
POINTWISE_TEMPLATE = ("Question: {prompt}\nReference answer: {answer}\nStudent's reply: {completion}\n\n"
                      "Is the student's final answer equal to the reference answer? Answer yes or no.")
GROUP_TEMPLATE = ("Question: {prompt}\nReference answer: {answer}\nReplies:\n{completions}\n\n"
                  "Score each reply from 0 to 10 for correctness, one line per reply written as 'N: score'.")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_NUMBERED = re.compile(r"^\s*(\d+)\s*[:.)]\s*(.*)$")


@dataclass(frozen=True)
class JudgeSettings:
    """The judge's settings: the config's ``judge_*`` fields without the prefix."""

    url: str = ""
    model: str = ""
    api_key_env: str = "GRPO_JUDGE_API_KEY"
    template: str = ""
    score: str = "yes_no"
    score_scale: float = 1.0
    mode: str = "pointwise"
    max_tokens: int = 16
    temperature: float = 0.0

    @property
    def prompt_template(self) -> str:
        return self.template or (GROUP_TEMPLATE if self.mode == "group" else POINTWISE_TEMPLATE)

    def check(self) -> None:
        """A ConfigError naming the field at fault."""
        if not is_url(self.url):
            raise ConfigError(f"judge_url: rewards=judge needs the judge's http(s):// base URL, got {self.url!r}")
        if self.mode not in JUDGE_MODES:
            raise ConfigError(f"judge_mode: {self.mode!r} is not valid; choose one of {list(JUDGE_MODES)}")
        if self.score not in SCORE_FORMS:
            try:
                groups = re.compile(self.score).groups
            except re.error as e:
                raise ConfigError(f"judge_score: {self.score!r} is neither {' nor '.join(SCORE_FORMS)} nor a regular "
                                  f"expression ({e})") from None
            if groups < 1:
                raise ConfigError(f"judge_score: the regular expression {self.score!r} needs a group around the number")
        if self.score_scale <= 0 or self.max_tokens < 1:
            raise ConfigError("judge_score_scale must be > 0 and judge_max_tokens >= 1, got "
                              f"{self.score_scale} and {self.max_tokens}")
        try:
            names = {f for _, f, _, _ in string.Formatter().parse(self.prompt_template) if f}
        except ValueError as e:
            raise ConfigError(f"judge_template: not a format string ({e})") from None
        if self.score == "yes_prob" and self.mode != "pointwise":
            raise ConfigError("judge_score: yes_prob reads one token's log-probs per completion; it needs "
                              "judge_mode=pointwise")
        group = self.mode == "group"
        want = ("completions", "final_answers") if group else ("completion", "final_answer")
        other = ("completion", "final_answer") if group else ("completions", "final_answers")
        if not names & set(want) or names & set(other):
            raise ConfigError(f"judge_template: judge_mode={self.mode} needs {{{want[0]}}} or {{{want[1]}}} in the "
                              f"template (and neither {{{other[0]}}} nor {{{other[1]}}})")


def parse_score(text: str, form: str) -> float:
    """The score in a judge's reply: ``yes_no`` (its first word), ``number`` (its first number) or a
    regular expression (its first group). ValueError when the reply holds none."""
    if form == "yes_no":
        words = re.findall(r"[a-z]+", text.lower())
        if words and words[0] in ("yes", "no"):
            return float(words[0] == "yes")
        raise ValueError(f"the judge's reply {text[:80]!r} starts with neither yes nor no")
    m = _NUMBER.search(text) if form == "number" else re.search(form, text)
    if m is None:
        raise ValueError(f"no score in the judge's reply {text[:80]!r} (judge_score={form!r})")
    try:
        return float(m.group(0) if form == "number" else m.group(1))
    except ValueError:
        raise ValueError(f"the judge's score {m.group(0)!r} is not a number") from None


def yes_probability(top: list[dict]) -> float:
    """P(yes) / (P(yes) + P(no)) from a token's alternatives [{"token", "logprob"}] (OpenAI's
    ``top_logprobs``): a token counts for yes (no) when its text, stripped and lower-cased, is a
    non-empty beginning of "yes" ("no"). ValueError when none counts for either."""
    mass = {"yes": 0.0, "no": 0.0}
    for alt in top:
        word = str(alt["token"]).strip().lower()
        for key in mass:
            if word and key.startswith(word):
                mass[key] += math.exp(float(alt["logprob"]))
    total = mass["yes"] + mass["no"]
    if total <= 0:
        shown = [a["token"] for a in top[:5]]
        raise ValueError(f"neither yes nor no among the judge's {len(top)} likeliest first tokens ({shown})")
    return mass["yes"] / total


def parse_group_scores(text: str, form: str, n: int) -> list[float | Exception]:
    """One outcome per completion 1..n from a reply of lines ``i: ...`` (``parse_score`` on the rest of
    line i); a completion whose line is missing or unreadable gets the ValueError."""
    found: dict[int, str] = {}
    for line in text.splitlines():
        m = _NUMBERED.match(line)
        if m and 1 <= int(m.group(1)) <= n:
            found.setdefault(int(m.group(1)), m.group(2))
    out: list[float | Exception] = []
    for i in range(1, n + 1):
        try:
            if i not in found:
                raise ValueError(f"the judge's reply has no line '{i}: score' ({text[:80]!r})")
            out.append(parse_score(found[i], form))
        except ValueError as e:
            out.append(e)
    return out


def no_judge(completions: list[str], samples: list[dict]) -> list[float]:
    """The ``judge`` reward before its settings are given: an error saying how to give them."""
    raise ValueError("rewards=judge: the judge is built from the judge_* settings (judge_url, ...) when the "
                     "reward is resolved with them")


def _text(value) -> str:
    """A field as the judge reads it: chat messages as their contents, one per line."""
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return "\n".join(str(m.get("content", "")) for m in value)
    return str(value)


FILLED = frozenset({"completion", "final_answer", "completions", "final_answers"})  # the judge's fields, not columns


def final_answer(completion: str) -> str:
    """The completion's final answer as the template's ``{final_answer}`` shows it: the last \\boxed{}
    content, else the last number (grpo.rewards.answers.extract_answer), else "none". A judge that reads
    only this cannot be swayed by the reasoning's wording, which a small judge's probabilities are."""
    found = extract_answer(completion)
    return found or "none"  # an empty \boxed{} shows as none too


def _numbered(items) -> str:
    return "\n".join(f"{j + 1}: {x}" for j, x in enumerate(items))


def _groups(samples: list[dict]) -> list[list[int]]:
    """Runs of consecutive rows of the same sample (a prompt's group of completions)."""
    out: list[list[int]] = []
    for i, s in enumerate(samples):
        if out and (samples[out[-1][0]] is s or samples[out[-1][0]] == s):
            out[-1].append(i)
        else:
            out.append([i])
    return out


class JudgeReward(HttpReward):
    """The ``judge`` reward (module docstring). Batch form: one call per step's completions; each
    request within ``timeout`` seconds, retried ``retries`` times (HttpReward's rules), ``concurrency``
    requests at most in flight."""

    def __init__(self, settings: JudgeSettings, *, timeout: float, retries: int = 2,
                 concurrency: int = DEFAULT_CONCURRENCY):
        settings.check()
        super().__init__(settings.url.rstrip("/") + "/chat/completions", timeout=timeout, retries=retries)
        self.settings, self.concurrency = settings, concurrency
        self.key_env = settings.api_key_env
        self.__name__ = "judge"

    def render(self, sample: dict, **extra) -> str:
        clash = sorted(set(sample) & FILLED)
        if clash:  # the judge's own field would silently replace the column's value
            raise ConfigError(f"judge_template: the sample's column {clash[0]!r} has the name of a field the judge "
                              f"fills in ({', '.join(f'{{{n}}}' for n in sorted(FILLED))}); rename the column")
        fields_ = {k: _text(v) for k, v in sample.items()} | extra
        try:
            return self.settings.prompt_template.format_map(fields_)
        except (KeyError, IndexError) as e:
            raise ConfigError(f"judge_template: {{{e.args[0]}}} is not a field of the sample (fields: "
                              f"{sorted(fields_)})") from None

    def ask(self, content: str, max_tokens: int) -> str:
        """One chat request; the reply's text."""
        choice = self._choice(content, max_tokens=max_tokens)
        try:
            return str(choice["message"]["content"])
        except (KeyError, TypeError):
            raise ValueError(f"{self.url} answered a choice without a message: {str(choice)[:200]}") from None

    def ask_yes_prob(self, content: str) -> float:
        """One chat request for one token with its log-probs; P(yes) / (P(yes) + P(no)) of it."""
        choice = self._choice(content, max_tokens=1, logprobs=True, top_logprobs=YES_PROB_TOP)
        try:
            tokens = choice["logprobs"]["content"]
            if not tokens:
                raise ValueError("the judge's reply has no token (it ended at once): no log-probs to read")
            top = tokens[0]["top_logprobs"]
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"{self.url} answered without token log-probs (judge_score=yes_prob needs a server "
                             f"that returns logprobs): {str(choice)[:200]}") from None
        return yes_probability(top)

    def _choice(self, content: str, **fields) -> dict:
        s = self.settings
        body = {"messages": [{"role": "user", "content": content}], "temperature": s.temperature, **fields}
        if s.model:
            body["model"] = s.model
        raw = self._post_retrying(self.url, json.dumps(body).encode())
        try:
            return json.loads(raw)["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ValueError(f"{self.url} answered {raw[:200]!r}, not a chat completion") from None

    def _pointwise(self, completions: list[str], samples: list[dict]) -> list:
        s = self.settings
        contents = [self.render(sample, completion=c, final_answer=final_answer(c))
                    for c, sample in zip(completions, samples)]

        def one(content: str):
            try:
                if s.score == "yes_prob":
                    return self.ask_yes_prob(content) / s.score_scale
                return parse_score(self.ask(content, s.max_tokens), s.score) / s.score_scale
            except Exception as e:  # this completion's failure
                return e

        with cf.ThreadPoolExecutor(max(1, min(self.concurrency, len(contents)))) as pool:
            return list(pool.map(one, contents))

    def _group(self, completions: list[str], samples: list[dict]) -> list:
        s = self.settings
        out: list = [None] * len(completions)
        groups = _groups(samples)
        contents = [self.render(samples[g[0]], completions=_numbered(completions[i] for i in g),
                                final_answers=_numbered(final_answer(completions[i]) for i in g)) for g in groups]

        def one(k: int) -> list:
            try:
                reply = self.ask(contents[k], s.max_tokens * len(groups[k]) + 8)
            except Exception as e:  # the whole group's failure
                return [e] * len(groups[k])
            return [v / s.score_scale if isinstance(v, float) else v
                    for v in parse_group_scores(reply, s.score, len(groups[k]))]

        with cf.ThreadPoolExecutor(max(1, min(self.concurrency, len(groups)))) as pool:
            for g, values in zip(groups, pool.map(one, range(len(groups)))):
                for i, v in zip(g, values):
                    out[i] = v
        return out

    def __call__(self, completions: list[str], samples: list[dict]) -> list:
        if self.settings.mode == "group":
            return self._group(list(completions), samples)
        return self._pointwise(list(completions), samples)
