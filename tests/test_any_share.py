"""``Any`` annotates fewer than 2% of dew's annotated parameters.

Read with ``ast`` from every module of ``dew/``: each parameter of a function or method that carries
an annotation counts (``*args`` and ``**kwargs`` too), and it counts as ``Any`` when its annotation
is ``Any`` (``typing.Any``, quoted or not, alone or ``| None``) or a name the module defines or
imports as an alias of ``Any`` (``Fields = Any``: an alias hides the same hole). ``dict[str, Any]``
and its kind are typed containers of JSON-like values and do not count.
"""

from __future__ import annotations

import ast
import pathlib

DEW = pathlib.Path(__file__).resolve().parents[1] / "dew"

LIMIT = 0.02
"""The largest share of annotated parameters typed ``Any``."""

ANY = {"Any", "typing.Any"}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(DEW.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def trees() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(), filename=str(p)) for p in sorted(DEW.rglob("*.py"))}


def is_any(annotation: ast.expr, aliases: set[str]) -> bool:
    """``Any``, an alias of it, or either ``| None``."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = [annotation.left, annotation.right]
        rest = [s for s in sides if not (isinstance(s, ast.Constant) and s.value is None)]
        return len(rest) == 1 and is_any(rest[0], aliases)
    return ast.unparse(annotation) in ANY | aliases


def own_aliases(tree: ast.Module) -> set[str]:
    """The module-level names ``tree`` binds to ``Any`` (``X = Any``, ``X: TypeAlias = Any``, ``type X = Any``)
    or declares ``Any`` (``X: Any = make_dataclass(...)``, then used as a type)."""
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.value) in ANY:
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            # X: TypeAlias = Any, and X: Any = make_dataclass(...): a name typed Any is Any as a type too
            if ast.unparse(node.annotation) in ANY or (node.value is not None and ast.unparse(node.value) in ANY):
                names.add(node.target.id)
        elif isinstance(node, ast.TypeAlias) and ast.unparse(node.value) in ANY:
            names.add(node.name.id)
    return names


def aliases_of(trees_: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Module -> the names it may annotate with that mean ``Any``: its own aliases, and those it
    imports from a module of dew that defines them."""
    own = {name: own_aliases(tree) for name, tree in trees_.items()}
    seen = {}
    for name, tree in trees_.items():
        names = set(own[name])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in own:
                names |= {a.asname or a.name for a in node.names if a.name in own[node.module]}
        seen[name] = names
    return seen


def count() -> tuple[int, list[str]]:
    """(annotated parameters, ``module:function:parameter`` of those typed ``Any``)."""
    trees_ = trees()
    aliases = aliases_of(trees_)
    total, found = 0, []
    for module, tree in trees_.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]:
                if arg.annotation is None:
                    continue
                total += 1
                if is_any(arg.annotation, aliases[module]):
                    found.append(f"{module}:{node.name}:{arg.arg}")
    return total, found


def test_the_reader_sees_any() -> None:
    """``Any`` plain, quoted, with ``| None`` and through an alias counts; a container of it does not."""
    tree = ast.parse(
        "Fields = Any\ndef f(a: Any, b: 'Any | None', c: Fields, d: dict[str, Any], *e: int, **k: Any): ..."
    )
    assert own_aliases(tree) == {"Fields"}
    args = tree.body[1].args
    params = [*args.args, args.vararg, args.kwarg]
    assert [is_any(p.annotation, {"Fields"}) for p in params] == [True, True, True, False, False, True]


def test_any_is_below_two_percent_of_annotated_parameters() -> None:
    total, found = count()
    share = len(found) / total
    print(f"Any: {len(found)} of {total} annotated parameters ({share:.2%})")
    assert total > 1000  # the reader read dew
    assert share < LIMIT, f"Any types {len(found)} of {total} annotated parameters ({share:.2%}): " + ", ".join(found)
