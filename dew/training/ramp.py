"""The batch ramp (``trainer.batch_ramp``): which stage a step trains in, and the tokens consumed
before a step, for schedules and optimizers that count tokens rather than steps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from dew.contract.config import TrainerConfig
    from dew.contract.data import Dataset


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


def run_tokens_seen(trainer: TrainerConfig, dataset: Dataset) -> Callable[[jax.Array], jax.Array]:
    """``tokens_seen_fn`` of a run: its ramp's stages, and the dataset's tokens per record (1 for
    data without tokens)."""
    return tokens_seen_fn(trainer.stages(), float(getattr(dataset, "tokens_per_record", 1) or 1))
