"""One source for every setting: a settings field that mirrors a Config field either has no default of
its own or the Config's; the Config is read only in the named places; the trainer builds its settings
with one call into the settings module."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from grpo.config import Config
from grpo.train import settings as build

PACKAGE = Path(__file__).resolve().parents[1] / "grpo"
# each part of RunSettings that is None unless a field switches it on, with that switch (and what it needs)
SWITCHED = {"critic": dict(advantage_estimator="gae"), "asynchronous": dict(async_rollouts=True),
            "engine": dict(async_rollouts=True),  # its process's settings
            "reward_model": dict(reward_model_train_steps=1, reward_model="some/model", ref_reset_steps=2),
            "logic_consistency": dict(logic_consistency=True)}


def disagreements(obj, where: str) -> list[str]:
    """Every field (of ``obj`` and of the settings inside it) whose value differs from its own default.
    grpo.core's settings are left out: their defaults are the formula's neutral values (no KL term,
    the batch's own length for Dr. GRPO's L), which every run replaces field by field (a run's
    LossSettings: every field given in train/settings.py, then the knobs' values each step)."""
    out = []
    if type(obj).__module__.startswith("grpo.core"):
        return out
    if isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            out += disagreements(item, f"{where}[{i}]")
        return out
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return out
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        if default is not dataclasses.MISSING and value != default:
            out.append(f"{where}.{f.name} ({type(obj).__name__}): built {value!r}, its default {default!r}")
        out += disagreements(value, f"{where}.{f.name}")
    return out


def _run_settings(**fields) -> build.RunSettings:
    return build.run_settings(Config(**fields), cores=2)


def test_settings_built_from_the_default_config_equal_their_own_defaults():
    """Built from Config(), every settings field with a default holds that default: no mirror of a Config
    field disagrees with it (RewardOptions, TaskLoading, EvalSettings, JudgeSettings, ... included)."""
    found = disagreements(_run_settings(), "settings")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("part", sorted(SWITCHED))
def test_a_part_switched_on_holds_its_defaults_too(part):
    built = getattr(_run_settings(**SWITCHED[part]), part)
    assert built is not None
    # a field the switch itself sets (reward_model="some/model") holds that value, not the default
    found = [d for d in disagreements(built, part) if not any(f".{key} (" in d for key in SWITCHED[part])]
    assert not found, "\n".join(found)


def test_the_disagreement_check_sees_one():
    @dataclasses.dataclass(frozen=True)
    class Inner:
        timeout: float = 0.0

    @dataclasses.dataclass(frozen=True)
    class Outer:
        inner: Inner
        parts: tuple

    assert disagreements(Outer(Inner(10.0), (Inner(0.0),)), "s") == ["s.inner.timeout (Inner): built 10.0, its default 0.0"]
    assert disagreements(Outer(Inner(), (Inner(3.0),)), "s") == ["s.parts[0].timeout (Inner): built 3.0, its default 0.0"]


# ---- where the Config is read --------------------------------------------------------------------------------
READERS = ("config/", "train/settings.py", "train/trainer.py", "cli.py", "api.py", "commands/")  # commands: the CLI's
FIELDS = {f.name for f in dataclasses.fields(Config)}


def config_reads(source: str) -> list[str]:
    """``x.field`` reads of a Config field off a name that holds a config (cfg, config, c, self.cfg, ...)."""
    found = []
    for n in ast.walk(ast.parse(source)):
        if not (isinstance(n, ast.Attribute) and n.attr in FIELDS):
            continue
        v = n.value
        holder = v.id if isinstance(v, ast.Name) else (
            f"{v.value.id}.{v.attr}" if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) else None)
        if holder and ("cfg" in holder or holder in ("config", "c", "self.config")):
            found.append(f"{n.lineno}: {holder}.{n.attr}")
    return found


def test_no_config_field_is_read_outside_the_named_places():
    found = {}
    for p in sorted(PACKAGE.rglob("*.py")):
        rel = p.relative_to(PACKAGE).as_posix()
        if not rel.startswith(READERS) and (reads := config_reads(p.read_text())):
            found[rel] = reads
    assert not found, f"Config fields read outside {READERS}: {found}"


def test_the_read_check_sees_a_read():
    assert config_reads("def f(cfg):\n    return cfg.seed\n") == ["2: cfg.seed"]
    assert config_reads("class A:\n    def f(self):\n        return self.cfg.max_steps\n") == ["3: self.cfg.max_steps"]
    assert config_reads("def f(t):\n    return t.cfg.model\n") == ["2: t.cfg.model"]
    assert config_reads("def f(model):\n    return model.config.hidden_size\n") == []
    assert config_reads("def f(settings):\n    return settings.seed\n") == []


# ---- the trainer's one call ----------------------------------------------------------------------------------
def settings_calls(source: str, function: str) -> list[str]:
    """Calls inside ``function`` (a method of any class) of names imported from grpo.train.settings or
    of attributes of that module imported whole."""
    tree = ast.parse(source)
    names, modules = set(), set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module == "grpo.train.settings":
            names |= {a.asname or a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module == "grpo.train":
            modules |= {a.asname or a.name for a in n.names if a.name == "settings"}
        elif isinstance(n, ast.Import):
            modules |= {a.asname for a in n.names if a.name == "grpo.train.settings" and a.asname}
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function)
    calls = []
    for n in ast.walk(fn):
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Name) and f.id in names:
                calls.append(f.id)
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in modules:
                calls.append(f"{f.value.id}.{f.attr}")
    return calls


def test_the_trainer_builds_its_settings_with_one_call():
    calls = settings_calls((PACKAGE / "train" / "trainer.py").read_text(), "__init__")
    assert calls == ["run_settings"], calls


def test_the_call_count_sees_several():
    src = ("from grpo.train import settings as build\nfrom grpo.train.settings import run_settings\n"
           "class T:\n    def __init__(self, cfg):\n        run_settings(cfg)\n        build.knob_settings(cfg)\n")
    assert sorted(settings_calls(src, "__init__")) == ["build.knob_settings", "run_settings"]


def test_the_sft_settings_built_from_the_default_config_equal_their_own_defaults(tmp_path):
    from grpo.cli import _sft_model_settings, _sft_settings

    found = disagreements(_sft_model_settings(Config()), "model") + disagreements(_sft_settings(Config(), tmp_path), "sft")
    assert not found, "\n".join(found)
