"""The device mesh, and how the train state and the batch are laid out on it (``jax.sharding``).

``trainer.mesh`` names the axis sizes (data, fsdp, tensor) over every visible device. Every
parameter carries the logical names of its dimensions (``dew.models.axes``); ``trainer.layout.rules``
maps names to mesh axes, and ``param_specs`` turns each parameter's names into its
``PartitionSpec`` (flax's ``logical_to_mesh_axes``), checking that each split dimension divides over
its devices. Everything else follows the parameters: a leaf of the optimizer state or the EMA that
sits at a parameter's path with the parameter's shape (optax's states mirror the parameter tree:
Adam's ``mu``/``nu``, Muon's momentum, the bf16 moments) takes its spec; counters, keys and scalars are
replicated. XLA inserts the collectives: all-gathers of fsdp-split parameters, reduce-scatters of
their gradients, and the all-reduce after a row-parallel matmul.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dew.contract.config import Layout, TrainerConfig
from dew.models.axes import mesh_axes, rules
from dew.training.optim.registry import path_str

if TYPE_CHECKING:
    from dew.training.state import TrainState


def make_mesh(trainer: TrainerConfig) -> Mesh:
    shape = trainer.mesh.shape(jax.device_count())
    devices = np.asarray(jax.devices()).reshape(tuple(shape.values()))
    return Mesh(devices, tuple(shape))


def abstract_mesh(trainer: TrainerConfig, device_count: int) -> AbstractMesh:
    """The mesh ``trainer.mesh`` names over ``device_count`` devices, without needing them."""
    shape = trainer.mesh.shape(device_count)
    return AbstractMesh(tuple(shape.values()), tuple(shape))


def batch_axes(mesh: Mesh | AbstractMesh, layout: Layout) -> tuple[str, ...]:
    return tuple(a for a in layout.batch_axes if a in mesh.shape)


def batch_sharding(mesh: Mesh, layout: Layout) -> NamedSharding:
    """Every input's leading (batch) dimension split over the batch axes, the rest replicated."""
    return NamedSharding(mesh, P(batch_axes(mesh, layout)))


def check_batch(batch: int, mesh: Mesh | AbstractMesh, layout: Layout, *, field: str) -> None:
    """A (micro-)batch must split evenly over the batch axes' devices."""
    devices = math.prod(mesh.shape[a] for a in batch_axes(mesh, layout))
    if batch % devices:
        raise ValueError(
            f"{field}: a batch of {batch} (per micro-batch) does not divide over the "
            f"{devices} devices of the batch axes {batch_axes(mesh, layout)}"
        )


def shared_rows(batch_sharding: NamedSharding, batch_size: int) -> str | None:
    """Why the batch cannot be fed as every process feeds it, or None: each process reads its own
    records (``iterator``/``eval_batches(process_index, process_count)``), so no row of the global batch may
    sit on the devices of two processes. A mesh whose batch axes span fewer devices than there are
    processes (``trainer.mesh.data=1 trainer.mesh.tensor=2`` over two processes) replicates rows
    across processes, and each would put its own records in them: a wrong loss, not an error."""
    rows: dict[tuple[int | None, int | None], set[int]] = {}
    for device, index in batch_sharding.devices_indices_map((batch_size,)).items():
        rows.setdefault((index[0].start, index[0].stop), set()).add(device.process_index)  # type: ignore[attr-defined]  # jaxlib's Device stub lacks it
    return _shared_rows_problem(dict(batch_sharding.mesh.shape), tuple(batch_sharding.spec[0] or ()), rows.values())


def shared_rows_over(mesh: AbstractMesh, layout: Layout, process_count: int) -> str | None:
    """``shared_rows`` before the processes exist (a launcher checking its jobs): ``make_mesh`` lays
    ``jax.devices()`` out in order, and JAX lists the devices process by process, so process ``p``
    holds the ``p``-th run of ``device_count / process_count`` devices of the mesh in row-major order.
    None where the devices do not divide over the processes (the run's own check decides then)."""
    shape, axes = dict(mesh.shape), batch_axes(mesh, layout)
    devices = math.prod(shape.values())
    if process_count <= 1 or devices % process_count:
        return None
    process = np.arange(devices).reshape(tuple(shape.values())) // (devices // process_count)
    # one row of the batch per coordinate along the batch axes: the processes holding its devices
    moved = np.moveaxis(process, [list(shape).index(a) for a in axes], list(range(len(axes))))
    groups = moved.reshape(math.prod(shape[a] for a in axes), -1)
    return _shared_rows_problem(shape, axes, [set(g.tolist()) for g in groups])


def _shared_rows_problem(shape: dict[str, int], axes: tuple[str, ...], rows: Iterable[set[int]]) -> str | None:
    shared = [processes for processes in rows if len(processes) > 1]
    if not shared:
        return None
    split = " x ".join(axes) or "no axis"
    devices = math.prod(shape[a] for a in axes)
    return (
        f"trainer.mesh={shape}: the batch splits over {split} ({devices} devices), so processes "
        f"{sorted(set().union(*shared))} hold the same rows of it, but each reads its own "
        "records; split it over the processes (trainer.mesh.data or trainer.mesh.fsdp a multiple of their count), "
        "or start fewer processes, each holding more devices (one task per node for a tensor axis)"
    )


def logical_names(params: nnx.State) -> dict[str, tuple[str | None, ...] | None]:
    """Each parameter's path (``blocks/attn/q/kernel``) -> the logical names of its dimensions."""
    names: dict[str, tuple[str | None, ...] | None] = {}
    for path, variable in nnx.to_flat_state(params):
        key = "/".join(map(str, path))
        sharding = variable.get_metadata().get("out_sharding") if isinstance(variable, nnx.Variable) else None
        names[key] = tuple(sharding) if sharding else None
    return names


def param_specs(params: nnx.State, mesh: Mesh | AbstractMesh, layout: Layout) -> dict[str, P]:
    """Each parameter's path -> its ``PartitionSpec`` under ``layout.rules`` on ``mesh``.

    A parameter below ``layout.min_shard_size`` elements, or one that declares no names, is
    replicated. Raises naming the parameter, its shape and the mesh when a split dimension does
    not divide over its devices, or when the names do not match the parameter's rank.
    """
    names = logical_names(params)
    specs = {}
    for path, variable in nnx.to_flat_state(params):
        key = "/".join(map(str, path))
        shape = tuple(variable.shape)
        dims = names[key]
        if dims is None or math.prod(shape) < layout.min_shard_size:
            specs[key] = P()
            continue
        if len(dims) != len(shape):
            raise ValueError(
                f"parameter {key} of shape {shape} declares {len(dims)} logical axes {dims}: one name per dimension"
            )
        spec = mesh_axes(dims, layout.table, mesh.shape)
        for dim, (size, axes) in enumerate(zip(shape, spec)):
            axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
            devices = math.prod(mesh.shape[a] for a in axes)
            if size % devices:
                raise ValueError(
                    f"parameter {key} of shape {shape} (logical axes {dims}) does not divide over the "
                    f"mesh {dict(mesh.shape)}: dimension {dim} ({dims[dim]}={size}) splits over "
                    f"{'x'.join(axes)} = {devices} devices. Change trainer.mesh or "
                    f"trainer.layout.rules.{dims[dim]}"
                )
        specs[key] = spec
    return specs


def follow_params(tree: object, specs: Mapping[str, P], shapes: Mapping[str, tuple[int, ...]]) -> Any:
    """A ``PartitionSpec`` for every leaf of ``tree`` (a train state, an optimizer state): the spec
    of the parameter whose path ends the leaf's path and whose shape it has; ``P()`` otherwise."""
    by_last: dict[str, list[str]] = {}
    for key in specs:
        by_last.setdefault(key.rsplit("/", 1)[-1], []).append(key)

    def leaf(path: jax.tree_util.KeyPath, x: jax.Array | jax.ShapeDtypeStruct) -> P:
        where = path_str(path)
        shape = tuple(getattr(x, "shape", ()))
        for key in by_last.get(where.rsplit("/", 1)[-1], ()):
            if (where == key or where.endswith("/" + key)) and shapes[key] == shape:
                return specs[key]
        return P()

    return jax.tree_util.tree_map_with_path(leaf, tree)


def state_sharding(state: TrainState, params: nnx.State, mesh: Mesh, layout: Layout) -> Any:
    """A ``NamedSharding`` for every leaf of the train state ``state`` (abstract or concrete), from
    the logical names of ``params`` (the split module's ``nnx.State``), as a ``TrainState`` of
    ``NamedSharding``s (typed ``Any``: mypy does not see the ``replace`` that flax.struct gives it)."""
    specs = param_specs(params, mesh, layout)
    shapes = {"/".join(map(str, p)): tuple(v.shape) for p, v in nnx.to_flat_state(params)}
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, spec), follow_params(state, specs, shapes), is_leaf=lambda x: isinstance(x, P)
    )


def under_rules[**A, R](mesh: Mesh, layout: Layout, fn: Callable[A, R]) -> Callable[A, R]:
    """``fn`` traced with the rules active, so ``dew.models.axes.constrain`` pins activations."""

    @functools.wraps(fn)
    def traced(*args: A.args, **kwargs: A.kwargs) -> R:
        with rules(mesh, layout.table):
            return fn(*args, **kwargs)

    return traced
