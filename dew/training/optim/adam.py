"""``adam`` and ``adamw``: Adam (Kingma & Ba 2015) with L2 in the gradient, and AdamW (Loshchilov &
Hutter 2019) with decoupled weight decay, registered; optax's ``scale_by_adam``, or Adam's moments
in bfloat16 (``dew.training.optim.bf16``) with ``optim.state_dtype=bfloat16``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import jax
import optax

from dew.training.optim.bf16 import bf16_moments
from dew.training.optim.registry import UpdateRule, optimizers
from dew.training.optim.schedules import Rate


@optimizers.register("adam")
class Adam(UpdateRule):
    """Adam; a weight decay set is L2 in the gradient (torch's Adam), added before the moments."""

    options: ClassVar[Mapping[str, object]] = {"b1": 0.9, "b2": 0.999, "eps": 1e-8}
    weight_decay = 0.0  # Adam has no decoupled decay
    traceable = True

    def scale(self, state_dtype: str) -> optax.GradientTransformation:
        o = self.opts
        if state_dtype == "bfloat16":
            return bf16_moments(o["b1"], o["b2"], o["eps"])
        return optax.scale_by_adam(o["b1"], o["b2"], o["eps"])

    def rule(self, rate: Rate, decay: float | jax.Array, state_dtype: str) -> optax.GradientTransformation:
        return optax.chain(
            optax.add_decayed_weights(decay), self.scale(state_dtype), optax.scale_by_learning_rate(rate)
        )


@optimizers.register("adamw")
class AdamW(Adam):
    """AdamW: the decay is added to Adam's update, decoupled from the moments."""

    weight_decay = 1e-4  # optax.adamw's default

    def rule(self, rate: Rate, decay: float | jax.Array, state_dtype: str) -> optax.GradientTransformation:
        return optax.chain(
            self.scale(state_dtype), optax.add_decayed_weights(decay), optax.scale_by_learning_rate(rate)
        )
