"""``plan``: where every parameter of a run lands on its mesh, and the memory per device, before launch.

Nothing is allocated and no device of the mesh is needed: the model and the optimizer state are
``jax.eval_shape``d, the mesh is a ``jax.sharding.AbstractMesh`` of the sizes ``trainer.mesh`` names,
and each parameter's ``PartitionSpec`` is the one training would use (``dew.training.sharding``),
with the same errors (a dimension that does not divide names the parameter, its shape and the mesh).

The model is planned as ``model.config`` states it: the fields that follow from the data keep the
architecture's defaults unless set (``simple_dit``: 32x32x4 latents and 1,000 classes, DiT's
ImageNet 256 setting; ``transformer``: 50,304 tokens, 1,024 positions). No data is read.

**Activations** are estimated from autodiff itself: the residuals ``jax.vjp`` saves for the backward
pass of the model's forward (the arrays a step holds at its peak, before XLA's own rematerialisation
and fusion), for one device's micro-batch (``batch_size / accumulation / batch-axis devices``). The
part that grows with the batch is measured at two batch sizes (parameters and constant tables fall
out of the difference). Tensor parallelism splits heads and MLP hidden activations further; the
estimate does not subtract that, so it is an upper bound there.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from dew.contract.config import RunConfig
from dew.contract.models import Architecture, build, of
from dew.contract.objectives import natural_objective
from dew.training import assembly, sharding
from dew.training.optim.build import build_optimizer

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class ParamPlan:
    """One parameter on the mesh."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    names: tuple[str | None, ...] | None
    """Its logical axes, as the model declares them."""
    spec: str
    """Its ``PartitionSpec`` under ``trainer.layout.rules``."""
    bytes_per_device: int


@dataclasses.dataclass(frozen=True)
class Plan:
    """A run's parameters on its mesh, and the memory each device holds (bytes)."""

    mesh: dict[str, int]
    params: tuple[ParamPlan, ...]
    param_count: int
    param_bytes: int
    """Parameters per device."""
    optimizer_bytes: int
    """Optimizer state per device (moments, momentum; laid out like the parameters)."""
    ema_bytes: int
    """The EMA of the parameters per device (0 without one)."""
    activation_bytes: int
    """Estimated activations per device for the configured batch (see the module docstring)."""
    batch_per_device: int

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.optimizer_bytes + self.ema_bytes + self.activation_bytes

    def table(self) -> str:
        """The plan as a Markdown table and its totals."""
        lines = [
            f"mesh {' x '.join(f'{k}={v}' for k, v in self.mesh.items())} ({math.prod(self.mesh.values())} devices)",
            "",
            "| parameter | shape | logical axes | sharding | MiB per device |",
            "|---|---|---|---|---:|",
        ]
        for p in self.params:
            names = ", ".join(str(n) for n in p.names) if p.names else "-"
            lines.append(f"| {p.path} | {p.shape} | {names} | {p.spec} | {p.bytes_per_device / 2**20:.2f} |")
        lines += [
            "",
            "| per device | GiB |",
            "|---|---:|",
            f"| parameters ({self.param_count:,}) | {self.param_bytes / GIB:.3f} |",
            f"| optimizer state | {self.optimizer_bytes / GIB:.3f} |",
            f"| EMA | {self.ema_bytes / GIB:.3f} |",
            f"| activations, batch {self.batch_per_device} per device (estimate) | {self.activation_bytes / GIB:.3f} |",
            f"| total | {self.total_bytes / GIB:.3f} |",
        ]
        return "\n".join(lines)


def plan(run: RunConfig, device_count: int | None = None) -> Plan:
    """Plan ``run`` on the mesh ``run.trainer.mesh`` names over ``device_count`` devices (default:
    the product of its sizes; an axis of -1 then counts the devices visible here)."""
    t = run.trainer
    sizes = {f.name: getattr(t.mesh, f.name) for f in dataclasses.fields(t.mesh)}
    if device_count is None:
        known = math.prod(s for s in sizes.values() if s != -1)
        device_count = known if -1 not in sizes.values() else known * max(1, jax.device_count() // known)
    mesh = assembly.planned_mesh(t, device_count)
    arch = run.model.architecture
    fields = of(arch, run.model.fields())
    model = nnx.eval_shape(lambda: build(arch, run.model.fields(), nnx.Rngs(params=t.seed)))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)  # type: ignore[misc]  # flax: a variadic tuple
    specs = sharding.param_specs(params, mesh, t.layout)
    shapes = {"/".join(map(str, p)): tuple(v.shape) for p, v in nnx.to_flat_state(params)}
    names = sharding.logical_names(params)

    rows = []
    for path, variable in nnx.to_flat_state(params):
        key = "/".join(map(str, path))
        rows.append(
            ParamPlan(
                key,
                shapes[key],
                jnp.dtype(variable.dtype).name,
                names[key],
                str(specs[key]),
                _bytes_per_device(variable, specs[key], mesh),
            )
        )

    optimizer = build_optimizer(
        run.optim, params, total_steps=max(1, t.steps or 1), tokens_seen=lambda step: jnp.asarray(step, jnp.float32)
    )
    opt_state = jax.eval_shape(optimizer.tx.init, params)
    opt_specs = sharding.follow_params(opt_state, specs, shapes)
    optimizer_bytes = sum(
        _bytes_per_device(x, s, mesh)
        for x, s in zip(
            jax.tree.leaves(opt_state),
            jax.tree.leaves(opt_specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec)),
        )
    )
    param_bytes = sum(r.bytes_per_device for r in rows)

    batch_devices = math.prod(mesh.shape[a] for a in sharding.batch_axes(mesh, t.layout))
    sharding.check_batch(t.batch_size // t.accumulation, mesh, t.layout, field="trainer.batch_size")
    per_device = t.batch_size // t.accumulation // batch_devices
    activations = _activation_bytes(fields, graphdef, params, rest, per_device)
    return Plan(
        mesh=dict(mesh.shape),
        params=tuple(rows),
        param_count=sum(math.prod(r.shape) for r in rows),
        param_bytes=param_bytes,
        optimizer_bytes=optimizer_bytes,
        ema_bytes=param_bytes if _ema_decay(run, fields) > 0 else 0,
        activation_bytes=activations,
        batch_per_device=per_device,
    )


def _bytes_per_device(x: nnx.Variable | jax.ShapeDtypeStruct, spec: PartitionSpec, mesh: AbstractMesh) -> int:
    shape = tuple(getattr(x, "shape", ()))
    local = NamedSharding(mesh, spec).shard_shape(shape) if shape else ()
    return math.prod(local) * jnp.dtype(x.dtype).itemsize


def _inputs(arch: Architecture, batch: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    """One call's arguments for ``batch`` examples (``Architecture.call_shapes``)."""
    return tuple(jax.ShapeDtypeStruct(shape, jnp.dtype(dtype)) for shape, dtype in arch.call_shapes(batch))


def _activation_bytes(
    arch: Architecture, graphdef: nnx.GraphDef, params: nnx.State, rest: nnx.State, batch: int
) -> int:
    """Bytes of the residuals autodiff saves for ``batch`` examples (see the module docstring)."""

    def residuals(n: int) -> int:
        def saved(params: nnx.State, *inputs: jax.Array) -> Callable[..., Any]:
            forward = lambda p: jnp.sum(nnx.merge(graphdef, p, rest)(*inputs).astype(jnp.float32))  # noqa: E731
            return jax.vjp(forward, params)[1]

        leaves = jax.tree.leaves(jax.eval_shape(saved, params, *_inputs(arch, n)))
        return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in leaves)

    return (residuals(2 * batch) - residuals(batch)) if batch else 0


def _ema_decay(run: RunConfig, arch: Architecture) -> float:
    """The EMA decay of the objective the run trains (its knobs), without building the objective."""
    if run.objective is None:
        try:
            name = natural_objective(arch.role, arch.data_kind() or type(run.data).kind)
        except ValueError:  # nothing trains this model on this data: the plan counts no EMA
            return 0.0
    else:
        name = run.objective
    return float(getattr(getattr(run, name, None), "ema_decay", 0.0))
