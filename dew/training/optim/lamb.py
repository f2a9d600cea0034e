"""LAMB's trust ratio per layer, for parameters stacked over layers.

LAMB (You et al. 2020, Algorithm 2) scales each layer's update by ||x_l|| / ||u_l||, one ratio per
layer l. dew's models keep a stack of identical blocks as one leaf per parameter with a leading
``depth`` axis (``blocks/attn/q/kernel`` is ``(depth, hidden, heads, head_dim)``,
``dew.models.stack``), so ``optax.scale_by_trust_ratio``, which takes one ratio per leaf, would give
every layer of a stack the ratio of the whole stack. ``scale_by_layerwise_trust_ratio`` applies
optax's own transform to each slice of the leading axis of a stacked leaf (``jax.vmap``), and to
every other leaf whole: written here because optax has no per-slice form.

The other whole-parameter reductions of dew's optimizers: gradient clipping is by the global norm
(over every leaf at once, not per parameter, so stacking does not change it), and Muon
orthogonalises each matrix of a stack separately (``dew.training.optim.muon``: every axis outside the
matrix is a batch axis).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import ClassVar

import jax
import optax

from dew.training.optim.registry import UpdateRule, optimizers, path_str
from dew.training.optim.schedules import Rate

STACKED_PATTERNS: tuple[str, ...] = (r"(^|/)blocks/",)
"""Path patterns (``re.search``) of the leaves stacked over layers: everything under a model's
``blocks`` (``dew.models.stack``), whose leading axis is the layer."""


def is_stacked(path: str, patterns: Sequence[str] = STACKED_PATTERNS) -> bool:
    """Whether the leaf at ``path`` holds one slice per layer on its leading axis."""
    return any(re.search(p, path) for p in patterns)


def scale_by_layerwise_trust_ratio(patterns: Sequence[str] = STACKED_PATTERNS) -> optax.GradientTransformation:
    """``optax.scale_by_trust_ratio`` with one ratio per layer: per slice of the leading axis for
    the leaves whose path matches ``patterns``, per leaf for the rest."""
    whole = optax.scale_by_trust_ratio()

    def one(update: jax.Array, param: jax.Array) -> jax.Array:
        return whole.update(update, optax.EmptyState(), param)[0]

    per_layer = jax.vmap(one)

    def update_fn(
        updates: optax.Updates, state: optax.EmptyState, params: optax.Params | None = None
    ) -> tuple[optax.Updates, optax.EmptyState]:
        if params is None:
            raise ValueError("scale_by_layerwise_trust_ratio needs the parameters: pass params to update")

        def scale(path: jax.tree_util.KeyPath, update: jax.Array, param: jax.Array) -> jax.Array:
            stacked = update.ndim >= 1 and is_stacked(path_str(path), patterns)
            return per_layer(update, param) if stacked else one(update, param)

        return jax.tree_util.tree_map_with_path(scale, updates, params), state

    return optax.GradientTransformation(optax.init_empty_state, update_fn)


@optimizers.register("lamb")
class Lamb(UpdateRule):
    """LAMB (You et al. 2020, Algorithm 2): r = m̂/(sqrt(v̂)+eps); u = r + λx; x -= lr·(||x_l||/||u_l||)·u
    with one trust ratio per layer l, also inside a stack of layers."""

    options: ClassVar[Mapping[str, object]] = {"b1": 0.9, "b2": 0.999, "eps": 1e-6}
    weight_decay = 0.0  # optax.lamb's default
    traceable = True

    def rule(self, rate: Rate, decay: float | jax.Array, state_dtype: str) -> optax.GradientTransformation:
        o = self.opts
        return optax.chain(
            optax.scale_by_adam(o["b1"], o["b2"], o["eps"]),
            optax.add_decayed_weights(decay),
            scale_by_layerwise_trust_ratio(),
            optax.scale_by_learning_rate(rate),
        )
