"""The package's layers (docs/architecture.md): each may import only its own layer and the ones below
it; grpo.core imports nothing else of the package; no function outside grpo/train takes the trainer."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "grpo"
# lowest first; a module may import from its own rank or any lower one, and the low layers only from
# what docs/architecture.md's table lets them
LAYERS = [("errors",), ("core",), ("infra",), ("models", "data", "control"), ("rewards",), ("rollout",), ("agent",), ("config",),
          ("eval", "audit"), ("train",), ("tools", "serve", "api"), ("cli", "__main__", "__init__")]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
ALLOWED = {"errors": set(), "core": {"core"}, "infra": {"errors", "infra"},
           "models": {"errors", "core", "infra", "models"}, "data": {"errors", "data"},
           "control": {"errors", "core", "control"},
           "rewards": {"errors", "core", "infra", "rewards"},
           "rollout": {"errors", "core", "infra", "models", "rollout"},
           "agent": {"errors", "core", "infra", "models", "data", "rewards", "rollout", "agent"}}


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
            assert other == "core", f"{path}:{line}: grpo.core imports grpo.{other}; the core imports nothing else"
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


def test_the_checks_see_a_violation(tmp_path):
    """The import walker finds function-level imports and the trainer check finds a parameter."""
    src = tmp_path / "m.py"
    src.write_text("def f(trainer):\n    from grpo.train.trainer import Trainer\n    import grpo.cli\n")
    assert _imports(src) == [(2, "train"), (3, "cli")]
    assert _takes_trainer(ast.parse(src.read_text()).body[0])
