"""Iterative GRPO with a process reward model that keeps learning (DeepSeekMath, arXiv 2402.03300, Algorithm 1
step 4, for the PRM of its process supervision, section 4.1.3: "continually train the reward model with a
replay mechanism that includes 10% historical data").

During an iteration (``ref_reset_steps`` steps) the policy's completions are kept. At the iteration
boundary ``prm_label_solutions`` of them are labelled Math-Shepherd's way (arXiv 2312.08935) with the
current policy: from each step's end ``prm_label_continuations`` completions are sampled and the step's
label is the share (soft) or any (hard, ``prm_label``) of them that ``reward_model_verifier`` accepts; the
last step's label is the solution's own verdict (train/prm_labels.label_solutions). The PRM behind
``step_reward=prm:<folder>`` then takes ``reward_model_train_steps`` optimizer steps on batches of
``reward_model_batch_size`` labelled solutions, of which ``round(reward_model_replay * batch)`` come from
earlier iterations (the replay buffer, oldest dropped past ``reward_model_buffer_size`` solutions) once
there are any. The first ``reward_model_heldout`` labelled solutions are a held-out set, never trained on,
on which the step accuracy is logged before and after each update.

On several processes every process observes every process's completions; the first labels them and
gives the labels to the others, and each trains the same PRM on the same batches. The model, its
optimizer, the buffers and the batch draw are this component's state (``state_dict``), so a resumed
run trains the PRM as the uninterrupted one.
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import torch

from grpo.infra import distributed
from grpo.rewards import resolve_reward
from grpo.rewards.prm import PRMScorer, step_accuracy, step_loss
from grpo.rewards.reward import RewardOptions
from grpo.train.prm_labels import label_solutions
from grpo.train.reward_model import draw, replay_count

LABEL_SEED = 7_368_787  # the continuations' sampling keys: apart from the run's own (seed)


@dataclass(frozen=True)
class ProcessRewardTrainSettings:
    """What the PRM's training reads; each field is the Config field named in its comment."""

    train_steps: int  # reward_model_train_steps: optimizer steps per iteration boundary
    batch_size: int  # reward_model_batch_size: labelled solutions per step
    replay: float  # reward_model_replay: share of each batch from earlier iterations
    buffer_size: int  # reward_model_buffer_size: labelled solutions the replay buffer keeps
    learning_rate: float  # reward_model_lr
    heldout: int  # reward_model_heldout: the first this many labelled solutions are held out
    verifier: str  # reward_model_verifier: the reward whose full credit makes a continuation correct
    solutions: int  # prm_label_solutions: completions labelled at each boundary
    continuations: int  # prm_label_continuations: completions sampled from each step's end
    label: str  # prm_label: soft (the share) or hard (any)
    rows_per_call: int  # prompts_per_step x num_generations: the most continuations one generate call samples
    seed: int  # seed
    reward_options: RewardOptions  # how the verifier is resolved


class ProcessRewardTrainer:
    """Trains the ``step_reward=prm:`` scorer's model at iteration boundaries (see the module doc)."""

    def __init__(self, settings: ProcessRewardTrainSettings, scorer: PRMScorer, *,
                 world: distributed.World | None = None):
        self.settings, self.scorer = settings, scorer.loaded()
        self.world = world or distributed.World()
        self.verifier = resolve_reward(settings.verifier, settings.reward_options)
        self.optimizer = torch.optim.AdamW(self.scorer.model.parameters(), lr=settings.learning_rate, weight_decay=0.0)
        self.rng = random.Random(settings.seed + LABEL_SEED)  # which completions are labelled; the batches
        self.kept: list[tuple[dict, str]] = []  # the iteration's (task row, completion)
        self.buffer: list[dict] = []
        self.heldout: list[dict] = []
        self.iteration = 0

    def observe(self, samples: list[dict], texts: list[str], *, group_size: int) -> None:
        """Keep the step's completions (G per prompt, grouped), every process's, in rank order."""
        parts = distributed.gather_objects((samples, texts), self.world)
        for part_samples, part_texts in parts:
            self.kept += [(part_samples[i // group_size], t) for i, t in enumerate(part_texts)]

    def update(self, engine, sampling, render) -> dict:
        """Label some of the iteration's completions with the current policy (``engine`` with ``sampling``;
        ``render(row)``: a row's prompt text), train with replay; the metrics. Training holds the scorer's lock."""
        chosen = self.rng.sample(self.kept, min(self.settings.solutions, len(self.kept)))
        # every process samples alike (an engine synced across processes needs each one's generate calls)
        # and all keep the first's labels, so every process trains the same PRM on the same rows
        rows = distributed.broadcast_object(self._label(chosen, engine, sampling, render), self.world)
        room = max(0, self.settings.heldout - len(self.heldout))
        self.heldout += rows[:room]
        new = rows[room:]
        with self.scorer.lock:
            return self._train(new, [v for r in rows for v in r["soft"]])

    def _label(self, chosen: list[tuple[dict, str]], engine, sampling, render) -> list[dict]:
        s = self.settings
        return label_solutions(engine, [t for _, t in chosen], [r for r, _ in chosen], [render(r) for r, _ in chosen],
                               self.verifier, sampling, continuations=s.continuations,
                               separator=self.scorer.spec.separator, keys=(s.seed + LABEL_SEED, self.iteration),
                               rows_per_call=s.rows_per_call)

    def _train(self, new: list[dict], labels: list[float]) -> dict:
        s, sc = self.settings, self.scorer
        metrics = {"prm_heldout_step_accuracy_before": self._accuracy(), "prm_labelled_solutions": len(new),
                   "prm_label_mean": sum(labels) / len(labels) if labels else None}
        losses, replayed, seen = [], 0, 0
        if new:
            sc.model.train()
            for _ in range(s.train_steps):
                n_old = replay_count(s.batch_size, fraction=s.replay, have_old=bool(self.buffer))
                batch = draw(self.rng, new, s.batch_size - n_old) + draw(self.rng, self.buffer, n_old)
                loss = step_loss(sc.model, sc.tok, batch, sc.spec, sc.ids, label=s.label)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                losses.append(float(loss.detach()))
                replayed, seen = replayed + n_old, seen + len(batch)
            sc.model.eval()
        kept = [{k: v for k, v in r.items() if k != "continuations"} for r in new]  # the texts: not trained on
        self.buffer = (self.buffer + [dict(r, iteration=self.iteration) for r in kept])[-s.buffer_size:]
        self.kept = []
        self.iteration += 1
        metrics.update(prm_heldout_step_accuracy_after=self._accuracy(),
                       prm_loss=sum(losses) / len(losses) if losses else None,
                       prm_replay_share=replayed / seen if seen else 0.0, prm_buffer_size=len(self.buffer),
                       prm_iteration=self.iteration)
        return {k: v for k, v in metrics.items() if v is not None}

    def _accuracy(self) -> float | None:
        if not self.heldout:
            return None
        sc = self.scorer
        sc.model.eval()
        return step_accuracy(sc.model, sc.tok, self.heldout, sc.spec, sc.ids)

    def state_dict(self) -> dict:
        return {"model": {k: v.detach().cpu().clone() for k, v in self.scorer.model.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict()), "rng": self.rng.getstate(),
                "kept": copy.deepcopy(self.kept), "buffer": copy.deepcopy(self.buffer),
                "heldout": copy.deepcopy(self.heldout), "iteration": self.iteration}

    def load_state_dict(self, state: dict) -> None:
        self.scorer.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.setstate(state["rng"])
        self.kept = [tuple(k) for k in state["kept"]]
        self.buffer, self.heldout, self.iteration = state["buffer"], state["heldout"], state["iteration"]
