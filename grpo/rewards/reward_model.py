"""A learned reward: any Hugging Face sequence-classification model scores (prompt, completion) pairs.

The reward ``reward_model`` is *batched*: it takes all N completions of a step at once
(``fn(completions, samples) -> list[float]``: grpo.rewards.forms' batch form) and runs the model in
batches of ``batch_size``. The pair is rendered with the reward model's chat template when it has one
(user prompt, assistant completion), else as ``prompt + "\\n" + completion``. The score is the logit
of a one-label head, or the probability of the last label of a multi-label head (label 1 = "good").
The model comes from the config field ``reward_model`` (a folder or hub id) and the transform of its
raw scores from ``reward_model_transform``: resolving the reward builds a ``RewardModelReward`` with
both, which loads the model on first use, or scores with the model a run trains (``use``).
"""

from __future__ import annotations

import threading
import warnings

import torch

from grpo.core.stability import transform_scores

NO_MODEL = "reward_model: set the config field reward_model to a sequence-classification model (folder or hub id)"
SPREAD_WARNING = 20.0  # seed 003 section 4.1: a max - min above this on the first batch needs a transform


class RewardModelScorer:
    """Loads a sequence-classification model once; ``score(prompts, completions)`` -> [N] floats."""

    def __init__(self, path: str, *, batch_size: int = 16, max_length: int = 1024, device: str | None = None):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            self.tok = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForSequenceClassification.from_pretrained(path)
        except (OSError, ValueError) as e:
            raise ValueError(f"reward_model: cannot load a sequence-classification model from {path!r}: {e}") from None
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device).eval()
        self.lock = threading.RLock()  # scoring and training the model take turns (``score``)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        if self.model.config.pad_token_id is None:  # the head reads the last non-pad token
            self.model.config.pad_token_id = self.tok.pad_token_id
        self.tok.padding_side = "right"
        self.tok.truncation_side = "left"  # past max_length, drop the start of the prompt, never the completion's end
        # a chat template writes its own special tokens; plain text needs the tokenizer's ([CLS] ... [SEP])
        self.templated = bool(getattr(self.tok, "chat_template", None))
        self.batch_size, self.max_length, self.path = batch_size, max_length, path

    def render(self, prompt, completion: str) -> str:
        messages = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        if self.templated:
            return self.tok.apply_chat_template(messages + [{"role": "assistant", "content": completion}],
                                                tokenize=False)
        return "\n".join(m["content"] for m in messages) + "\n" + completion

    @torch.no_grad()
    def score(self, prompts: list, completions: list[str]) -> list[float]:
        """Under ``lock``: a run that trains the model (train/reward_model.py) updates it under the same
        lock, so asynchronous rollouts' scorer never reads weights half-stepped."""
        texts = [self.render(p, c) for p, c in zip(prompts, completions)]
        with self.lock:
            return self._score(texts)

    def _score(self, texts: list[str]) -> list[float]:
        out = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tok(texts[i:i + self.batch_size], return_tensors="pt", padding=True, truncation=True,
                           max_length=self.max_length, add_special_tokens=not self.templated).to(self.device)
            logits = self.model(**enc).logits.float()  # [n, labels]
            s = logits[:, 0] if logits.shape[1] == 1 else logits.softmax(-1)[:, -1]  # [n]
            out.extend(s.cpu().tolist())
        return out


class RewardModelReward:
    """Scores of a sequence-classification reward model for each (sample['prompt'], completion), in
    batches, mapped by ``reward_model_transform`` (none, sigmoid, group_minmax). The first batch whose
    raw scores span more than 20 warns: such scores let one reward dominate the group normalisation."""

    def __init__(self, path: str, *, transform: str = "none"):
        self.path, self.transform = path, transform
        self._scorer: RewardModelScorer | None = None
        self._checked = False  # the first batch's spread has been looked at
        self._lock = threading.Lock()

    @property
    def scorer(self) -> RewardModelScorer:
        """The model behind the reward: loaded from ``path`` on first use, unless a run's is in ``use``."""
        with self._lock:
            if self._scorer is None:
                if not self.path:
                    raise ValueError(NO_MODEL)
                self._scorer = RewardModelScorer(self.path)
            return self._scorer

    def use(self, scorer: RewardModelScorer) -> None:
        """Score with ``scorer`` from now on (the reward model a run trains as it goes)."""
        with self._lock:
            self._scorer = scorer

    def __call__(self, completions: list[str], samples: list[dict]) -> list[float]:
        raw = self.scorer.score([s["prompt"] for s in samples], completions)
        with self._lock:
            first = not self._checked and bool(raw)
            self._checked = self._checked or bool(raw)
        return apply_transform(raw, samples, self.transform, warn=first)


def no_reward_model(completions: list[str], samples: list[dict]) -> list[float]:
    """The ``reward_model`` reward before its model is set: an error saying how to set it."""
    raise ValueError(NO_MODEL)


def _groups(samples: list[dict]) -> torch.Tensor:
    """Group index [N] of each completion: consecutive completions of the same prompt form a group
    (the trainer scores a step's G completions of each prompt back to back)."""
    idx, last = [], object()
    for s in samples:
        key = repr(s.get("prompt"))
        idx.append(idx[-1] + (key != last) if idx else 0)
        last = key
    return torch.tensor(idx, dtype=torch.long)


def apply_transform(raw: list[float], samples: list[dict], mode: str, *, warn: bool) -> list[float]:
    """Map the raw scores with ``mode`` (grpo.core.stability.transform_scores); ``warn`` (the first
    batch): warn when their spread is above SPREAD_WARNING."""
    scores = torch.tensor(raw, dtype=torch.float64)  # [N]
    if warn and scores.numel():
        spread = float(scores.max() - scores.min())
        if spread > SPREAD_WARNING:
            warnings.warn(f"reward_model: the first batch's raw scores span {spread:.1f} (min {float(scores.min()):.2f}, "
                          f"max {float(scores.max()):.2f}), above {SPREAD_WARNING:g}: un-normalised advantages will be "
                          f"dominated by it (seed 003 section 4.1); reward_model_transform={mode}"
                          + ("; consider sigmoid or group_minmax" if mode == "none" else ""), stacklevel=2)
    return transform_scores(scores, _groups(samples), mode=mode).tolist()
