"""A learned process reward model (PRM) as the step reward of process supervision (``supervision=process``,
``step_reward=prm:<folder>``), in Math-Shepherd's form (Wang et al. 2024, arXiv 2312.08935), which
DeepSeekMath's process supervision trains on (Shao et al. 2024, section 4.1.3).

A PRM is a causal language model that reads the question and the solution with a step tag after each
step and scores a step by the probability of the "good" label word against the "bad" one at the tag:

    question step_1 <tag>\\n step_2 <tag>\\n ...      score_j = p(good) / (p(good) + p(bad)) after tag j

The folder is a transformers model folder with ``prm.json`` beside its weights naming ``step_tag``,
``good``, ``bad`` and ``separator`` (the rule that splits a completion into steps: a newline by default);
without it, Math-Shepherd's released checkpoints' values (tag "ки", labels "+" and "-"). Each step ends
where its text ends in the completion, which is where its reward lands (rewards.steps.step_tensors).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from grpo.errors import ConfigError

PREFIX = "prm:"
SPEC_FILE = "prm.json"


@dataclass(frozen=True)
class PRMSpec:
    """How a PRM reads a solution: the tag after each step, the two label words, and the step separator."""

    step_tag: str = "ки"
    good: str = "+"
    bad: str = "-"
    separator: str = "\n"

    @classmethod
    def read(cls, folder: Path) -> PRMSpec:
        path = Path(folder) / SPEC_FILE
        if not path.is_file():
            return cls()
        try:
            raw = json.loads(path.read_text())
            return cls(**raw)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"step_reward: {path}: not a PRM spec ({e}); keys: {', '.join(asdict(cls()))}") from None

    def write(self, folder: Path) -> None:
        (Path(folder) / SPEC_FILE).write_text(json.dumps(asdict(self), indent=1, ensure_ascii=False) + "\n")


def split_steps(text: str, separator: str = "\n") -> list[tuple[str, int]]:
    """The completion's steps by ``separator``: each non-blank piece, stripped at its end, with the
    character offset where it ends (exclusive)."""
    steps, pos = [], 0
    for piece in text.split(separator):
        end = pos + len(piece.rstrip())
        if piece.strip():
            steps.append((piece.strip(), end))
        pos += len(piece) + len(separator)
    return steps


def question_text(sample: dict) -> str:
    """The prompt a solution answers, as text (a chat prompt's user turns joined)."""
    prompt = sample.get("prompt", "")
    if isinstance(prompt, list):
        return "\n".join(str(m.get("content", "")) for m in prompt if m.get("role") != "system")
    return str(prompt)


def prm_input(question: str, steps: list[str], spec: PRMSpec) -> str:
    """The text a PRM reads: the question, then each step followed by the tag (Math-Shepherd's layout)."""
    return question + " " + "".join(f"{s} {spec.step_tag}\n" for s in steps)


class PRMScorer:
    """``step_reward=prm:<folder>``: the step reward fn(completion, sample) -> [(score, end_char)], with the
    model loaded on first use and kept; a completion without a step is scored as one step."""

    def __init__(self, folder: str):
        self.folder = Path(folder).expanduser()
        if not (self.folder / "config.json").is_file():
            raise ConfigError(f"step_reward: prm:{folder}: no model folder there (config.json missing)")
        self.spec = PRMSpec.read(self.folder)
        self.model = self.tok = None

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(self.folder)
        self.model = AutoModelForCausalLM.from_pretrained(self.folder, dtype=torch.float32).eval()
        ids = {}
        for name in ("step_tag", "good", "bad"):
            word = getattr(self.spec, name)
            got = self.tok.encode(word, add_special_tokens=False)
            if len(got) != 1:
                raise ConfigError(f"step_reward: prm:{self.folder}: {name} {word!r} is {len(got)} tokens of its "
                                  "tokenizer; a PRM's tag and labels must be one token each")
            ids[name] = got[0]
        self.tag_id, self.good_id, self.bad_id = ids["step_tag"], ids["good"], ids["bad"]

    def scores(self, question: str, steps: list[str]) -> list[float]:
        """p(good) / (p(good) + p(bad)) at each step's tag."""
        if self.model is None:
            self._load()
        ids = self.tok(prm_input(question, steps, self.spec), return_tensors="pt", add_special_tokens=False).input_ids
        with torch.no_grad():
            logits = self.model(ids).logits[0]  # [L, V]
        at = (ids[0] == self.tag_id).nonzero().flatten()  # [S] the tags' positions
        pair = logits[at][:, [self.good_id, self.bad_id]].float()  # [S, 2]
        return pair.softmax(-1)[:, 0].tolist()

    def __call__(self, completion: str, sample: dict) -> list[tuple[float, int]]:
        steps = split_steps(completion, self.spec.separator) or [(completion.strip(), len(completion.rstrip()))]
        got = self.scores(question_text(sample), [s for s, _ in steps])
        if len(got) != len(steps):  # a step's own text held the tag: the tags no longer mark the steps
            raise ValueError(f"{len(got)} step tags for {len(steps)} steps (a step contains {self.spec.step_tag!r})")
        return [(score, end) for score, (_, end) in zip(got, steps)]
