"""The batch ramp (``trainer.batch_ramp``): which stage a step trains in, and the tokens consumed
before a step, for schedules and optimizers that count tokens rather than steps."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp


def stage_at(stages: Sequence[tuple[int, int]], step: int) -> int:
    """The index of the ramp stage that ``step`` trains in."""
    for i, (_, steps) in enumerate(stages):
        if steps == 0 or step < steps:
            return i
        step -= steps
    return len(stages) - 1


def tokens_seen_fn(stages: Sequence[tuple[int, int]], tokens_per_record: float) -> Callable[[jax.Array], jax.Array]:
    """Tokens (records, for data without tokens) consumed before a step, batch ramp included."""

    def tokens_seen(step: jax.Array) -> jax.Array:
        step = jnp.asarray(step, jnp.float32)
        total, start = jnp.zeros((), jnp.float32), 0.0
        for batch, steps in stages:
            span = jnp.clip(step - start, 0.0, steps if steps else jnp.inf)
            total = total + span * batch
            start += steps
        return total * tokens_per_record

    return tokens_seen
