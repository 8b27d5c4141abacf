"""grpo.registry: the one mechanism every extension point uses."""

import pytest

from grpo.errors import ConfigError, UnknownName
from grpo.registry import Registry


def test_register_and_look_up():
    reg = Registry("widget", field="widget")

    def a():
        """The first widget.

        More about it."""

    def b():
        """The second."""

    reg.register("a", a)
    reg.register(b)
    with pytest.raises(TypeError, match="needs the value"):
        reg.register("e")  # not a decorator: one idiom, the call below the definition

    class C:
        name = "c"
        doc = "Described by its doc attribute."

    reg.register(C)
    reg.register("d", {"x": 1}, doc="A plain value, described where it is registered.")
    assert list(reg) == ["a", "b", "c", "d"] == reg.names()  # registration order
    assert reg["a"] is a and reg["c"] is C and reg["d"] == {"x": 1} and len(reg) == 4
    assert "a" in reg and "z" not in reg and [] not in reg  # an unhashable name is simply absent
    assert reg.get("z") is None and dict(reg.items())["b"] is b  # a read-only mapping
    assert [(e.name, e.doc) for e in reg.entries()] == [
        ("a", "The first widget.\n\nMore about it."), ("b", "The second."), ("c", "Described by its doc attribute."),
        ("d", "A plain value, described where it is registered.")]


def test_an_unknown_name_names_the_kind_and_field_and_lists_the_valid_ones():
    reg = Registry("serving engine", field="--engine")
    reg.register("fast", 1)
    reg.register("hf", 2)
    with pytest.raises(UnknownName) as err:
        reg["vllm"]
    assert str(err.value) == "--engine: unknown serving engine 'vllm'; valid: fast, hf"
    assert isinstance(err.value, ConfigError) and isinstance(err.value, KeyError)  # the CLI prints it in one line
    with pytest.raises(ConfigError, match=r"^rollout: unknown serving engine 'x'; valid: auto, fast, hf$"):
        reg.lookup("x", field="rollout", also=("auto",))
    with pytest.raises(UnknownName, match="^unknown serving engine"):
        Registry("serving engine").lookup("x")  # no field: the message starts with what is unknown


def test_a_name_is_taken_once_unless_replaced():
    reg = Registry("preset")
    reg.register("p", 1)
    with pytest.raises(ValueError, match="'p' is already registered"):
        reg.register("p", 2)
    reg.register("p", 3, replace=True)
    assert reg["p"] == 3 and reg.unregister("p") == 3 and "p" not in reg
    with pytest.raises(ValueError, match="non-empty name"):
        reg.register(object())  # nothing to name it by


REGISTRIES = {  # module -> the registries it defines: every extension point of the package
    "grpo.core.advantages": ["ESTIMATORS"], "grpo.core.policy_losses": ["POLICY_LOSSES"],
    "grpo.rollout.engine": ["ROLLOUT_ENGINES"], "grpo.rollout.tuning": ["PRODUCTS"], "grpo.serve.engines": ["SERVE_ENGINES"],
    "grpo.serve.scheme": ["COMPLETENESS_CHECKS"], "grpo.agent.tools": ["BUILTIN_TOOLS"],
    "grpo.agent.formats": ["CALL_FORMATS"], "grpo.rewards.builtin": ["REWARDS"], "grpo.rewards.steps": ["STEP_REWARDS"],
    "grpo.config.presets": ["MONITOR_PRESETS", "LR_PRESETS", "RECIPES"], "grpo.infra.trackers": ["TRACKERS"], "grpo.data.tasks": ["TASKS"], "grpo.commands.compare": ["METHODS"],
    "grpo.pathtracking.agents": ["AGENTS"], "grpo.pathtracking.references": ["REFERENCES"],
    "grpo.pathtracking.commands": ["SUBCOMMANDS"], "grpo.cli": ["COMMANDS"],
}


def _defined_registries(package) -> dict[str, list[str]]:
    """module -> the module-level names bound to ``Registry(...)``, found by reading the source."""
    import ast

    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        module = ".".join(("grpo",) + path.relative_to(package).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "Registry":
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found.setdefault(module, []).extend(t.id for t in targets)
    return found


def test_the_list_of_registries_is_every_registry_in_the_package():
    """Each ``Registry`` the package defines is listed above, so the checks below cover it; the
    registries of the issue's review (estimators, losses, engines, tools, rewards, tasks, presets)
    are among them."""
    from pathlib import Path

    assert _defined_registries(Path(__file__).resolve().parents[1] / "grpo") == REGISTRIES


def _all_registries() -> dict[str, Registry]:
    import importlib

    import grpo.rollout  # noqa: F401  (registers every engine)
    found = {}
    for module, names in REGISTRIES.items():
        mod = importlib.import_module(module)
        for name in names:
            found[f"{module}.{name}"] = getattr(mod, name)
    return found


def test_every_extension_point_is_a_registry_whose_entries_are_described():
    """One mechanism: each registry is a Registry, and every entry has a description (what the
    reference pages print), from its docstring or where it is registered."""
    registries = _all_registries()
    assert all(isinstance(r, Registry) for r in registries.values()), registries
    undescribed = [f"{where}[{e.name!r}]" for where, r in registries.items() for e in r.entries() if not e.doc]
    assert not undescribed, f"entries without a description: {undescribed}"
    assert {"arithmetic", "gsm8k", "code", "code_hard", "calculator"} <= set(registries["grpo.data.tasks.TASKS"])


CAPABILITIES = {"batch", "batched", "valid", "startup_check", "own_deadline", "reads_final_answer", "build"}


def capability_reads(source: str) -> list[tuple[int, str]]:
    """(line, attribute) of each ``getattr``/``hasattr`` whose attribute name is a reward capability."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in CAPABILITIES):
            found.append((node.lineno, node.args[1].value))
    return found


def test_no_reward_capability_is_read_by_getattr():
    """A reward declares its capabilities on its ``Reward`` (grpo.rewards.reward); nothing in the
    package looks for them as optional attributes of a function."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "grpo"
    reads = [f"{p.relative_to(package.parent)}:{line} {attr}" for p in sorted(package.rglob("*.py"))
             for line, attr in capability_reads(p.read_text())]
    assert not reads, f"reward capabilities read by getattr/hasattr: {reads}"
    # the check sees the forms it forbids
    assert capability_reads("check = getattr(fn, 'startup_check', None)\nif hasattr(f, 'valid'): pass\n") == [
        (1, "startup_check"), (2, "valid")]


def test_a_new_task_needs_no_special_case(tmp_path):
    """A task registered in one place is loadable by name, carries its rewards and presets into the
    config, and is named by an unknown-task error; nothing else is touched."""
    from grpo.config import Config
    from grpo.config.presets import apply_task_preset
    from grpo.data.tasks import TASKS, BuiltinTask, Task, load_task, task_rewards

    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(6)]
    TASKS.register(BuiltinTask("echo", lambda o: Task("echo", rows[o.eval_size:], rows[:o.eval_size]),
                               rewards="format,length", presets={"max_steps": 2}, doc="Echo rows."))
    try:
        task = load_task("echo", eval_size=2)
        assert task.train == rows[2:] and task.eval == rows[:2]
        assert task_rewards("echo") == "format,length" and task_rewards("some/dataset") == "numeric"
        cfg = Config(task="echo")
        apply_task_preset(cfg)
        assert cfg.rewards == "format,length" and cfg.max_steps == 2
        cfg = Config(task="echo", rewards="numeric", max_steps=7)
        apply_task_preset(cfg)
        assert cfg.rewards == "numeric" and cfg.max_steps == 7  # an explicit setting wins
    finally:
        TASKS.unregister("echo")
    assert "echo" not in TASKS


def module_state(source: str) -> list[tuple[int, str]]:
    """(line, what) of each sign of module-level mutable state: a ``global`` statement, or a module-level
    name bound to an empty container (a dict, list or set that the module fills as it runs)."""
    import ast

    tree = ast.parse(source)
    found = [(n.lineno, "global " + ", ".join(n.names)) for n in ast.walk(tree) if isinstance(n, ast.Global)]
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        empty = (isinstance(value, (ast.Dict, ast.List, ast.Set)) and not getattr(value, "keys", None)
                 and not getattr(value, "elts", None)) or (
            isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
            and value.func.id in ("dict", "list", "set", "defaultdict") and not value.args and not value.keywords)
        if empty:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found.append((node.lineno, ", ".join(ast.unparse(t) for t in targets)))
    return found


def test_no_module_level_mutable_state_outside_process_caches():
    """Settings reach a component through its constructor; what a module keeps for the process is a
    ``ProcessCache`` (grpo.infra.process_cache) that says what it holds and when it goes stale."""
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "grpo"
    found = [f"{p.relative_to(package.parent)}:{line} {what}" for p in sorted(package.rglob("*.py"))
             for line, what in module_state(p.read_text())]
    assert not found, f"module-level mutable state: {found}"
    assert module_state("_seen: dict = {}\n_x = []\nOPS = {1: 2}\ndef f():\n    global _x\n") == [
        (5, "global _x"), (1, "_seen"), (2, "_x")]
