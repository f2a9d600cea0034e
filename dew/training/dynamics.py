"""Training dynamics (``trainer.dynamics_every``): per-layer RMS of the activations, gradients,
updates and parameters, computed inside the train step on the steps that report them.

A group is a parameter's top-level module (``embed``, ``final_norm``, ``t_embedder``), or, for a
parameter stacked along a leading ``layers`` axis (``dew.models.stack``), one block's module of a
kind: ``blocks/attn/q/kernel`` of shape ``(depth, ...)`` gives ``blocks_0_attn`` ... one value per
block. A group's RMS is over every element of its parameters together: ``sqrt(sum x² / count)``.
The metrics, every name a run of ``[A-Za-z0-9_]`` between slashes (W&B's rule for names it can
sort and filter by; TensorBoard and MLflow take them as they are):

- ``dynamics/grad_rms/<group>``: the gradients of the step's whole batch (after the loss scale);
- ``dynamics/update_rms/<group>``: the optimizer's output, before it is added to the parameters
  (optax's ``updates``: the learning rate and weight decay included);
- ``dynamics/param_rms/<group>``: the parameters the update is added to;
- ``dynamics/update_ratio/<group>``: update RMS over parameter RMS (NaN where the parameters are all
  zero, as adaLN-Zero's are at initialisation);
- ``dynamics/act_rms/<stack>_<block>``: the RMS of each block's output (the residual stream) over
  the batch's every position, padding included, recorded in the step's own forward pass
  (``dew.models.stack.recording``).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dew.contract.dynamics import PREFIX
from dew.models.stack import OUTPUT_MS
from dew.training.sharding import logical_names


def group_of(path: tuple[str, ...], stacked: bool) -> str:
    """A parameter's group (module docstring): with ``stacked``, ``<stack>_{}_<kind>`` to be filled
    with the block's index."""
    if stacked and len(path) > 2:
        return f"{path[0]}_{{}}_{path[1]}"
    return path[0]


def _paths(tree: Any) -> list[tuple[str, ...]]:
    return [tuple(map(str, p)) for p, _ in nnx.to_flat_state(tree)]


def _leaves(tree: Any) -> list[jax.Array]:
    return [v.get_value() if isinstance(v, nnx.Variable) else v for _, v in nnx.to_flat_state(tree)]


def sums_of_squares(params: nnx.State, trees: Mapping[str, Any]) -> dict[str, dict[str, jax.Array]]:
    """For each tree of ``trees`` (shaped as ``params``): each group's sum of squares, a ``(depth,)``
    vector for a stacked group; and under ``"count"`` each group's element count."""
    names = logical_names(params)
    paths = _paths(params)
    stacked = [bool(names.get("/".join(p))) and names["/".join(p)][0] == "layers" for p in paths]  # type: ignore[index]
    groups = [group_of(p, s) for p, s in zip(paths, stacked)]
    out: dict[str, dict[str, Any]] = {}
    for kind, tree in trees.items():
        sums: dict[str, Any] = collections.defaultdict(float)
        for group, is_stacked, x in zip(groups, stacked, _leaves(tree)):
            square = jnp.square(x.astype(jnp.float32))
            sums[group] = sums[group] + (square.sum(axis=tuple(range(1, x.ndim))) if is_stacked else square.sum())
        out[kind] = dict(sums)
    counts: dict[str, Any] = collections.defaultdict(int)
    for group, is_stacked, x in zip(groups, stacked, _leaves(params)):
        counts[group] += x.size // x.shape[0] if is_stacked else x.size
    out["count"] = dict(counts)
    return out


def _per_block(kind: str, group: str, value: jax.Array) -> dict[str, jax.Array]:
    if "{}" not in group:
        return {f"{PREFIX}{kind}/{group}": value}
    return {f"{PREFIX}{kind}/{group.format(i)}": value[i] for i in range(value.shape[0])}


def parameter_metrics(params: nnx.State, grads: Any, updates: Any) -> dict[str, jax.Array]:
    """The gradient, update and parameter RMS of every group, and the update/parameter ratio."""
    sums = sums_of_squares(params, {"grad_rms": grads, "update_rms": updates, "param_rms": params})
    counts = sums.pop("count")
    metrics: dict[str, jax.Array] = {}
    rms = {kind: {g: jnp.sqrt(s / counts[g]) for g, s in groups.items()} for kind, groups in sums.items()}
    for kind, groups in rms.items():
        for group, value in groups.items():
            metrics.update(_per_block(kind, group, value))
    for group, update in rms["update_rms"].items():
        param = rms["param_rms"][group]
        metrics.update(_per_block("update_ratio", group, jnp.where(param > 0, update / param, jnp.nan)))
    return metrics


def activation_metrics(sown: nnx.State | Mapping[str, Any]) -> dict[str, jax.Array]:
    """Each block's output RMS from the mean squares the stacks sowed (``dew.models.stack``),
    stacked over the micro-batches (equal in size, so their mean is the whole batch's); a stack
    run more than once in a forward pass is averaged over its runs."""
    metrics: dict[str, jax.Array] = {}
    for path, value in nnx.to_flat_state(sown) if isinstance(sown, nnx.State) else sown.items():
        path = tuple(map(str, path))
        if OUTPUT_MS not in path:
            continue
        runs = value.get_value() if isinstance(value, nnx.Variable) else value
        ms_xL = jnp.mean(jnp.stack(list(runs) if isinstance(runs, tuple) else [runs]), axis=0)
        ms_L = ms_xL.reshape(-1, ms_xL.shape[-1]).mean(axis=0)  # over the micro-batches
        stack = "_".join(p for p in path[: path.index(OUTPUT_MS)] if not p.isdigit()) or "blocks"
        metrics.update({f"{PREFIX}act_rms/{stack}_{i}": jnp.sqrt(ms_L[i]) for i in range(ms_L.shape[0])})
    return metrics
