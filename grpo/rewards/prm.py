"""A learned process reward model (PRM) as the step reward of process supervision (``supervision=process``,
``step_reward=prm:<folder>``), in Math-Shepherd's form (Wang et al. 2024, arXiv 2312.08935), which
DeepSeekMath's process supervision trains on (Shao et al. 2024, section 4.1.3).

A PRM is a causal language model that reads the question and the solution with a step tag after each
step and scores a step by the probability of the "good" label word against the "bad" one at the tag (at
its last token, where a tokenizer splits it; the label words must be one token each):

    question step_1 <tag>\\n step_2 <tag>\\n ...      score_j = p(good) / (p(good) + p(bad)) after tag j

The folder is a transformers model folder with ``prm.json`` beside its weights naming ``step_tag``,
``good``, ``bad`` and ``separator`` (the rule that splits a completion into steps: a newline by default);
without it, Math-Shepherd's released checkpoints' values (tag "ки", labels "+" and "-"). Each step ends
where its text ends in the completion, which is where its reward lands (rewards.steps.step_tensors).
A run that trains the PRM as it goes (train/process_reward.py) updates the scorer's model under its lock.

Dimension letters: B solutions, L tokens, V vocabulary, S step tags.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from grpo import core
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


def tag_positions(question: str, steps: list[str], spec: PRMSpec) -> list[int]:
    """The character index of each step tag's last character in ``prm_input``'s text."""
    pos, out = len(question) + 1, []
    for step in steps:
        pos += len(step) + 1 + len(spec.step_tag)
        out.append(pos - 1)
        pos += 1  # the newline after the tag
    return out


def label_ids(tok, spec: PRMSpec, *, field: str = "prm.json") -> dict[str, int]:
    """The token ids of the two label words (each must be one token of ``tok``; the tag may be any text), with
    ``tok`` set to pad batches of solutions on the right."""
    if not spec.step_tag or not spec.separator:
        raise ConfigError(f"{field}: step_tag and separator must not be empty")
    if not getattr(tok, "is_fast", False):
        raise ConfigError(f"{field}: a PRM finds its step tags by character offsets: it needs a fast tokenizer")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "right"
    ids = {}
    for name, word in (("good", spec.good), ("bad", spec.bad)):
        got = tok.encode(word, add_special_tokens=False)
        if len(got) != 1:
            raise ConfigError(f"{field}: {name} {word!r} is {len(got)} tokens of the model's tokenizer; one needed")
        ids[name] = got[0]
    return ids


def tag_margins(model, tok, rows: list[dict], spec: PRMSpec, ids: dict) -> torch.Tensor:
    """The step score logits [S] at every step tag of ``rows`` (``prompt`` and ``steps`` each), in order, read
    at the token holding each tag's last character (a tag of several tokens ends there); with gradient if
    enabled."""
    questions = [question_text(r) for r in rows]
    texts = [prm_input(q, r["steps"], spec) for q, r in zip(questions, rows)]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc.pop("offset_mapping")  # [B, L, 2]
    at_row, at_token = [], []
    for b, (q, r) in enumerate(zip(questions, rows)):
        for c in tag_positions(q, r["steps"], spec):
            hit = ((offsets[b, :, 0] <= c) & (offsets[b, :, 1] > c)).nonzero().flatten()
            if hit.numel() == 0:
                raise ValueError(f"no token holds the step tag at character {c} of solution {b}")
            at_row.append(b)
            at_token.append(int(hit[-1]))
    enc = enc.to(model.device)
    logits = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask).logits  # [B, L, V]
    pair = logits[at_row, at_token][:, [ids["good"], ids["bad"]]]  # [S, 2]
    return core.label_word_margin(pair.float())  # [S]


def step_targets(rows: list[dict], key: str) -> torch.Tensor:
    return torch.tensor([v for r in rows for v in r[key]], dtype=torch.float32)  # [S]


def step_loss(model, tok, rows: list[dict], spec: PRMSpec, ids: dict, *, label: str) -> torch.Tensor:
    """Cross-entropy of the good/bad softmax at each tag against the step's soft or hard label."""
    margin = tag_margins(model, tok, rows, spec, ids)  # [S]
    return core.pointwise_loss(margin, step_targets(rows, label).to(margin.device))


def step_accuracy(model, tok, rows: list[dict], spec: PRMSpec, ids: dict) -> float:
    """The share of steps whose predicted p(good) > 0.5 agrees with label >= 0.5 (the soft label)."""
    if not rows:
        return float("nan")
    with torch.no_grad():
        margin = torch.cat([tag_margins(model, tok, rows[i:i + 16], spec, ids) for i in range(0, len(rows), 16)])
    return float(core.pointwise_accuracy(margin.cpu(), step_targets(rows, "soft")))


class PRMScorer:
    """``step_reward=prm:<folder>``: the step reward fn(completion, sample) -> [(score, end_char)], with the
    model loaded on first use and kept; a completion without a step is scored as one step."""

    def __init__(self, folder: str):
        self.folder = Path(folder).expanduser()
        if not (self.folder / "config.json").is_file():
            raise ConfigError(f"step_reward: prm:{folder}: no model folder there (config.json missing)")
        self.spec = PRMSpec.read(self.folder)
        self.model = self.tok = None
        self.lock = threading.RLock()  # scoring and training the model take turns

    def _load(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(self.folder)  # a folder grpo prm train wrote (rewards sit below models)
        device = "cuda" if torch.cuda.is_available() else "cpu"  # where the reward_model reward's model goes
        self.model = AutoModelForCausalLM.from_pretrained(self.folder, dtype=torch.float32).to(device).eval()
        self.ids = label_ids(self.tok, self.spec, field=f"step_reward: prm:{self.folder}")

    def loaded(self) -> PRMScorer:
        """The scorer with its model and tokenizer loaded (they load on first use)."""
        with self.lock:
            if self.model is None:
                self._load()
        return self

    def scores(self, question: str, steps: list[str]) -> list[float]:
        """p(good) / (p(good) + p(bad)) at each step's tag."""
        self.loaded()
        with self.lock, torch.no_grad():
            margin = tag_margins(self.model, self.tok, [{"prompt": question, "steps": steps}], self.spec, self.ids)
        return torch.sigmoid(margin).tolist()

    def outcomes(self, texts: list[str], samples: list[dict], *, batch: int = 16) -> list:
        """Every completion's [(score, end_char)], ``batch`` solutions a forward (under the lock: a run that
        trains the PRM updates it between steps); a batch that fails gives each of its rows the exception."""
        self.loaded()
        split = [self._steps(t) for t in texts]
        rows = [{"prompt": question_text(x), "steps": [t for t, _ in st]} for x, st in zip(samples, split)]
        out: list = []
        for i in range(0, len(rows), batch):
            try:
                with self.lock, torch.no_grad():
                    scores = torch.sigmoid(tag_margins(self.model, self.tok, rows[i:i + batch], self.spec,
                                                       self.ids)).tolist()  # [S] over the batch's steps
            except Exception as e:  # one batch's failure is its completions'
                out += [e] * len(rows[i:i + batch])
                continue
            for st in split[i:i + batch]:
                out.append([(v, end) for v, (_, end) in zip(scores, st)])
                scores = scores[len(st):]
        return out

    def _steps(self, completion: str) -> list[tuple[str, int]]:
        return split_steps(completion, self.spec.separator) or [(completion.strip(), len(completion.rstrip()))]

    def __call__(self, completion: str, sample: dict) -> list[tuple[float, int]]:
        steps = self._steps(completion)
        got = self.scores(question_text(sample), [s for s, _ in steps])
        return [(score, end) for score, (_, end) in zip(got, steps)]
