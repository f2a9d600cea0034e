"""Library internals only in dew/compat.py: a private name (a module or attribute starting with
``_``) imported or read from one of dew's libraries anywhere else in dew/ or hydra_plugins/ fails
here, listed by file and line. dew/compat.py holds each such place with the version it was checked
against, and tests/test_compat.py checks each is still there."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = {
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax",
    "hydra",
    "omegaconf",
    "submitit",
    "qwix",
    "grain",
    "wandb",
    "optuna",
}
PLUGINS = ("hydra_plugins.hydra_submitit_launcher",)
"""Other libraries' Hydra plugins, in the ``hydra_plugins`` namespace dew's own plugins share."""


def library(module: str) -> bool:
    """Whether ``module`` is one of the libraries', not dew's."""
    return module.split(".")[0] in LIBRARIES or any(module == p or module.startswith(p + ".") for p in PLUGINS)


ALLOWED = {"dew/compat.py"}
IN_STRINGS = re.compile(rf"\b(?:import|from)\s+(?:{'|'.join(sorted(LIBRARIES))})(?:\.\w+)*\._\w+")
"""A private module named in code that runs elsewhere (``python -c "import jaxlib._jax"``)."""


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root(node: ast.expr) -> ast.expr:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _imports(tree: ast.AST) -> Iterator[tuple[int, str, str | None]]:
    """(line, what is private or "", the name bound) for each import from a library."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if library(alias.name):
                    bad = alias.name if any(map(private, parts)) else ""
                    yield node.lineno, bad, alias.asname or parts[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if library(node.module):
                for alias in node.names:
                    bad = f"{node.module}.{alias.name}" if any(map(private, [*parts, alias.name])) else ""
                    yield node.lineno, bad, alias.asname or alias.name


def _super_calls(tree: ast.AST, names: set[str]) -> Iterator[tuple[int, str]]:
    """``super()._x`` in a class that derives from a library's class: a private method of that library."""
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and any(
            isinstance(_root(b), ast.Name) and _root(b).id in names for b in cls.bases
        ):
            for node in ast.walk(cls):
                if (
                    isinstance(node, ast.Attribute)
                    and private(node.attr)
                    and isinstance(node.value, ast.Call)
                    and isinstance(node.value.func, ast.Name)
                    and node.value.func.id == "super"
                ):
                    yield node.lineno, f"super().{node.attr} in {cls.name}({', '.join(map(ast.unparse, cls.bases))})"


def findings(path: Path, root: Path = ROOT) -> list[str]:
    """Every private library name ``path`` reaches, as ``path:line: name`` (relative to ``root``)."""
    tree = ast.parse(path.read_text(), str(path))
    found, names = [], set()
    for line, bad, bound in _imports(tree):
        names.add(bound)
        if bad:
            found.append((line, f"import {bad}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            base = _root(node)
            if isinstance(base, ast.Name) and base.id in names:
                found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and private(node.args[1].value)
            and isinstance(_root(node.args[0]), ast.Name)
            and _root(node.args[0]).id in names
        ):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [(node.lineno, f"{m.group(0)!r} in a string") for m in IN_STRINGS.finditer(node.value)]
    found += list(_super_calls(tree, names))
    rel = path.relative_to(root).as_posix()
    return [f"{rel}:{line}: {what}" for line, what in sorted(set(found))]


def sources() -> list[Path]:
    return sorted(
        p
        for d in ("dew", "hydra_plugins")
        for p in (ROOT / d).rglob("*.py")
        if p.relative_to(ROOT).as_posix() not in ALLOWED
    )


def test_library_internals_only_in_compat():
    found = [f for path in sources() for f in findings(path)]
    assert not found, (
        "library internals outside dew/compat.py (move each into a named function there, "
        "with the version checked, and a test in tests/test_compat.py):\n  " + "\n  ".join(found)
    )


def test_the_check_finds_each_kind(tmp_path: Path):
    """Each way of reaching a private name is found; public names and dew's own private ones are not."""
    code = """
import jax._src.xla_bridge
import jaxlib._jax as xla
from hydra._internal.utils import get_args_parser
from submitit.core.job_environment import JobEnvironment
from orbax.checkpoint import _src
from hydra_plugins.hydra_submitit_launcher._core import launch
from hydra_plugins.dew_launchers import _private_of_dew
import qwix
import optax as ox
from dew import compat

JobEnvironment._usr_sig()
getattr(ox, "_private")
qwix.QtProvider._init_rule
CHILD = "import jaxlib._jax as xla"


class Rule(qwix.PtqProvider):
    def _init_rule(self, rule):
        return super()._init_rule(rule)


def fine(x):
    ox.adam(1e-3)._replace(); compat._private; x._anything; jax.__version__; super()._own()
"""
    (tmp_path / "m.py").write_text(code)
    found = [f.split(": ", 1)[1] for f in findings(tmp_path / "m.py", tmp_path)]
    assert found == [
        "import jax._src.xla_bridge",
        "import jaxlib._jax",
        "import hydra._internal.utils.get_args_parser",
        "import orbax.checkpoint._src",
        "import hydra_plugins.hydra_submitit_launcher._core.launch",
        "JobEnvironment._usr_sig",
        "getattr(ox, '_private')",
        "qwix.QtProvider._init_rule",
        "'import jaxlib._jax' in a string",
        "super()._init_rule in Rule(qwix.PtqProvider)",
    ], found
