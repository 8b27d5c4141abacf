"""Iterative GRPO with a reward model that keeps learning (seed 001 Algorithm 1, step 4: "continually
train the reward model with a replay mechanism that includes 10% historical data").

During an iteration (``ref_reset_steps`` steps) every completion the policy samples is labelled by
a verifier reward (``reward_model_verifier``) and kept. At the iteration boundary, where the
reference is reset, the sequence-classification model behind the ``reward_model`` reward takes
``reward_model_train_steps`` optimizer steps on batches of ``reward_model_batch_size`` examples
(pointwise: completions with their labels; pairwise: (better, worse) pairs within a group, a
Bradley-Terry loss) of which ``round(reward_model_replay * batch)`` come from earlier iterations (the
replay buffer) once there are any. The iteration's examples then join the buffer (oldest dropped past
``reward_model_buffer_size``). With ``reward_model_teacher`` the targets are a teacher's logits
(distillation, seed 003 section 3.3) instead of the labels; accuracy is still against the verifier.

The first ``reward_model_heldout`` groups seen are a held-out labelled set, never trained on: the
reward model's accuracy on it is logged before and after each update, with the agreement of the
model (before the update) with the verifier on the iteration's new samples (the drift the replay is
there to catch), the buffer's size and mean age in iterations. The seed finds a reward model most
useful at a moderate accuracy (72-78%).

The model, its optimizer, the buffer, the iteration's examples and the sampling generator are this
component's state (``state_dict``), so a resumed run updates the reward model bit for bit as the
uninterrupted one.
"""

from __future__ import annotations

import copy
import random
from dataclasses import asdict, dataclass

import torch

from grpo import core
from grpo.infra import distributed
from grpo.rewards.reward import RewardOptions
from grpo.rewards import resolve_reward, score_completions


@dataclass
class Example:
    prompt: object  # the task row's prompt (text or chat messages)
    completion: str
    label: float  # the verifier's reward
    group: int  # id of the group (prompt draw) it was sampled in, unique over the run
    iteration: int  # the iteration that sampled it
    teacher: list | None = None  # the teacher's logits [L] (reward_model_teacher)


def replay_count(batch_size: int, *, fraction: float, have_old: bool) -> int:
    """How many of an update batch's examples come from the replay buffer: round(fraction * batch),
    0 while the buffer is empty, and at most batch - 1 so every batch holds new data."""
    return min(batch_size - 1, round(fraction * batch_size)) if have_old and fraction > 0 else 0


def draw(rng: random.Random, pool: list, n: int) -> list:
    """``n`` items of ``pool`` drawn without replacement (with it when the pool is smaller)."""
    if n <= 0 or not pool:
        return []
    return rng.sample(pool, n) if n <= len(pool) else [rng.choice(pool) for _ in range(n)]


@dataclass(frozen=True)
class RewardModelTrainSettings:
    """What the reward model's training reads; each field is the Config field named in its comment."""

    model: str  # reward_model: the sequence-classification model the reward_model reward scores with
    teacher: str  # reward_model_teacher ('': none, the verifier's labels are the targets)
    verifier: str  # reward_model_verifier: the reward that labels the completions
    objective: str  # reward_model_objective: pointwise or pairwise
    train_steps: int  # reward_model_train_steps: optimizer steps per iteration boundary
    batch_size: int  # reward_model_batch_size
    replay: float  # reward_model_replay: share of each batch from earlier iterations
    buffer_size: int  # reward_model_buffer_size
    learning_rate: float  # reward_model_lr
    heldout: int  # reward_model_heldout: the first this many groups are held out
    distill_temperature: float  # reward_model_distill_temperature
    warmup_draws: int  # reward_model_warmup_draws
    group_size: int  # num_generations (G)
    seed: int  # seed
    reward_options: RewardOptions  # how the verifier is resolved (the run's reward_* and judge_* fields)


class RewardModelTrainer:
    """Trains the ``reward_model`` reward's model at iteration boundaries (see the module doc)."""

    def __init__(self, settings: RewardModelTrainSettings, scorer, teacher=None, *,
                 world: distributed.World | None = None):
        s = self.settings = settings
        self.scorer, self.teacher = scorer, teacher
        self.world = world or distributed.World()  # every process observes every process's completions
        self.verifier = {s.verifier: resolve_reward(s.verifier, s.reward_options)}
        self.optimizer = torch.optim.AdamW(self.scorer.model.parameters(), lr=s.learning_rate, weight_decay=0.0)
        self.rng = random.Random(s.seed + 7919)  # the batches' draw; its state is checkpointed
        self.buffer: list[Example] = []
        self.current: list[Example] = []
        self.heldout: list[Example] = []
        self.iteration = 0
        self.groups_seen = 0

    # ---- observation -------------------------------------------------------------------------
    def observe(self, samples: list[dict], texts: list[str]) -> dict:
        """Label the step's completions (G per prompt, grouped) with the verifier and keep them; the
        verifier's mean on them (``rm_verifier_reward``: what the policy optimising the reward model
        really achieves, beside the reward model's own score). On several processes each passes its
        own share and observes every process's (in rank order: the one-process order), so every
        process's reward model trains on the same examples and stays the same model."""
        parts = distributed.gather_objects((samples, texts), self.world)
        samples, texts = [x for p in parts for x in p[0]], [x for p in parts for x in p[1]]
        g = self.settings.group_size
        rows = [s for s in samples for _ in range(g)]
        labels = score_completions(texts, rows, self.verifier).per_reward[self.settings.verifier]
        teacher = self._teacher_logits(rows, texts) if self.teacher is not None else [None] * len(texts)
        for b in range(len(samples)):
            group = [Example(samples[b]["prompt"], texts[b * g + i], float(labels[b * g + i]), self.groups_seen,
                             self.iteration, teacher[b * g + i]) for i in range(g)
                     if not torch.isnan(labels[b * g + i])]  # a failed verifier call labels nothing
            target = self.heldout if self.groups_seen < self.settings.heldout else self.current
            target.extend(group)
            self.groups_seen += 1
        ok = labels[~torch.isnan(labels)]
        return {"rm_verifier_reward": float(ok.mean())} if ok.numel() else {}

    @torch.no_grad()
    def _teacher_logits(self, rows: list[dict], texts: list[str]) -> list[list[float]]:
        return self._logits(self.teacher, [r["prompt"] for r in rows], texts).tolist()

    def _logits(self, scorer, prompts: list, completions: list[str]) -> torch.Tensor:
        """Logits [N, L] of ``scorer``'s model on (prompt, completion) pairs (with gradient if enabled)."""
        texts = [scorer.render(p, c) for p, c in zip(prompts, completions)]
        enc = scorer.tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=scorer.max_length,
                         add_special_tokens=not scorer.templated).to(scorer.device)
        return scorer.model(**enc).logits.float()  # [N, L]

    # ---- the update at an iteration boundary ----------------------------------------------------
    @torch.no_grad()
    def accuracy(self, examples: list[Example]) -> float | None:
        """The model's accuracy against the verifier on ``examples`` (pairwise: on their within-group
        pairs), None when there is nothing to judge."""
        if self.settings.objective == "pairwise":
            return self.ranking_accuracy(examples)
        if not examples:
            return None
        return float(core.pointwise_accuracy(self._scores(examples), torch.tensor([e.label for e in examples])))

    def ranking_accuracy(self, examples: list[Example]) -> float | None:
        """Share of within-group (better, worse) pairs the model orders as the verifier does, whatever
        the objective: a pointwise accuracy is near the majority label's share when most completions are
        wrong, so the ranking is what says whether the model separates them (None: no such pair)."""
        pairs = self._pairs(examples)
        if not pairs:
            return None
        s = self._scores([e for p in pairs for e in p])  # [2P]
        return float(core.pairwise_accuracy(s[0::2], s[1::2]))

    def _heldout_metrics(self, when: str) -> dict:
        """Accuracy and ranking on the held-out set; under pairwise they are one number, scored once."""
        ranking = self.ranking_accuracy(self.heldout)
        accuracy = ranking if self.settings.objective == "pairwise" else self.accuracy(self.heldout)
        return {f"rm_heldout_accuracy_{when}": accuracy, f"rm_heldout_ranking_{when}": ranking}

    def _scores(self, examples: list[Example]) -> torch.Tensor:
        self.scorer.model.eval()
        out = [core.head_scores(self._logits(self.scorer, [e.prompt for e in examples[i:i + 16]],
                                             [e.completion for e in examples[i:i + 16]])).cpu()
               for i in range(0, len(examples), 16)]
        return torch.cat(out)  # [N]

    @staticmethod
    def _pairs(examples: list[Example]) -> list[tuple[Example, Example]]:
        """(better, worse) pairs within each group (core.group_pairs on each group's labels)."""
        groups: dict[int, list[Example]] = {}
        for e in examples:
            groups.setdefault(e.group, []).append(e)
        pairs = []
        for members in groups.values():
            better, worse = core.group_pairs(torch.tensor([[e.label for e in members]]))
            pairs += [(members[i], members[j]) for i, j in zip(better.tolist(), worse.tolist())]
        return pairs

    def update(self) -> dict:
        """Train on this iteration's examples with replay; the buffer takes them; the metrics. Under
        the scorer's lock: asynchronous rollouts' scorer waits for the new weights."""
        with self.scorer.lock:
            return self._update()

    def _update(self) -> dict:
        s = self.settings
        new = self._pairs(self.current) if s.objective == "pairwise" else self.current
        old = self._pairs(self.buffer) if s.objective == "pairwise" else self.buffer
        metrics = {**self._heldout_metrics("before"), "rm_agreement_new": self.accuracy(self.current)}
        losses, replayed, seen = [], 0, 0
        if new:
            self.scorer.model.train()
            for _ in range(s.train_steps):
                n_old = replay_count(s.batch_size, fraction=s.replay, have_old=bool(old))
                batch = draw(self.rng, new, s.batch_size - n_old) + draw(self.rng, old, n_old)
                losses.append(self._step(batch))
                replayed, seen = replayed + n_old, seen + len(batch)
            self.scorer.model.eval()
        self.buffer = (self.buffer + self.current)[-s.buffer_size:]
        self.current = []
        self.iteration += 1
        ages = [self.iteration - e.iteration for e in self.buffer]
        metrics.update(**self._heldout_metrics("after"),
                       rm_loss=sum(losses) / len(losses) if losses else None,
                       rm_replay_share=replayed / seen if seen else 0.0, rm_buffer_size=len(self.buffer),
                       rm_buffer_age_mean=sum(ages) / len(ages) if ages else 0.0, rm_iteration=self.iteration)
        return {k: v for k, v in metrics.items() if v is not None}

    def _step(self, batch: list) -> float:
        pairwise = self.settings.objective == "pairwise"
        examples = [e for p in batch for e in p] if pairwise else batch
        logits = self._logits(self.scorer, [e.prompt for e in examples], [e.completion for e in examples])  # [N, L]
        if self.teacher is not None:  # distillation: the teacher's logits are the targets
            target = torch.tensor([e.teacher for e in examples], dtype=logits.dtype, device=logits.device)  # [N, L]
            loss = core.distillation_loss(logits, target, temperature=self.settings.distill_temperature)
        elif pairwise:
            s = core.head_scores(logits)  # [2P]
            loss = core.bradley_terry_loss(s[0::2], s[1::2])
        else:
            labels = torch.tensor([e.label for e in examples], device=logits.device)
            loss = core.pointwise_loss(core.head_scores(logits), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    # ---- checkpoint -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"model": {k: v.detach().cpu().clone() for k, v in self.scorer.model.state_dict().items()},
                "optimizer": copy.deepcopy(self.optimizer.state_dict()), "rng": self.rng.getstate(),
                "buffer": [asdict(e) for e in self.buffer], "current": [asdict(e) for e in self.current],
                "heldout": [asdict(e) for e in self.heldout], "iteration": self.iteration,
                "groups_seen": self.groups_seen}

    def load_state_dict(self, state: dict) -> None:
        self.scorer.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.setstate(state["rng"])
        self.buffer, self.current, self.heldout = ([Example(**e) for e in state[k]] for k in ("buffer", "current", "heldout"))
        self.iteration, self.groups_seen = state["iteration"], state["groups_seen"]


WARMUP_SEED = 104_729  # the warm-up's prompt draw and sampling keys: apart from the run's (seed)


def warm_up(rm: RewardModelTrainer, collector, *, temperature: float) -> dict:
    """The reward model trained before the policy uses it (``reward_model_warmup_draws``): that many
    draws of the initial policy, from a prompt stream and sampling keys of their own, labelled by the
    verifier and trained on as iteration 0; the update's metrics, with ``rm_warmup_completions``."""
    from grpo.data import PromptSampler

    s = rm.settings
    sampler = PromptSampler(len(collector.train), seed=s.seed + WARMUP_SEED)
    n = 0
    for d in range(s.warmup_draws):
        samples, ro = collector.sample(step=d, temperature=temperature, sampler=sampler, seed=s.seed + WARMUP_SEED)
        rm.observe(samples, ro.texts)
        n += len(ro.texts) * rm.world.size  # every process's share
    return {**rm.update(), "rm_warmup_completions": n}


def make_reward_model_trainer(settings: RewardModelTrainSettings, *, reward=None,
                              world: distributed.World | None = None) -> RewardModelTrainer:
    """The trainer of the run's reward model (its scorer now the one ``reward``, the run's
    RewardModelReward, scores with), with the teacher when one is named, on ``world``'s processes."""
    from grpo.rewards.reward_model import RewardModelScorer

    scorer = RewardModelScorer(settings.model)
    if reward is not None:
        reward.use(scorer)
    teacher = RewardModelScorer(settings.teacher) if settings.teacher else None
    return RewardModelTrainer(settings, scorer, teacher, world=world)
