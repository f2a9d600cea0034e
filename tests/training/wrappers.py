"""Test doubles around the real objective and dataset: a crash after N batches, a poisoned batch, a
deterministic loss with a varying count, an evaluation that makes the earliest step the best."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.objectives.base import Loss


class Crash(Exception):
    """What the crashing iterator raises: the run dies between steps, like a lost node."""


class _Iterator:
    def __init__(self, inner: Any, *, crash_at: int | None, nan_at: int | None) -> None:
        self.inner, self.crash_at, self.nan_at, self.calls = inner, crash_at, nan_at, 0

    def next(self, batch_size: int | None = None) -> dict[str, np.ndarray]:
        self.calls += 1
        if self.crash_at is not None and self.calls == self.crash_at:
            raise Crash(f"batch {self.calls}")
        batch = self.inner.next(batch_size)
        if self.nan_at is not None and self.calls == self.nan_at:
            batch = {**batch, "image": np.full_like(batch["image"], np.nan)}
        return batch

    def get_state(self) -> Any:
        return self.inner.get_state()

    def set_state(self, state: Any) -> None:
        self.inner.set_state(state)


class Data:
    """``dataset`` whose iterator crashes when asked for batch ``crash_at`` (1-based, counted from the
    process start), or whose batch ``nan_at`` is all NaN."""

    def __init__(self, inner: Any, *, crash_at: int | None = None, nan_at: int | None = None) -> None:
        self.inner, self.crash_at, self.nan_at = inner, crash_at, nan_at

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def iterator(self, process_index: int = 0, process_count: int = 1) -> _Iterator:
        return _Iterator(self.inner.iterator(process_index, process_count), crash_at=self.crash_at, nan_at=self.nan_at)


@dataclasses.dataclass
class Objective:
    """The flow-matching objective with two test knobs.

    ``deterministic``: the loss draws nothing (t from the label, the noise a mirror of the image) and
    counts only digits below 5, so micro-batches carry different counts and a mean of means would
    differ from the full batch's mean. ``negate_eval``: the evaluation loss is negated, so the
    earliest evaluation of a run that learns is the best.
    """

    inner: Any
    deterministic: bool = False
    negate_eval: bool = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def ema_decay(self) -> float:
        return self.inner.ema_decay

    def build(self, rngs: Any) -> Any:
        return self.inner.build(rngs)

    def loss(self, model: Any, batch: Any, key: jax.Array, *, max_logits: bool = False) -> Loss:
        if not self.deterministic:
            return self.inner.loss(model, batch, key, max_logits=max_logits)
        x0, y = batch["image"].astype(jnp.float32), batch["label"].astype(jnp.int32)
        t = (y.astype(jnp.float32) + 0.5) / 10.0
        per_example, logits = self.inner._mse(model, x0, t, x0[:, ::-1], y, max_logits)
        weight = (y < 5).astype(jnp.float32)
        return Loss((per_example * weight).sum(), weight.sum(), {}, logits)

    def evaluate(self, model: Any, batch: Any, key: jax.Array) -> Loss:
        out = self.inner.evaluate(model, batch, key)
        return out._replace(total=-out.total) if self.negate_eval else out

    def summary(self) -> Any:
        return self.inner.summary()
