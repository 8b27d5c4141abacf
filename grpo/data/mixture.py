"""Training on a mixture of tasks: ``task=arithmetic:0.5,calculator:0.3,my.jsonl:0.2`` (or a YAML list).

Each source is a task of its own (a built-in, a file, a hub dataset) with its own rewards, tools,
environment and presets (``SOURCE_SETTINGS``; grpo.train.sources builds them). Its rows are tagged
with the source's label in the ``task`` column (``SOURCE_COLUMN``, the column TRL-form rewards and a
dict ``environment_factory`` route by).

The prompt stream is keyed: the source of the run's k-th prompt is drawn by weight from a uniform
number fixed by (seed, k) alone (splitmix64, Steele et al. 2014), and each source keeps its own
epoch-shuffled (or difficulty) sampler. The stream's state is the count of prompts drawn and each
source sampler's state, so a resumed run draws exactly the prompts the uninterrupted one would have.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from grpo.errors import DataError

SOURCE_COLUMN = "task"  # the row column holding its source's label
SOURCE_SETTINGS = ("rewards", "reward_weights", "tools", "environment_factory", "eval_prompts")
MASK64 = 2**64 - 1
GOLDEN, MIX1, MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # splitmix64's constants


def mix64(z: int) -> int:
    """splitmix64's output function on a 64-bit integer."""
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def keyed_uniform(*parts: int) -> float:
    """A uniform number in (0, 1) fixed by the integers ``parts`` alone (their splitmix64 chain)."""
    z = GOLDEN
    for p in parts:
        z = mix64((z + (p & MASK64) * GOLDEN) & MASK64)
    return ((z >> 11) + 0.5) / 2.0**53


@dataclass(frozen=True)
class Source:
    """One entry of a mixture: the task it loads (``name``), its share of the prompts (``weight``,
    normalised over the mixture) and its own settings (keys of ``SOURCE_SETTINGS``)."""

    name: str
    weight: float = 1.0
    settings: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The source's name in metrics and the ``task`` column: the task name, a file's stem."""
        return self.settings.get("label") or (Path(self.name).stem if Path(self.name).suffix else self.name)


@dataclass(frozen=True)
class SourceSpec:
    """A source with its settings resolved (grpo.config.mixture_settings.source_specs): the task it
    loads, its label and weight, and the rewards, tools, environment and held-out size it runs with."""

    name: str
    label: str
    weight: float
    rewards: str  # comma-separated reward names
    reward_weights: tuple[float, ...] | None
    tools: str
    environment_factory: str
    eval_prompts: int | None

    @property
    def reward_names(self) -> list[str]:
        return [r.strip() for r in self.rewards.split(",") if r.strip()]


def _weight(text, where: str) -> float:
    try:
        w = float(text)
    except (TypeError, ValueError):
        raise DataError(f"task: {where}: weight {text!r} is not a number") from None
    if not math.isfinite(w) or w <= 0:
        raise DataError(f"task: {where}: weight {text!r} must be a positive number")
    return w


def _entry(item, i: int) -> Source:
    """One entry: 'name', 'name:weight', or a mapping {task, weight, label, and SOURCE_SETTINGS}."""
    where = f"source {i + 1}"
    if isinstance(item, dict):
        item = dict(item)
        name = item.pop("task", None) or item.pop("name", None)
        if not isinstance(name, str) or not name.strip():
            raise DataError(f"task: {where}: a mapping needs 'task' (the task to load), got {sorted(item)}")
        weight = _weight(item.pop("weight", 1.0), where)
        unknown = sorted(set(item) - set(SOURCE_SETTINGS) - {"label"})
        if unknown:
            raise DataError(f"task: {where} ({name}): unknown setting(s) {unknown}; a source may set "
                            f"{['weight', 'label', *SOURCE_SETTINGS]}")
        return Source(name.strip(), weight, item)
    text = str(item).strip()
    head, sep, tail = text.rpartition(":")
    if sep and _is_number(tail):
        return Source(head.strip(), _weight(tail, where))
    return Source(text)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def parse_mixture(spec) -> list[Source] | None:
    """The sources of a ``task`` value, or None when it names one task (no mixture). ``spec``: a
    string 'a:0.5,b:0.5', a list (YAML) of such entries or mappings, or that list as JSON text."""
    if isinstance(spec, str) and spec.strip().startswith("["):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as e:
            raise DataError(f"task: {spec[:60]!r} is not a JSON list of sources ({e.msg})") from None
    items = spec if isinstance(spec, list) else [p for p in str(spec).split(",") if p.strip()]
    if not items:
        raise DataError("task: no task given")
    sources = [_entry(item, i) for i, item in enumerate(items)]
    if len(sources) == 1 and not sources[0].settings and sources[0].name == str(items[0]).strip():
        return None  # one task, no weight: a plain run
    labels = [s.label for s in sources]
    repeated = sorted({x for x in labels if labels.count(x) > 1})
    if repeated:
        raise DataError(f"task: source label(s) {repeated} repeated; give each source a distinct 'label'")
    return sources


def mixture_text(spec) -> str:
    """A ``task`` value as the config's text: a list (YAML) becomes its JSON text, a string stays."""
    return json.dumps(spec) if isinstance(spec, list) else spec


def tag_rows(rows: list[dict], label: str) -> list[dict]:
    """Copies of ``rows`` with their source's label in the ``task`` column."""
    return [{**r, SOURCE_COLUMN: label} for r in rows]


class MixtureSampler:
    """Indices into the sources' training rows laid end to end: the source of the run's k-th prompt
    drawn by weight from ``keyed_uniform(seed, k)``, the row from that source's own sampler
    (``samplers``: anything with ``draw(count)``, ``observe(pass_rates)``, ``state_dict()``)."""

    def __init__(self, sizes: list[int], weights: list[float], samplers: list, *, seed: int):
        if not (len(sizes) == len(weights) == len(samplers)) or not sizes:
            raise ValueError("MixtureSampler: one size, weight and sampler per source")
        total = float(sum(weights))
        self.cumulative = [sum(weights[:i + 1]) / total for i in range(len(weights))]
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        self.sizes, self.samplers, self.seed = list(sizes), samplers, seed
        self.drawn = 0  # prompts drawn so far (the stream's position)
        self.pending: list[list[tuple[int, int]]] = []  # draws not yet observed: (source, slot) per prompt

    def source_of(self, k: int) -> int:
        """The source of the run's k-th prompt."""
        u = keyed_uniform(self.seed, k)
        return next((i for i, c in enumerate(self.cumulative) if u < c), len(self.cumulative) - 1)

    def draw(self, count: int) -> list[int]:
        picks = [self.source_of(self.drawn + j) for j in range(count)]
        self.drawn += count
        out: list[int] = [0] * count
        for s in sorted(set(picks)):
            slots = [j for j, p in enumerate(picks) if p == s]
            for j, i in zip(slots, self.samplers[s].draw(len(slots))):
                out[j] = self.offsets[s] + i
        self.pending.append(list(enumerate(picks)))
        return out

    def observe(self, pass_rates: list[float]) -> None:
        """Each prompt's group pass rate of the oldest draw not yet observed, to its source's sampler."""
        if not self.pending:
            return
        picks = [s for _, s in self.pending.pop(0)]
        for s in sorted(set(picks)):
            self.samplers[s].observe([r for r, p in zip(pass_rates, picks) if p == s])

    def state_dict(self) -> dict:
        return {"drawn": self.drawn, "sizes": self.sizes, "seed": self.seed,
                "sources": [s.state_dict() for s in self.samplers],
                "pending": [[list(x) for x in d] for d in list(self.pending)]}  # a copy whole: see difficulty.py

    def load_state_dict(self, state: dict) -> None:
        if state.get("sizes") != self.sizes:
            raise DataError(f"sampler state is for sources of {state.get('sizes')} prompts, this mixture has {self.sizes}")
        self.drawn, self.seed = state["drawn"], state["seed"]
        self.pending = [[tuple(x) for x in d] for d in state.get("pending", [])]
        for sampler, part in zip(self.samplers, state["sources"]):
            sampler.load_state_dict(part)
