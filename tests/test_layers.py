"""The import graph between dew's modules has no circles, but the ones named here.

The imports are read with ``ast`` from every module of ``dew/``: module-level imports and imports
inside functions alike (a function-level import is still a dependency: it runs the first time the
function does). Imports under ``if TYPE_CHECKING:`` are not arrows: they never run, so they cost
nothing at run time and tie nothing at import time; they name the types a signature uses
(``test_no_circles_even_through_types`` counts them as well, and finds no circle either). An import
of ``dew.a.b`` is an arrow to ``dew.a.b`` alone, not to the package ``dew.a`` whose ``__init__``
Python runs first: a package file only hands names on.
``importlib.import_module("dew.a.b")`` with the name written out is an import too; the names a
registry imports by itself (its built-in members, from strings) are not arrows: a registry does not
depend on its members, they depend on it.

``ONE_ARROW_UP`` is the import the design accepts for good: the contract's ``RunConfig.train`` calls
the trainer. ``ALLOWED_CIRCLES`` lists the circles still to break, each with what ties it: the list
can only shrink, because the test fails as well when a listed circle no longer exists.

The contract package ``dew.contract`` is a leaf: it imports nothing from dew outside it but the arrow up,
and no JAX (``JAX_LIBRARIES``), at any level, but the one call ``JAX_IN_THE_CONTRACT`` names.

The commands are on top (``LAYERS``): ``dew.cli`` holds the command mains, and nothing outside it
imports it (not dew's other packages, not its Hydra plugins); below it ``dew.inference`` (restore,
evaluate, sample, export), below that the engine, ``dew.training``. ``dew.commandline`` (exit
statuses, the console, dew's config in Hydra, the override parser) is what the commands, inference and
the launchers share: it imports none of them, and of ``dew.launching`` only the leaves
``COMMANDLINE_READS``.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

DEW = pathlib.Path(__file__).resolve().parents[1] / "dew"

ONE_ARROW_UP = {
    ("dew.contract.config", "dew.training.trainer"): "RunConfig.train trains the run it describes (the API contract)",
}
"""Arrows left out of the graph for good, each with why."""

ALLOWED_CIRCLES: dict[frozenset[str], str] = {}
"""Circles still to break (the modules of each), with the names that tie them."""

CONTRACT = "dew.contract"
"""The contract package: a leaf."""

JAX_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "orbax", "qwix", "grain", "chex", "tensorstore")
"""What "no JAX" means for the contract: JAX and the libraries built on it."""

JAX_IN_THE_CONTRACT = {
    ("dew.contract.config", "flax"): "ModelConfig.build() returns the Flax module the contract's build() "
    "makes, from a seed (nnx.Rngs(seed)); importing the module, and every "
    "other method, uses no JAX",
}
"""Imports of a JAX library inside the contract package's functions, each with why; the list can only
shrink."""


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(DEW.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, pathlib.Path]:
    return {module_name(p): p for p in sorted(DEW.rglob("*.py"))}


def imported(node: ast.Import | ast.ImportFrom, here: str, is_package: bool) -> list[str]:
    """The modules one import statement names: ``from a import b`` names ``a.b`` too, which is a
    module when ``b`` is one (resolved against the known modules by the caller)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # a relative import: from the package that holds this module
        package = here.split(".") if is_package else here.split(".")[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def dynamic(node: ast.Call) -> list[str]:
    """The module an ``import_module("dew....")`` call names, written out."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    first = node.args[0] if node.args else None
    if called in ("import_module", "__import__") and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return [first.value]
    return []


def type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            inside |= {id(n) for child in node.body for n in ast.walk(child)}
    return inside


def graph(*, typed: bool = False) -> dict[str, set[str]]:
    """Module -> the dew modules it imports (anywhere in its text but under ``if TYPE_CHECKING:``,
    or there too when ``typed``), less ``ONE_ARROW_UP``."""
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skipped = set() if typed else type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import | ast.ImportFrom):
                targets = imported(node, name, path.name == "__init__.py")
            elif isinstance(node, ast.Call):
                targets = dynamic(node)
            else:
                continue
            edges[name] |= {t for t in targets if t in known and t != name}
    for source, target in ONE_ARROW_UP:
        edges[source].discard(target)
    return edges


def imports_of(module: str) -> set[str]:
    """Every module ``module``'s text imports, at any level, dew's or not, but under ``if
    TYPE_CHECKING:`` (which never runs: a signature of the contract may name a type of the engine)."""
    path = modules()[module]
    names = set()
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= set(imported(node, module, path.name == "__init__.py"))
        elif isinstance(node, ast.Call):
            names |= set(dynamic(node))
    return names


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def ties(circle: frozenset[str], edges: dict[str, set[str]]) -> str:
    return "; ".join(f"{a} -> {b}" for a in sorted(circle) for b in sorted(edges[a] & circle))


LAYERS = ("dew.cli", "dew.inference", "dew.training")
"""Packages from the top down: each imports none above it."""

COMMANDLINE_READS = {"dew.launching.naming", "dew.launching.interrupts", "dew.launching.gc_settings"}
"""The modules of ``dew.launching`` that ``dew.commandline`` imports: leaves of the launching package
(a sweep's directory names, the first Ctrl-C, the garbage collector), none of which imports dew's
commands, inference or launchers."""

CLI_LINES = 2500
"""The most lines ``dew/cli/`` may hold: a main per command, each a parser in front of the packages below."""

TRAINER_LINES = 500
"""The most lines ``dew/training/trainer.py`` may hold: the loop read top to bottom, its parts in the
modules beside it (the assembly, the hooks, the saves, the watchdog)."""

PLUGINS = DEW.parent / "hydra_plugins"
"""dew's Hydra plugins (the launchers, the sweeper, the search path), outside ``dew/``."""


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_graph_is_read() -> None:
    """The reader sees imports at every level: a test that read nothing would pass vacuously."""
    edges = graph()
    assert "dew.training.trainer" in edges["dew.cli.train"]  # module level
    assert "dew.training.trainer" not in edges["dew.contract.config"]  # the one arrow up, left out
    assert "dew.contract.models" in edges["dew.contract.config"]  # inside a method
    assert "dew.contract.config" not in edges["dew.objectives.flow_matching"]  # under TYPE_CHECKING only: no arrow
    call = ast.parse('importlib.import_module("dew.recipe")').body[0].value
    assert isinstance(call, ast.Call) and dynamic(call) == ["dew.recipe"]  # an import by its name
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]


def test_no_import_circles_but_the_allowed() -> None:
    edges = graph()
    found = set(circles(edges))
    new = [c for c in found if c not in ALLOWED_CIRCLES]
    assert not new, "import circles between dew modules (break them; see docs/architecture.md):\n" + "\n".join(
        f"{sorted(c)}: {ties(c, edges)}" for c in new
    )
    gone = [sorted(c) for c in ALLOWED_CIRCLES if c not in found]
    assert not gone, f"these allowed circles no longer exist: strike them from ALLOWED_CIRCLES: {gone}"


@pytest.mark.parametrize("source", sorted(ONE_ARROW_UP))
def test_the_arrow_up_exists(source: tuple[str, str]) -> None:
    """An accepted arrow that the code no longer has is struck from the list."""
    known = modules()
    tree = ast.parse(known[source[0]].read_text())
    names = {
        t for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom) for t in imported(n, source[0], False)
    }
    assert source[1] in names


READER_REACHES_WRITER: dict[tuple[str, str], str] = {}
"""Imports from the run directory's readers (``dew.runs``) into its writer (``dew.training``), each
with why; the list can only shrink."""


def between(edges: dict[str, set[str]], source: str, target: str) -> set[tuple[str, str]]:
    return {(a, b) for a, bs in edges.items() if a.startswith(source) for b in bs if b.startswith(target)}


def test_the_run_directory_format_is_a_leaf() -> None:
    """``dew.contract.rundir`` is what the writer and the readers share; it depends on neither (nor
    on JAX: it imports nothing but the standard library)."""
    names = imports_of("dew.contract.rundir")
    assert all(n.split(".")[0] in sys.stdlib_module_names for n in names), names


def test_writer_and_readers_meet_in_the_format() -> None:
    """The run directory's writer (``dew.training``) and its readers (``dew.runs``) take what they
    share from ``dew.contract.rundir``, never from each other."""
    edges = graph()
    assert between(edges, "dew.training.", "dew.runs.") == set()
    assert between(edges, "dew.runs.", "dew.training.") == set(READER_REACHES_WRITER)
    assert {"dew.contract.rundir"} <= edges["dew.contract.journal"] & edges["dew.training.reporting.tracker"]


def test_the_contract_package_is_a_leaf() -> None:
    """``dew.contract`` imports nothing from dew outside it (but ``RunConfig.train``'s arrow up) and no
    JAX library (but ``JAX_IN_THE_CONTRACT``), at any level of any of its modules."""
    contract = [m for m in modules() if m == CONTRACT or m.startswith(CONTRACT + ".")]
    assert {"dew.contract.config", "dew.contract.typed", "dew.contract.registry", "dew.contract.rundir"} <= set(
        contract
    )
    known = modules()
    outside, jax_, used = [], [], set()
    for module in contract:
        for name in imports_of(module):
            top = name.split(".")[0]
            if name not in known and name.rpartition(".")[0] in known:
                continue  # ``from dew.a import b`` where b is a name of dew.a, not a module
            if top == "dew" and name != "dew" and not name.startswith(CONTRACT):
                if (module, name) not in ONE_ARROW_UP:
                    outside.append(f"{module} -> {name}")
            elif top in JAX_LIBRARIES:
                if (module, top) in JAX_IN_THE_CONTRACT:
                    used.add((module, top))
                else:
                    jax_.append(f"{module} -> {name}")
    assert not outside, f"the contract package imports dew modules outside it: {outside}"
    assert not jax_, f"the contract package imports JAX libraries: {jax_}"
    assert used == set(JAX_IN_THE_CONTRACT), "strike the imports no longer made from JAX_IN_THE_CONTRACT"


def test_the_contract_and_every_registry_read_without_jax() -> None:
    """In a fresh interpreter: importing every module of the contract and reading every registry
    (which imports dew's built-in parts) loads no JAX library."""
    contract = sorted(m for m in modules() if m.startswith(CONTRACT + "."))
    code = "\n".join(
        [
            "import importlib, sys",
            *[f"importlib.import_module({m!r})" for m in contract],
            "import dew.config",
            "from dew.contract import data, models, objectives, schedules",
            "names = [sorted(r) for r in (data.datasets, models.architectures, objectives.objectives, schedules.schedules)]",  # noqa: E501
            "assert all(names), names",
            "from dew.config import RunConfig",
            "RunConfig.from_dict(RunConfig().to_dict())",
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {JAX_LIBRARIES!r}))",
        ]
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_no_circles_even_through_types() -> None:
    """Counted with the imports under ``if TYPE_CHECKING:`` too (a type a signature names is a
    dependency of its reader, if not of the interpreter), the graph has no circle at all:
    ``ONE_ARROW_UP`` is still the one arrow the design accepts. A type both ends of a circle need
    goes below both (``dew.training.state``, ``dew.data.fields``, ``dew.models.rope_scaling``), or a
    Protocol goes in the lower end (``dew.contract.schedules.WarmupDecay``)."""
    edges = graph(typed=True)
    assert "dew.contract.config" in edges["dew.objectives.flow_matching"]  # under TYPE_CHECKING: counted here
    found = circles(edges)
    assert not found, "import circles through types:\n" + "\n".join(f"{sorted(c)}: {ties(c, edges)}" for c in found)


def plugin_imports() -> dict[str, set[str]]:
    """Each of dew's Hydra plugin files -> the dew modules it names in an import, at any level."""
    out: dict[str, set[str]] = {}
    for path in sorted(PLUGINS.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        names = {
            t
            for n in ast.walk(tree)
            if isinstance(n, ast.Import | ast.ImportFrom)
            for t in imported(n, "hydra_plugins", True)
            if t.split(".")[0] == "dew"
        }
        out[str(path.relative_to(DEW.parent))] = names
    return out


def test_nothing_outside_the_commands_imports_them() -> None:
    """``dew.cli`` holds the command mains: no module of dew outside it, and none of dew's Hydra
    plugins, imports it (the commands' shared code is ``dew.commandline``'s)."""
    edges = graph()
    assert edges["dew.cli.eval"], "the graph reads the commands' imports"
    outside = sorted(
        f"{a} -> {b}" for a, bs in edges.items() if not within(a, "dew.cli") for b in bs if within(b, "dew.cli")
    )
    plugins = sorted(f"{p} -> {n}" for p, names in plugin_imports().items() for n in names if within(n, "dew.cli"))
    assert plugin_imports(), "the plugins' imports are read"
    assert not outside + plugins, f"modules outside dew.cli import it: {outside + plugins}"


def test_the_commands_are_above_inference_above_the_engine() -> None:
    """``LAYERS`` from the top down: a package imports none above it."""
    edges = graph()
    for depth, package in enumerate(LAYERS):
        above = LAYERS[:depth]
        up = sorted(
            f"{a} -> {b}"
            for a, bs in edges.items()
            if within(a, package)
            for b in bs
            if any(within(b, p) for p in above)
        )
        assert not up, f"{package} imports a package above it ({', '.join(above)}): {up}"
    assert between(edges, "dew.inference.", "dew.training.")  # the arrows read go down, and exist


def test_what_the_commands_share_is_below_them() -> None:
    """``dew.commandline`` imports no command, no inference, no launcher: of ``dew.launching``, only
    ``COMMANDLINE_READS``; and the launchers import no inference."""
    edges = graph()
    up = sorted(
        f"{a} -> {b}"
        for a, bs in edges.items()
        if within(a, "dew.commandline")
        for b in bs
        if within(b, "dew.cli")
        or within(b, "dew.inference")
        or (within(b, "dew.launching") and b not in COMMANDLINE_READS)
    )
    assert not up, f"dew.commandline imports what stands on it: {up}"
    read = {b for a, bs in edges.items() if within(a, "dew.commandline") for b in bs if within(b, "dew.launching")}
    assert read == COMMANDLINE_READS, f"strike from COMMANDLINE_READS what dew.commandline no longer imports: {read}"
    assert not between(edges, "dew.launching.", "dew.inference."), "a launcher imports inference"


def test_the_commands_package_holds_the_mains_alone() -> None:
    """Every module of ``dew/cli/`` is a console script's (pyproject.toml's ``[project.scripts]``),
    and all of them together stay short: what a command does is below it."""
    import tomllib

    scripts = tomllib.loads((DEW.parent / "pyproject.toml").read_text())["project"]["scripts"]
    mains = {target.split(":")[0] for target in scripts.values()}
    files = sorted((DEW / "cli").glob("*.py"))
    modules = {module_name(p) for p in files if p.name != "__init__.py"}
    assert modules and modules <= mains, f"modules of dew.cli that are no command's main: {sorted(modules - mains)}"
    lines = sum(len(p.read_text().splitlines()) for p in files)
    assert lines <= CLI_LINES, f"dew/cli holds {lines} lines (at most {CLI_LINES}): move what is not a main below it"


def test_the_training_loop_reads_on_a_few_pages() -> None:
    """``dew/training/trainer.py`` stays the loop: what happens around the steps is a module beside it."""
    lines = len((DEW / "training" / "trainer.py").read_text().splitlines())
    assert lines <= TRAINER_LINES, (
        f"dew/training/trainer.py holds {lines} lines (at most {TRAINER_LINES}): move a part beside it"
    )
