"""The device mesh and how the train state and the batch are laid out on it (``jax.sharding``).

``trainer.mesh`` names the axis sizes (data, fsdp, tensor) over every visible device; the batch is
split over ``layout.batch_axes``; with ``layout.shard_params`` each parameter (and its optimizer
state and EMA, which share its shape) of at least ``min_shard_size`` elements is split over the
fsdp axis along its largest dimension that divides, the rest replicated. XLA inserts the
collectives (all-gather of parameters, reduce-scatter of gradients).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dew.config import Layout, TrainerConfig


def make_mesh(trainer: TrainerConfig) -> Mesh:
    shape = trainer.mesh.shape(jax.device_count())
    if shape["tensor"] > 1:
        raise ValueError(f"trainer.mesh.tensor={shape['tensor']}: no registered architecture declares "
                         "tensor-parallel dimensions yet; use the data and fsdp axes")
    devices = np.asarray(jax.devices()).reshape(tuple(shape.values()))
    return Mesh(devices, tuple(shape))


def batch_axes(mesh: Mesh, layout: Layout) -> tuple[str, ...]:
    return tuple(a for a in layout.batch_axes if a in mesh.shape)


def check_batch(batch: int, mesh: Mesh, layout: Layout, *, field: str) -> None:
    """A (micro-)batch must split evenly over the batch axes' devices."""
    devices = math.prod(mesh.shape[a] for a in batch_axes(mesh, layout))
    if batch % devices:
        raise ValueError(f"{field}: a batch of {batch} (per micro-batch) does not divide over the "
                         f"{devices} devices of the batch axes {batch_axes(mesh, layout)}")


def param_spec(shape: tuple[int, ...], mesh: Mesh, layout: Layout) -> P:
    fsdp = mesh.shape.get("fsdp", 1)
    if not layout.shard_params or fsdp == 1 or math.prod(shape) < layout.min_shard_size:
        return P()
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if shape[dim] % fsdp == 0:
            spec = [None] * len(shape)
            spec[dim] = "fsdp"
            return P(*spec)
    return P()


def state_sharding(state: Any, mesh: Mesh, layout: Layout) -> Any:
    """A sharding for every leaf of the train state: parameter-shaped leaves by ``param_spec``,
    scalars (step, key, counters) replicated."""

    def leaf(x: Any) -> NamedSharding:
        shape = tuple(getattr(x, "shape", ()))
        return NamedSharding(mesh, param_spec(shape, mesh, layout))

    return jax.tree.map(leaf, state)
