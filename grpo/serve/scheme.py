"""The serving scheme of seed 003, section 5.3: two models of one architecture behind one API.

The GRPO model answers first, capped at 512 new tokens and stopped early once 3 consecutive tokens
have an entropy below a threshold, under a hard deadline (0.8 s). An answer that misses the deadline
or fails the completeness check is replaced by the base model's answer (capped at 1024 tokens), with
a note saying the base model produced it. The seed's check looks for concluding words ("因此",
"综上"); here the check is one of ``COMPLETENESS_CHECKS``: closing markers set per language, a
stated final answer (for tasks whose reward reads one, such as arithmetic, where "7 + 5 = 12" is the
concluding statement and holds no concluding word), or any grpo reward function as the verifier.
The seed gives no entropy threshold; ``DEFAULT_ENTROPY_THRESHOLD`` is this project's choice.
"""

from __future__ import annotations

import asyncio
import re
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from grpo.registry import Registry
from grpo.rewards.builtin import REWARDS, stated_answer_reward
from grpo.rewards.forms import BatchInputs, check_value
from grpo.rewards.reward import Reward
from grpo.rewards.scoring import reward_outcomes
from grpo.serve.batcher import Lane, Overloaded
from grpo.serve.engines import Generation, resolve

# nats; the seed names no value. At 0.01 the trained arithmetic run's echo of its question ("14 + 13":
# three near-certain tokens copied from the prompt) stopped 11 of 200 held-out answers before their
# result, each then refused as incomplete; at 0.001 none stopped there (docs/benchmarks: Serving)
DEFAULT_ENTROPY_THRESHOLD = 0.001
DEFAULT_MARKERS = {
    "en": ("therefore", "thus", "hence", "so the answer", "the answer is", "in conclusion", "in summary"),
    "zh": ("因此", "综上", "所以", "答案是"),
}
DEFAULT_NOTES = {
    "en": "This answer was produced by the base model, without reinforcement-learning optimization.",
    "zh": "本回答由基础模型生成，未经强化学习优化。",  # the seed's note
}
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


def language_of(text: str) -> str:
    """'zh' when the text holds CJK characters, else 'en' (the keys of the markers and notes)."""
    return "zh" if _CJK.search(text) else "en"


@dataclass
class Scheme:
    """Every setting of the seed's scheme (the CLI flags of ``grpo serve``)."""

    grpo_max_tokens: int = 512
    entropy_threshold: float = DEFAULT_ENTROPY_THRESHOLD
    entropy_run: int = 3
    deadline_s: float | None = 0.8  # None: no deadline (the answer is judged on its content alone)
    completeness: str = "markers"  # a COMPLETENESS_CHECKS name
    markers: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_MARKERS))
    verifier: object = None  # a grpo reward function (completion, sample) -> score; > 0 passes (check "verifier")
    fallback_max_tokens: int = 1024
    notes: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_NOTES))


_SENTENCE_END = re.compile(r"[.!?。！？]\s*[$)*\s]*$|\n\s*$")
# name -> (generation, sample, scheme) -> why the answer is not complete, or None
COMPLETENESS_CHECKS: Registry = Registry("completeness check", field="--completeness")


def _markers_check(gen: Generation, sample: dict, scheme: "Scheme") -> str | None:
    """A closing marker of the answer's language (a language without markers passes); an
    entropy-stopped answer with no markers configured has nothing showing it concluded."""
    markers = scheme.markers.get(language_of(gen.text))
    if markers:
        low = gen.text.lower()
        return None if any(m.lower() in low for m in markers) else "no_closing_marker"
    return "early_stop" if gen.finish == "entropy" else None


COMPLETENESS_CHECKS.register("markers", _markers_check)


def _final_answer_check(gen: Generation, sample: dict, scheme: "Scheme") -> str | None:
    """One final answer stated as such, by the ``stated_answer`` reward's rule: a recognised form
    (\\boxed{}, '#### n', 'answer is n') or the last number stated as a result ('7 + 5 = 12', 'the sum
    is 12') or alone ('12'), not hedged ('12 or 13'). An entropy-stopped answer must also end its sentence
    (a stop inside '= 1|2' would state a cut number)."""
    if stated_answer_reward(gen.text, sample) <= 0:
        return "no_final_answer"
    if gen.finish == "entropy" and not _SENTENCE_END.search(gen.text.strip()):
        return "early_stop"
    return None


COMPLETENESS_CHECKS.register("final_answer", _final_answer_check)


def _verifier_check(gen: Generation, sample: dict, scheme: "Scheme") -> str | None:
    """The ``--verifier`` reward scores the answer above 0 (a reward that raises rejects it)."""
    if scheme.verifier is None:
        return "verifier_error"
    try:  # either form of reward (grpo.rewards.forms)
        score = reward_outcomes("verifier", Reward.of("verifier", scheme.verifier), BatchInputs([gen.text], [sample]))[0]
        if isinstance(score, BaseException):
            raise score
        score = check_value("verifier", score, batch=False)
    except Exception:
        return "verifier_error"
    return None if score is not None and score > 0 else "verifier_rejected"


COMPLETENESS_CHECKS.register("verifier", _verifier_check)


def _ended_check(gen: Generation, sample: dict, scheme: "Scheme") -> str | None:
    """No check of the content: an answer that ended on its own (EOS or the entropy stop) within the cap
    and the deadline is complete. What auto picks where the run's own answers pass no content check."""
    return None


COMPLETENESS_CHECKS.register("ended", _ended_check)


CONTENT_CHECKS = ("final_answer", "markers")  # what --completeness auto measures, before falling back to ended


@dataclass(frozen=True)
class CheckChoice:
    """What ``choose_completeness`` picked and the counts it picked on."""

    name: str
    passed: dict  # check name -> how many of the answers passed it
    answers: int

    def describe(self) -> str:
        counts = ", ".join(f"{k} {v}/{self.answers}" for k, v in self.passed.items())
        why = ("the run's own answers pass no content check, so an answer that ended within the cap and deadline "
               "is accepted" if self.name == "ended" else "the content check most of the run's own answers pass")
        return f"completeness check {self.name} (auto, measured on {self.answers} held-out answers: {counts}; {why})"


def choose_completeness(gens: list[Generation], samples: list[dict], scheme: "Scheme",
                        preferred: str) -> CheckChoice:
    """The check --completeness auto serves with: of CONTENT_CHECKS (``preferred`` first, the rule's
    choice from the run's rewards), the one the most of the run's own answers ``gens`` pass (a tie: the
    earlier), or 'ended' where none passes half of them (a check the model's answers never pass would
    send every request to the fallback)."""
    order = [preferred] + [c for c in CONTENT_CHECKS if c != preferred]
    ended = [(g, x) for g, x in zip(gens, samples) if g.finish in ("stop", "entropy")]  # past the cap: none helps
    passed = {name: sum(COMPLETENESS_CHECKS[name](g, x, scheme) is None for g, x in ended) for name in order}
    passed["ended"] = len(ended)
    best = max(order, key=lambda name: (passed[name], -order.index(name)))  # content checks only
    name = best if passed[best] * 2 >= len(gens) and passed[best] else "ended"
    return CheckChoice(name, passed, len(gens))


def default_completeness(rewards: str | None) -> str:
    """The check for a run trained on ``rewards`` (its config's comma-separated names; None: not a
    run): 'final_answer' where one of them declares that it reads a final answer (the answer the run
    was trained to state is its concluding statement), else 'markers'."""
    names = {r.strip() for r in (rewards or "").split(",")}
    return "final_answer" if any(n in REWARDS and REWARDS[n].reads_final_answer for n in names) else "markers"


def incomplete_reason(gen: Generation, sample: dict, scheme: Scheme) -> str | None:
    """Why the GRPO model's answer is not accepted (None: it is). It must have ended on its own (EOS)
    or by the entropy stop, and pass the scheme's completeness check (COMPLETENESS_CHECKS)."""
    if gen.finish in ("deadline", "length"):
        return {"deadline": "deadline", "length": "token_cap"}[gen.finish]
    return COMPLETENESS_CHECKS[scheme.completeness](gen, sample, scheme)


@dataclass
class Answer:
    """What the server returns for one request."""

    text: str
    answered_by: str  # "grpo" or "base"
    reason: str  # "complete" (the GRPO model's answer), "requested" (model=base), or the fallback's reason
    finish_reason: str  # OpenAI's: "stop" or "length"
    completion_tokens: int
    seconds: float
    logprobs: list | None = None  # logprobs.TokenLogprob per token of the model's text, when asked


def openai_finish(gen: Generation) -> str:
    return "stop" if gen.finish in ("stop", "entropy") else "length"


class Router:
    """Runs the scheme for one request over the GRPO model's and the fallback's lanes. ``noted``: the
    fallback is another model than the GRPO model, so its answers carry the note (a model that is its
    own fallback answers again without one)."""

    def __init__(self, grpo: Lane, fallback: Lane, scheme: Scheme, *, noted: bool = True):
        self.grpo, self.fallback, self.scheme, self.noted = grpo, fallback, scheme, noted

    async def grpo_answer(self, prompt: str, sample: dict, *, max_tokens: int | None, temperature: float,
                          top_p: float, top_logprobs: int | None = None) -> tuple[Generation | None, str | None]:
        """The GRPO model's answer within the deadline, and why it is not accepted (None: accepted;
        the answer is None where the GRPO model failed)."""
        s, start = self.scheme, time.monotonic()
        cap = min(s.grpo_max_tokens, max_tokens or s.grpo_max_tokens)
        deadline = None if s.deadline_s is None else start + s.deadline_s
        fut = self.grpo.submit(prompt, cap=cap, deadline=deadline, temperature=temperature, top_p=top_p,
                               top_logprobs=top_logprobs)
        wait = None if deadline is None else max(deadline - time.monotonic(), 0)
        try:  # the wait ends at the deadline even where a step runs past it
            gen = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), wait)
        except asyncio.TimeoutError:
            resolve(fut, Generation("", 0, "deadline", 0.0))  # the engine drops the row at its next step
            gen = fut.result()
        except Overloaded:
            raise
        except Exception:  # the GRPO model's step failed: the fallback answers
            return None, "grpo_error"
        return gen, incomplete_reason(gen, sample, s)

    def submit_fallback(self, prompt: str, *, max_tokens: int | None, temperature: float, top_p: float,
                        on_tokens=None, top_logprobs: int | None = None) -> Future:
        cap = min(self.scheme.fallback_max_tokens, max_tokens or self.scheme.fallback_max_tokens)
        return self.fallback.submit(prompt, cap=cap, deadline=None, temperature=temperature, top_p=top_p,
                                    on_tokens=on_tokens, top_logprobs=top_logprobs)

    def note(self, text: str) -> str:
        """The note for a fallback answer ``text`` (its language's), '' when none is due."""
        if not self.noted:
            return ""
        notes = self.scheme.notes
        return notes.get(language_of(text)) or next(iter(notes.values()), "")

    async def answer(self, prompt: str, sample: dict, *, max_tokens: int | None, temperature: float, top_p: float,
                     direct_fallback: bool = False, top_logprobs: int | None = None) -> Answer:
        """The GRPO model's answer when it is in time and complete, else the fallback's with its note.
        ``direct_fallback``: the request named the base model; the scheme does not run. The log-probs
        (``top_logprobs`` alternatives per token; None: none) are those of the model that answered, for
        its own tokens (a note has none)."""
        start = time.monotonic()
        kw = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_logprobs=top_logprobs)
        if direct_fallback:
            gen = await asyncio.wrap_future(self.submit_fallback(prompt, **kw))
            return Answer(gen.text, "base", "requested", openai_finish(gen), gen.tokens, time.monotonic() - start,
                          gen.logprobs)
        gen, reason = await self.grpo_answer(prompt, sample, **kw)
        if reason is None:
            return Answer(gen.text, "grpo", "complete", openai_finish(gen), gen.tokens, time.monotonic() - start,
                          gen.logprobs)
        fb = await asyncio.wrap_future(self.submit_fallback(prompt, **kw))
        note = self.note(fb.text)
        text = f"{fb.text}\n\n{note}" if note else fb.text
        return Answer(text, "base", reason, openai_finish(fb), fb.tokens, time.monotonic() - start, fb.logprobs)
