"""``TrainState``: everything a train step changes, what ``RunConfig.train`` returns.

A module of its own, importing nothing from dew: the contract names it as ``train``'s result, the
steps (``dew.training.step``), the hooks and the trainer carry it, and all of them import it from
here, below every one of them.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct

LOSS_SCALE_START = 2.0**15
"""The dynamic loss scale's first value."""


@struct.dataclass
class TrainState:
    """Everything a step changes. ``graphdef`` and ``rest`` (non-parameter module state) are static."""

    step: jax.Array
    params: Any
    opt_state: Any
    ema: Any
    key: jax.Array
    loss_scale: jax.Array
    good_steps: jax.Array
    nonfinite_step: jax.Array
    graphdef: Any = struct.field(pytree_node=False, default=None)
    rest: Any = struct.field(pytree_node=False, default=None)

    @classmethod
    def create(
        cls, params: nnx.State, tx: optax.GradientTransformation, *, seed: int, ema: bool, dynamic_scale: bool
    ) -> TrainState:
        """The state at step 0: the optimizer's initial state, the EMA (a copy of the parameters)
        when ``ema``, the per-step key from ``seed + 1`` (the initialisation drew from ``seed``) and
        the loss scale. Traceable: the trainer jits it to lay the state out on the mesh at once."""
        return cls(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=tx.init(params),
            ema=jax.tree.map(jnp.copy, params) if ema else None,
            key=jax.random.PRNGKey(seed + 1),
            loss_scale=jnp.asarray(LOSS_SCALE_START if dynamic_scale else 1.0, jnp.float32),
            good_steps=jnp.zeros((), jnp.int32),
            nonfinite_step=jnp.full((), -1, jnp.int32),
        )

    def model(self, *, ema: bool = False) -> nnx.Module:
        """The trained module (with the EMA of its parameters when ``ema`` and the run kept one)."""
        params = self.ema if ema and self.ema is not None else self.params
        return nnx.merge(self.graphdef, params, self.rest)
