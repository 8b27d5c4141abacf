"""A learned reward: any Hugging Face sequence-classification model scores (prompt, completion) pairs.

The reward ``reward_model`` is *batched*: it takes all N completions of a step at once
(``fn(completions, samples) -> list[float]``, marked by ``fn.batched = True``) and runs the model in
batches of ``batch_size``. The pair is rendered with the reward model's chat template when it has one
(user prompt, assistant completion), else as ``prompt + "\\n" + completion``. The score is the logit
of a one-label head, or the probability of the last label of a multi-label head (label 1 = "good").
The model comes from the config field ``reward_model`` (a folder or hub id); the trainer hands it to
``set_reward_model`` before the run starts.
"""

from __future__ import annotations

import threading

import torch


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
        texts = [self.render(p, c) for p, c in zip(prompts, completions)]
        out = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tok(texts[i:i + self.batch_size], return_tensors="pt", padding=True, truncation=True,
                           max_length=self.max_length, add_special_tokens=not self.templated).to(self.device)
            logits = self.model(**enc).logits.float()  # [n, labels]
            s = logits[:, 0] if logits.shape[1] == 1 else logits.softmax(-1)[:, -1]  # [n]
            out.extend(s.cpu().tolist())
        return out


_scorer: RewardModelScorer | None = None
_path: str = ""
_lock = threading.Lock()


def set_reward_model(path: str, **kw) -> None:
    """Choose the model behind the ``reward_model`` reward (loaded on first use)."""
    global _path, _scorer
    with _lock:
        if path != _path:
            _path, _scorer = path, None
        if kw and _path:
            _scorer = RewardModelScorer(_path, **kw)


def install_scorer(scorer: RewardModelScorer) -> None:
    """Make ``scorer`` the one behind the ``reward_model`` reward (a model trained during the run)."""
    global _path, _scorer
    with _lock:
        _path, _scorer = scorer.path, scorer


def reward_model_reward(completions: list[str], samples: list[dict]) -> list[float]:
    """Scores of the configured reward model for each (sample['prompt'], completion), batched."""
    global _scorer
    with _lock:
        if not _path:
            raise ValueError("reward_model: set the config field reward_model to a sequence-classification "
                             "model (folder or hub id)")
        if _scorer is None:
            _scorer = RewardModelScorer(_path)
        scorer = _scorer
    return scorer.score([s["prompt"] for s in samples], completions)


reward_model_reward.batched = True
