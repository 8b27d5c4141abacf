"""The package's layers (docs/architecture.md): each may import only its own layer and the ones below
it; grpo.core imports nothing else of the package; no function outside grpo/train takes the trainer;
the run's Config reaches components only as their settings."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "grpo"
# lowest first; a module may import from its own rank or any lower one, and the low layers only from
# what docs/architecture.md's table lets them
LAYERS = [("errors", "registry"), ("core",), ("infra",), ("models", "data", "pathtracking"), ("rewards",), ("rollout",), ("agent",), ("config",),
          ("eval", "audit"), ("train",), ("commands", "serve", "api", "sft", "cluster"), ("cli", "__main__", "__init__", "docs")]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
ALLOWED = {"errors": set(), "registry": {"errors"}, "core": {"core", "registry"}, "infra": {"errors", "registry", "infra"},
           "models": {"errors", "registry", "core", "infra", "models"}, "data": {"errors", "registry", "data"},
           "pathtracking": {"errors", "registry", "core", "pathtracking"},
           "rewards": {"errors", "registry", "core", "infra", "rewards"},
           "rollout": {"errors", "registry", "core", "infra", "models", "rollout"},
           "agent": {"errors", "registry", "core", "infra", "models", "data", "rewards", "rollout", "agent"}}


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _layer(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level grpo part) of every grpo import in the file, function-level ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "grpo":
                subs = [parts[1]] if len(parts) > 1 else [a.name for a in node.names]
                out += [(node.lineno, s) for s in subs]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[1]) for a in node.names
                    if a.name.startswith("grpo.") and "." in a.name]
    return out


def test_every_module_has_a_layer():
    assert {_layer(p) for p in _modules()} <= set(RANK), "add the new package to LAYERS and docs/architecture.md"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    mine = _layer(path)
    for line, other in _imports(path):
        assert other in RANK, f"{path}:{line} imports grpo.{other}, which has no layer"
        if mine == "core":
            assert other in ("core", "registry"), (f"{path}:{line}: grpo.core imports grpo.{other}; the core imports "
                                                   f"nothing else but the registry helper")
        assert RANK[other] <= RANK[mine], (f"{path}:{line}: grpo.{mine} (layer {RANK[mine]}) imports grpo.{other} "
                                           f"(layer {RANK[other]}), a higher layer")
        if mine in ALLOWED:
            assert other in ALLOWED[mine], (f"{path}:{line}: grpo.{mine} may import only {sorted(ALLOWED[mine])} "
                                            f"(docs/architecture.md), not grpo.{other}")


def test_no_relative_imports():
    """Relative imports would slip past the layer check: the package spells every import out."""
    found = [f"{p.relative_to(PACKAGE)}:{n.lineno}" for p in _modules() for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.ImportFrom) and n.level > 0]
    assert not found, found


def _takes_trainer(fn: ast.AST) -> bool:
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    return any(a.arg == "trainer" or (a.annotation is not None and "Trainer" in ast.unparse(a.annotation))
               for a in args)


def test_no_function_outside_train_takes_the_trainer():
    found = [f"{p.relative_to(PACKAGE)}:{fn.lineno} {fn.name}" for p in _modules() if _layer(p) != "train"
             for fn in ast.walk(ast.parse(p.read_text())) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
             and _takes_trainer(fn)]
    assert not found, f"functions that take the trainer outside grpo/train: {found}"


# where a Config may be a parameter: the config package, the trainer and the builders of its components'
# settings (task_of among them), the command line, its commands, the Python API and `grpo train
# launcher=ray`'s driver, which hands the Config to each trainer rank's Trainer as `grpo train` does
READS_CONFIG = {"config", "train/trainer.py", "train/settings.py", "cli.py", "commands", "api.py", "cluster/driver.py"}
CONFIG_NAMES = {"cfg", "config"}  # what a Config held or read is called


def _names_config(annotation: ast.AST | None) -> bool:
    """The annotation is Config (``Config | None``, a string one included)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    return any(isinstance(n, ast.Name) and n.id == "Config" for n in ast.walk(annotation))


def _takes_config(fn: ast.AST) -> bool:
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    return any(a.arg == "cfg" or _names_config(a.annotation) for a in args)


def _constructor_reads_config(fn: ast.AST) -> bool:
    """A constructor (``__init__``, ``from_config``) that keeps a config (``self.cfg = ...``) or reads
    fields of one handed in (``cfg.x``, ``config.x`` of a parameter, ``self.cfg.x``)."""
    if fn.name not in ("__init__", "__post_init__", "from_config"):
        return False
    if fn.name == "from_config":
        return True
    params = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs} & CONFIG_NAMES
    for n in ast.walk(fn):
        if isinstance(n, ast.Attribute) and n.attr in CONFIG_NAMES and isinstance(n.value, ast.Name) \
                and n.value.id == "self":
            return True  # self.cfg / self.config, kept or read
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in params:
            return True  # cfg.x / config.x of a config handed in (not a model's config read locally)
    return False


def _config_readers(package: Path) -> list[str]:
    def allowed(p: Path) -> bool:
        rel = p.relative_to(package)
        return rel.parts[0] in READS_CONFIG or rel.as_posix() in READS_CONFIG

    return [f"{p.relative_to(package)}:{fn.lineno} {fn.name}" for p in sorted(package.rglob("*.py")) if not allowed(p)
            for fn in ast.walk(ast.parse(p.read_text())) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (_takes_config(fn) or _constructor_reads_config(fn))]


def test_only_the_trainer_the_settings_and_the_commands_take_a_config():
    """Every other function and constructor takes the settings it reads (train/settings.py builds them):
    no parameter named cfg or annotated Config, no constructor that keeps a config or reads its fields."""
    found = _config_readers(PACKAGE)
    assert not found, f"functions that take the Config outside {sorted(READS_CONFIG)}: {found}"


def test_the_checks_see_a_violation(tmp_path):
    """The import walker finds function-level imports and the trainer and Config checks find a parameter."""
    src = tmp_path / "m.py"
    src.write_text("def f(trainer):\n    from grpo.train.trainer import Trainer\n    import grpo.cli\n")
    assert _imports(src) == [(2, "train"), (3, "cli")]
    assert _takes_trainer(ast.parse(src.read_text()).body[0])
    assert _takes_config(ast.parse("def f(x, *, cfg): pass").body[0])
    assert _takes_config(ast.parse("def f(settings: 'Config'): pass").body[0])
    assert _takes_config(ast.parse("def f(args: Config | None = None): pass").body[0])
    assert not _takes_config(ast.parse("def f(settings: UpdateSettings): pass").body[0])
    init = "class C:\n    def __init__(self, {}):\n        {}\n"
    assert _constructor_reads_config(ast.parse(init.format("run", "self.cfg = run")).body[0].body[0])
    assert _constructor_reads_config(ast.parse(init.format("config", "self.n = config.seed")).body[0].body[0])
    assert not _constructor_reads_config(ast.parse(init.format("settings", "self.n = settings.seed")).body[0].body[0])


def _module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = ("grpo",) + path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (function-level imports included): ``from a.b import
    c`` points at the module a.b.c where c is one, else at a.b. A package's ``__init__`` is the module
    named by the package."""
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("grpo"):
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    out.add(sub if sub in files else node.module)
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name.startswith("grpo")}
        graph[name] = {m for m in out if m in files and m != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules, the first repeated at the end), or None when the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle():
    """No module of the package imports (even inside a function) a module that imports it back,
    directly or through others: each role sits in its own module."""
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_sees_a_cycle(tmp_path):
    """A function-level import that closes a loop is a cycle; a chain is not."""
    pkg = tmp_path / "grpo"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from grpo.sub.b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from grpo.sub import c\n")
    (pkg / "sub" / "c.py").write_text("import grpo.errors\n")
    assert find_cycle(import_graph(pkg)) is None
    (pkg / "sub" / "c.py").write_text("def g():\n    from grpo.sub.a import x\n")
    assert find_cycle(import_graph(pkg)) == ["grpo.sub.a", "grpo.sub.b", "grpo.sub.c", "grpo.sub.a"]


def public_classes(root: Path = PACKAGE) -> dict[str, list[str]]:
    """Public class name -> the modules that define a class of that name (module level)."""
    found: dict[str, list[str]] = {}
    for p in sorted(root.rglob("*.py")):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found.setdefault(node.name, []).append(_module_name(p, root))
    return found


def test_no_two_public_classes_share_a_name():
    """A class name says which class it is: no two modules define public classes of the same name."""
    shared = {name: mods for name, mods in public_classes().items() if len(mods) > 1}
    assert not shared, f"public classes defined under one name in several modules: {shared}"


def test_the_name_check_sees_a_shared_name(tmp_path):
    pkg = tmp_path / "grpo"
    (pkg / "a").mkdir(parents=True)
    (pkg / "a" / "x.py").write_text("class Engine:\n    pass\nclass _Private:\n    pass\n")
    (pkg / "b.py").write_text("class Engine:\n    pass\nclass _Private:\n    pass\n")
    found = public_classes(pkg)
    assert found["Engine"] == ["grpo.a.x", "grpo.b"] and "_Private" not in found


# ---- what a run's start imports -------------------------------------------------------------------------------
HEAVY_AT_START = ("peft", "bitsandbytes")  # seconds of imports (peft pulls bitsandbytes, which pulls torch's inductor)


def started_imports(code: str) -> list[str]:
    """Which of HEAVY_AT_START a fresh interpreter holds after running ``code``."""
    import subprocess
    import sys

    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY_AT_START!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    return out.stdout.split()


def test_a_run_without_lora_or_qlora_starts_without_importing_peft_or_bitsandbytes():
    """`grpo train` imports the CLI and the trainer; a run that needs neither LoRA nor 4-bit weights does
    not pay for their imports (about 2 s a process, at every start of every torchrun process)."""
    assert started_imports("import grpo.cli, grpo.train.trainer, grpo.train.collect") == []


def test_the_import_check_sees_a_heavy_import():
    assert started_imports("import peft") == ["peft", "bitsandbytes"]
