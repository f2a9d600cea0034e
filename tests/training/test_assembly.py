"""A run is assembled on its devices in one place (``dew.training.assembly``): no other module of dew
makes a mesh, a batch sharding or a compiled train or evaluation step, and the batch checks the
set-up, a launcher and ``dew-eval`` make are one function's, with one message."""

from __future__ import annotations

import ast
import pathlib

import pytest

from dew.contract.config import MeshSpec, TrainerConfig
from dew.training import assembly

DEW = pathlib.Path(__file__).resolve().parents[2] / "dew"

ASSEMBLY = {"dew/training/assembly.py"}
"""Where a run is assembled."""
DEFINED = {"dew/training/sharding.py", "dew/training/step.py"}
"""Where the layout and the step's computation are defined (what the assembly calls)."""
MAKERS = {
    "Mesh",
    "make_mesh",
    "abstract_mesh",
    "batch_sharding",
    "make_train_step",
    "make_eval_step",
    "compile_train_step",
    "compile_eval_step",
}
"""Calls that make a mesh, a batch sharding or a train or evaluation step."""


def calls(path: pathlib.Path) -> list[tuple[int, str]]:
    """The calls in ``path`` that make one of ``MAKERS`` themselves: not through the assembly (a
    name imported from it, or ``assembly.<name>``)."""
    tree = ast.parse(path.read_text())
    through = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "dew.training.assembly"
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            name, via = func.attr, isinstance(func.value, ast.Name) and func.value.id == "assembly"
        else:
            name = getattr(func, "id", None)
            via = name in through
        if name in MAKERS and not via:
            found.append((node.lineno, name))
    return found


def test_only_the_assembly_makes_a_mesh_a_batch_sharding_or_a_compiled_step():
    outside, inside = {}, set()
    for path in sorted(DEW.rglob("*.py")):
        rel = str(path.relative_to(DEW.parent))
        if rel in DEFINED:
            continue
        made = calls(path)
        if rel in ASSEMBLY:
            inside |= {name for _, name in made}
        elif made:
            outside[rel] = made
    assert not outside, f"assemble a run in dew/training/assembly.py, not here: {outside}"
    assert {"make_mesh", "abstract_mesh", "batch_sharding", "make_train_step", "make_eval_step"} <= inside


@pytest.mark.parametrize(
    ("batch", "accumulation", "message"),
    [
        (12, None, r"trainer.batch_size: a batch of 12 \(per micro-batch\) does not divide over the 8 devices"),
        (16, 4, r"trainer.batch_size: a batch of 4 \(per micro-batch\) does not divide"),  # 16 in 4 micro-batches
    ],
)
def test_a_batch_that_does_not_divide_over_the_mesh_is_refused_naming_the_field(batch, accumulation, message):
    t = TrainerConfig(batch_size=batch, accumulation=accumulation or 1, mesh=MeshSpec(data=8))
    mesh = assembly.planned_mesh(t, 8)
    with pytest.raises(ValueError, match=message):
        assembly.check_batches(t, mesh, [(batch, "trainer.batch_size")])
    assembly.check_batches(t, mesh, [(32, "trainer.batch_size")], accumulation=1)  # 32 rows at once: they divide
