"""docs/architecture.md names only what exists: every module, class, function, constant, Config field,
registry entry and command it puts in backticks resolves in the package as it is."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import keyword
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "grpo"
PAGE = ROOT / "docs" / "architecture.md"
IDENT = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*")


class Package:
    """What the package defines: its modules (as paths and dotted names), each module's top-level names,
    each class's members (its bases' included, by name), and the strings its code spells (metric keys,
    file names of a run folder, environment ids)."""

    def __init__(self, root: Path = PACKAGE):
        self.paths: set[str] = set()
        self.modules: dict[str, set[str]] = {}  # dotted module (no "grpo.") -> its top-level names
        self.members: dict[str, set[str]] = {}  # class name -> its members
        self.bases: dict[str, list[str]] = {}
        self.strings: set[str] = set()
        for p in sorted(root.rglob("*.py")):
            rel = p.relative_to(root)
            self.paths |= {f"grpo/{rel.as_posix()}", rel.as_posix(), f"{rel.parent.as_posix()}/", rel.name}
            dotted = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            tree = ast.parse(p.read_text())
            self.modules[dotted] = top = set()
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    top.add(node.name)
                    if isinstance(node, ast.ClassDef):
                        self.members.setdefault(node.name, set()).update(_class_members(node))
                        self.bases.setdefault(node.name, []).extend(ast.unparse(b).split(".")[-1] for b in node.bases)
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    top |= {t.id for t in targets if isinstance(t, ast.Name)}
                elif isinstance(node, ast.ImportFrom):
                    top |= {a.asname or a.name for a in node.names}
            self.strings |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                             and 0 < len(n.value) < 60 and " " not in n.value}
        self.top = set().union(*self.modules.values())

    def member(self, cls: str, name: str, seen: frozenset = frozenset()) -> bool:
        """``name`` is an attribute of class ``cls`` or of one of its bases (found by name)."""
        if name in self.members.get(cls, ()):
            return True
        return any(self.member(b, name, seen | {cls}) for b in self.bases.get(cls, ()) if b not in seen)

    def resolves(self, dotted: str) -> bool:
        """A module, a module's name (and a class member after it), or ``Class.member``."""
        parts = dotted.removeprefix("grpo.").split(".")
        for i in range(len(parts), 0, -1):  # the longest module prefix
            module = ".".join(parts[:i])
            if module in self.modules:
                rest = parts[i:]
                if not rest:
                    return True
                if rest[0] in self.modules[module] and (len(rest) == 1 or self.member(rest[0], rest[1])):
                    return True
                return self.attribute(module, rest)  # a lazy name (a module's __getattr__), an instance's attribute
        if len(parts) == 1:
            return parts[0] in self.top or parts[0] in self.strings or any(parts[0] in m for m in self.members.values())
        if len(parts) == 2 and parts[0] in self.members:
            return self.member(parts[0], parts[1])
        return any(self.attribute(module, parts) for module, top in self.modules.items() if parts[0] in top)

    @staticmethod
    def attribute(module: str, parts: list[str]) -> bool:
        """``parts`` resolve as attributes of the imported module (an instance's, a registry's: ``X.register``)."""
        obj = importlib.import_module(f"grpo.{module}" if module else "grpo")
        try:
            for name in parts:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True


def _class_members(node: ast.ClassDef) -> set[str]:
    out = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            out.add(item.target.id)
        elif isinstance(item, ast.Assign):
            out |= {t.id for t in item.targets if isinstance(t, ast.Name)}
    for fn in node.body:  # attributes set in methods (self.x = ...)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out |= {t.attr for t in ast.walk(fn) if isinstance(t, ast.Attribute) and isinstance(t.ctx, ast.Store)
                    and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return out


def importable(dotted: str) -> bool:
    """A builtin, or a module (and attributes of it) of the standard library or a dependency."""
    parts = dotted.split(".")
    if len(parts) == 1 and hasattr(builtins, dotted):
        return True
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def known_names() -> set[str]:
    """Names that are not the package's code: Config fields, commands, registry entries and registries."""
    from grpo.cli import COMMANDS
    from grpo.config import Config
    from grpo.docs import find_registries

    names = {f.name for f in dataclasses.fields(Config)} | {f"grpo {c}" for c in COMMANDS} | {"grpo"}
    for found in find_registries():
        names |= set(found.entries) | {found.attr}
    return names


def backticked(text: str) -> list[str]:
    """The page's inline code spans (fenced blocks left out)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.findall(r"`([^`\n]+)`", prose)


def unresolved(spans: list[str], known: set[str], package: Package, root: Path = ROOT) -> list[str]:
    """Spans that name something (a path, an identifier, a call's callee, ``grpo <command>``) that does
    not exist. A span holding a placeholder (<...>), a key=value or an expression names nothing to look up."""
    out = []
    for span in spans:
        s = span.strip()
        if s.startswith("grpo ") and re.fullmatch(r"grpo [\w-]+.*", s):
            word = s.split()[1]
            if not word.startswith("-") and f"grpo {word}" not in known:
                out.append(span)
            continue
        callee = re.match(rf"^({IDENT.pattern})\(.*\)$", s)
        if callee:
            s = callee.group(1)
        if "/" in s and re.fullmatch(r"[\w./-]+", s):
            if s not in package.paths and s.rstrip("/") not in package.strings and not (root / s).exists():
                out.append(span)
            continue
        if s in package.paths:
            continue
        if not IDENT.fullmatch(s) or keyword.iskeyword(s):
            continue  # an expression, a value, a placeholder, a Python keyword
        if s in known or package.resolves(s):
            continue
        first = s.removeprefix("grpo.").split(".")[0]
        if not s.startswith("grpo.") and first not in package.top and first not in package.modules and importable(s):
            continue
        out.append(span)
    return out


def tree_block(text: str) -> str:
    """The fenced annotated tree under "## The package"."""
    section = text.split("## The package", 1)[1].split("\n## ", 1)[0]
    return re.search(r"^```\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL).group(1)


def test_every_backticked_name_in_the_architecture_page_resolves():
    missing = unresolved(backticked(PAGE.read_text()), known_names(), Package())
    assert not missing, f"docs/architecture.md names what does not exist: {sorted(set(missing))}"


def test_the_package_tree_names_every_module_and_only_modules():
    """Every module of the package (a subpackage's __init__.py aside) is in the page's annotated tree,
    under its folder, and every file the tree names exists there."""
    tree, folder, named = tree_block(PAGE.read_text()), "", set()
    for line in tree.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0].endswith("/"):
            depth = (len(line) - len(line.lstrip())) // 2
            folder = "" if words[0] == "grpo/" else "/".join(folder.split("/")[:depth - 1] + [words[0].rstrip("/")])
            folder = folder.strip("/")
            words = words[1:]
        named |= {f"{folder}/{w}".lstrip("/") for w in words if re.fullmatch(r"\w+\.py", w)}
    modules = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
               if p.name != "__init__.py" or p.parent == PACKAGE}
    assert not modules - named, f"modules missing from the tree: {sorted(modules - named)}"
    assert not named - modules, f"the tree names files that do not exist: {sorted(named - modules)}"


def test_the_resolver_sees_a_missing_name():
    known, package = known_names(), Package()
    wrong = ["RowStopper", "Engine.decode(...)", "rollout/base.py", "grpo frobnicate", "Trainer.sample", "Knobs.admit",
             "grpo.config.validate_sft.judge_settings", "GRPOTrainer.build_state"]
    assert unresolved(wrong, known, package) == wrong
    assert unresolved(["run_settings(cfg, cores=2)", "train/settings.py", "RunSettings.with_max_steps",
                       "grpo.config.judge.judge_settings", "ServeEngine.admit", "rollout_engine", "grpo train", "gae",
                       "x = 1", "<name>_x", "dataclasses.replace", "KeyError"], known, package) == []
