"""Logical axis names: every parameter and main activation says what each of its dimensions is.

A model never names a device or a mesh axis. It names its dimensions (``embed``, ``mlp``,
``heads`` ...) where it creates a parameter (``param``) or computes an activation (``constrain``), and
one table, ``trainer.layout.rules``, maps each name to mesh axes (``dew.training.sharding``). This is
flax's own mechanism (``nnx.with_partitioning`` metadata, the ``out_sharding`` of a Variable, and
``flax.linen.logical_to_mesh_axes`` for the translation), as MaxText's ``logical_axis_rules`` use it:
moving a model from 8 to 256 devices, or from FSDP to tensor parallel, edits the table, not the model.

``LOGICAL_AXES`` is the vocabulary; a rule for a name outside it is an error (``Layout``). A name
without a rule is replicated. An architecture registered later names its dimensions with these
words (or adds its own here).

This module imports no JAX at import time: the config layer validates rules against the vocabulary
on a login node.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dew.contract.axes import (
    LOGICAL_AXES as LOGICAL_AXES,
)  # re-exported: the vocabulary is the contract's (the config checks it)

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh, PartitionSpec


def param(init: Callable[..., Any], *names: str | None) -> Callable[..., Any]:
    """``init`` whose parameter carries ``names`` (one per dimension) as its sharding metadata.

    Flax's eager sharding (lay the Variable out when it is created) is off: it needs a mesh at
    construction, and dew builds models without one (a notebook, ``jax.eval_shape``, one device).
    The trainer lays the whole state out at once from the rules (``dew.training.sharding``).
    """
    from flax import nnx

    return nnx.with_partitioning(init, tuple(names), eager_sharding=False)


_active: contextvars.ContextVar[tuple[Mesh, tuple[tuple[str, tuple[str, ...]], ...]] | None] = contextvars.ContextVar(
    "dew_logical_rules", default=None
)


@contextlib.contextmanager
def rules(mesh: Mesh, table: Sequence[tuple[str, tuple[str, ...]]]) -> Iterator[None]:
    """Within: ``constrain`` pins activations to ``mesh`` by ``table`` (logical name -> mesh axes).
    The trainer traces its step inside; outside, ``constrain`` does nothing."""
    token = _active.set((mesh, tuple(table)))
    try:
        yield
    finally:
        _active.reset(token)


def constrain(x: jax.Array, *names: str | None) -> jax.Array:
    """``x`` laid out as its logical ``names`` say under the active ``rules``; ``x`` itself outside.

    ``jax.lax.with_sharding_constraint`` through flax's translation: a name takes its rule's mesh
    axes unless an earlier rule of the table took one of them for another dimension of ``x`` (the
    residual stream ``(batch, length, embed)`` keeps ``embed`` whole where ``batch`` took fsdp).
    """
    active = _active.get()
    if active is None:
        return x
    import jax
    from jax.sharding import NamedSharding

    mesh, table = active
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, mesh_axes(names, table, mesh.shape)))


def mesh_axes(
    names: Sequence[str | None], table: Sequence[tuple[str, tuple[str, ...]]], mesh_shape: Mapping[str, int]
) -> PartitionSpec:
    """The ``PartitionSpec`` of a value whose dimensions are ``names`` under ``table``: flax's
    ``logical_to_mesh_axes`` (rules in order, each mesh axis used once), without axes of size 1."""
    from flax.linen import logical_to_mesh_axes
    from jax.sharding import PartitionSpec as P

    spec = logical_to_mesh_axes(tuple(names), tuple(table))
    assert spec is not None  # None only for names None
    dims = []
    for entry in spec:
        axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
        axes = tuple(a for a in axes if mesh_shape[a] > 1)
        dims.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return P(*dims)
