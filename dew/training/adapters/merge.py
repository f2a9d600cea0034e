"""Merging a LoRA run into a plain run of the full model: each adapted weight becomes
``W + (alpha/rank)·A·B``, the factors are dropped, and the result is written as a dew run directory
(``run.json`` without ``lora``, one checkpoint step holding the parameters) that ``dew-sample``,
``dew-export`` and ``trainer.init_from`` read like any other.

The adapted model computes ``x·W + (alpha/rank)·(x·A)·B`` (qwix's ``LoraProvider`` adds the delta
product to the base product); the merged one computes ``x·(W + (alpha/rank)·A·B)``. Both are the same
linear map, evaluated in another order, so they agree to float rounding (a few ulps of the
activations), not bit for bit: the merged weight's rounding is not the two products' rounding.

qwix shapes the factors from the matmul: ``A`` is ``(contraction..., rank)`` flattened to
``(fan in, rank)`` and ``B`` is ``(rank, remaining...)`` flattened to ``(rank, fan out)``, so for a
weight whose contracted axes come first (every dense weight of dew's models) ``A·B`` reshaped to the
weight's shape is the delta. A stack of blocks carries one more leading ``depth`` axis on all three.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from etils import epath
from flax import nnx

from dew.contract.config import RunConfig
from dew.training import adapt
from dew.training.checkpointing.checkpoints import Checkpoints

if TYPE_CHECKING:
    from dew.objectives.base import Objective

SUFFIX_A, SUFFIX_B = "_lora_a", "_lora_b"


class MergeError(ValueError):
    """A run that cannot be merged."""


def merged(model: nnx.Module, run: RunConfig) -> dict[str, jax.Array]:
    """The full model's parameters (path -> array) with every adapted weight merged."""
    if run.lora is None:
        raise MergeError("--merge-lora: the run has no lora: its checkpoint already holds the full model")
    if run.trainer.quantization is not None:
        raise MergeError(
            "--merge-lora: the run trained LoRA over a quantized base (trainer.quantization); "
            "its merged weight would be quantized as a whole, which is not the model it trained"
        )
    flat = {"/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    scale = run.lora.alpha / run.lora.rank
    out = {}
    for key, value in flat.items():
        if key.endswith((SUFFIX_A, SUFFIX_B)):
            continue
        a, b = flat.get(key + SUFFIX_A), flat.get(key + SUFFIX_B)
        if a is not None and b is None:
            raise MergeError(f"--merge-lora: {key} has the factor {SUFFIX_A} without {SUFFIX_B}")
        out[key] = value if a is None or b is None else _merge_one(key, value, a, b, scale)
    return out


def _merge_one(key: str, w: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    """``w + scale·(a·b)`` reshaped to ``w``'s shape (batched over a stack's leading axes)."""
    delta = jnp.matmul(a.astype(jnp.float32), b.astype(jnp.float32))
    if delta.size != w.size or delta.shape[:-2] != w.shape[: delta.ndim - 2]:
        raise MergeError(
            f"--merge-lora: {key} of shape {w.shape} has factors {a.shape} and {b.shape}, whose "
            "product is not laid out like the weight"
        )
    return (w.astype(jnp.float32) + scale * delta.reshape(w.shape)).astype(w.dtype)


def plain_run(run: RunConfig) -> RunConfig:
    """``run`` as the merged model's record: no lora, no init_from (the parameters hold the whole model)."""
    return dataclasses.replace(run, lora=None, trainer=dataclasses.replace(run.trainer, init_from=None, init_skip=()))


def merged_model(model: nnx.Module, run: RunConfig, objective: Objective) -> nnx.Module:
    """The plain model with ``model``'s adapted weights merged: what ``dew-sample`` draws from for a
    LoRA run, so that the run and its merged checkpoint (``dew-export --merge-lora``) sample with
    the same program from the same bits, as PEFT's ``merge_and_unload`` serves an adapter; the
    unmerged product agrees with it to float rounding only (module docstring)."""
    params = merged(model, run)
    plain = plain_run(run)
    # flax types split's parts as a variadic tuple; two filters give exactly three
    graphdef, abstract, rest = nnx.split(
        nnx.eval_shape(lambda: adapt.build_model(plain, objective)),  # type: ignore[misc]
        nnx.Param,
        ...,
    )
    if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(rest)):  # none of dew's models has any
        _, _, rest = nnx.split(adapt.build_model(plain, objective), nnx.Param, ...)  # type: ignore[misc]
    flat = nnx.to_flat_state(abstract)
    if differ := sorted({"/".join(map(str, p)) for p, _ in flat} ^ set(params)):
        raise MergeError(f"--merge-lora: the merged parameters and the plain model differ at {differ[:4]}")
    for path, variable in flat:
        variable.set_value(params["/".join(map(str, path))])
    return nnx.merge(graphdef, nnx.from_flat_state(flat), rest)


def write_run(run: RunConfig, params: dict[str, jax.Array], out: str, *, step: int, merged_from: str) -> None:
    """Write ``params`` as a run directory at ``out``: ``run.json`` (``run`` without lora and without
    init_from: the checkpoint holds the whole model) and checkpoint step ``step``."""
    plain_run(run).save(out)
    tree: dict[str, Any] = {}
    for key, value in params.items():  # saved as a train state's params are: each leaf a {"value": ...} node
        node = tree
        for part in key.split("/"):
            node = node.setdefault(part, {})
        node["value"] = value
    checkpoints = Checkpoints(epath.Path(os.path.abspath(out)), keep=1)
    try:
        checkpoints.save(step, {"params": tree, "ema": None}, {"step": step, "merged_from": merged_from}, metrics=None)
    finally:
        checkpoints.close()
