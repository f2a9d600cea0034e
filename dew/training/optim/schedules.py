"""Learning-rate schedule records: one typed record per kind, each holding only its own fields.

These records are plain dataclasses (no JAX at import) so that ``dew.contract.config`` can hold them;
``build_schedule`` turns one into the function of the step that ``dew.training.optim.build`` hands to
optax. Every schedule warms up linearly from 0 over ``warmup_steps`` optimizer updates and peaks at
``OptimConfig.learning_rate``.

Steps follow dew's convention: ``step`` is the number of completed optimizer updates, so the rate
at ``step`` is the one the update from ``step`` to ``step + 1`` uses (optax's ``count``), and a run
of ``total_steps`` updates ends at ``step == total_steps``: "the last step" of a decay below is that
end point.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from dew.contract.schedules import Rate, ScheduleSpec, WarmupDecay, schedules

if TYPE_CHECKING:
    import jax
    import numpy as np


@dataclasses.dataclass(frozen=True)
class LinearWarmup:
    """dew's ``WarmupDecay`` (the contract's): a linear warmup over ``warmup`` updates and the
    progress of the decay after it, 0 at the end of warmup and 1 at the run's end (``total_steps``).
    Both numbers are Python ints or, in a compiled step that takes them as inputs (``step_inputs``),
    int32 arrays: the arithmetic below is the same for either."""

    warmup: int | jax.Array
    total_steps: int | jax.Array

    def warming(self, step: jax.Array) -> jax.Array:
        """step / warmup, 1 once warmed up (and with no warmup at all)."""
        import jax.numpy as jnp

        warmup = jnp.asarray(self.warmup)
        rising = jnp.minimum(step.astype(jnp.float32) / jnp.maximum(warmup, 1).astype(jnp.float32), 1.0)
        return jnp.where(warmup > 0, rising, jnp.float32(1.0))

    def progress(self, step: jax.Array) -> jax.Array:
        import jax.numpy as jnp

        warmup = jnp.asarray(self.warmup)
        span = jnp.maximum(jnp.asarray(self.total_steps) - warmup, 1).astype(jnp.float32)
        return jnp.clip((step.astype(jnp.float32) - warmup.astype(jnp.float32)) / span, 0.0, 1.0)


@schedules.register("cosine")
@dataclasses.dataclass(frozen=True)
class CosineSchedule(ScheduleSpec):
    """Linear warmup, then a cosine decay from the peak to ``floor_ratio``·peak at the last step."""

    traceable = True

    floor_ratio: float = 0.0
    """The rate at the last step, as a fraction of the peak."""

    def __post_init__(self) -> None:
        _check_warmup(self)
        if not 0.0 <= self.floor_ratio <= 1.0:
            raise ValueError(f"optim.schedule.floor_ratio={self.floor_ratio} must lie in [0, 1]")

    def build(
        self, peak: float | jax.Array, ramp: WarmupDecay, tokens_seen: Callable[[jax.Array], jax.Array] | None
    ) -> Rate:
        import jax.numpy as jnp

        floor = self.floor_ratio

        def cosine(step: jax.Array) -> jax.Array:
            decay = floor + (1.0 - floor) * 0.5 * (1.0 + jnp.cos(jnp.pi * ramp.progress(step)))
            return peak * jnp.where(step < ramp.warmup, ramp.warming(step), decay)

        return cosine


@schedules.register("linear")
@dataclasses.dataclass(frozen=True)
class LinearSchedule(ScheduleSpec):
    """Linear warmup, then a linear decay from the peak to ``end_ratio``·peak at the last step."""

    traceable = True

    end_ratio: float = 0.0
    """The rate at the last step, as a fraction of the peak."""

    def __post_init__(self) -> None:
        _check_warmup(self)
        if not 0.0 <= self.end_ratio <= 1.0:
            raise ValueError(f"optim.schedule.end_ratio={self.end_ratio} must lie in [0, 1]")

    def build(
        self, peak: float | jax.Array, ramp: WarmupDecay, tokens_seen: Callable[[jax.Array], jax.Array] | None
    ) -> Rate:
        import jax.numpy as jnp

        end = self.end_ratio

        def linear(step: jax.Array) -> jax.Array:
            decay = 1.0 + (end - 1.0) * ramp.progress(step)
            return peak * jnp.where(step < ramp.warmup, ramp.warming(step), decay)

        return linear


@schedules.register("power")
@dataclasses.dataclass(frozen=True)
class PowerSchedule(ScheduleSpec):
    """lm-engine's power schedule (Shen et al. 2024, "Power Scheduler"): lr = min(lr_max, a·T^b).

    T is the number of tokens seen so far (records, for data without tokens), so a batch ramp
    changes the rate as it should. During warmup lr = (step / warmup_steps)·min(lr_max, a·T_w^b),
    with T_w the tokens seen at the end of warmup. An optional linear tail takes the rate to zero over
    the run's last ``decay_steps`` updates (or the last ``decay_fraction`` of the run).
    """

    a: float = 4.6
    """Amplitude of the power law (the paper's a = 4.6)."""
    b: float = -0.51
    """Exponent of the power law in tokens seen (the paper's b = -0.51)."""
    decay_steps: int | None = None
    """Length of the linear tail to zero, in optimizer updates; unset and no fraction: no tail."""
    decay_fraction: float | None = None
    """Length of the linear tail as a fraction of the run; exclusive with ``decay_steps``."""

    def __post_init__(self) -> None:
        _check_warmup(self)
        if self.a <= 0:
            raise ValueError(f"optim.schedule.a={self.a} must be positive")
        if self.decay_steps is not None and self.decay_fraction is not None:
            raise ValueError(
                "optim.schedule.decay_steps and optim.schedule.decay_fraction are exclusive; "
                f"got {self.decay_steps} and {self.decay_fraction}"
            )
        if self.decay_steps is not None and self.decay_steps < 0:
            raise ValueError(f"optim.schedule.decay_steps={self.decay_steps} must be >= 0")
        if self.decay_fraction is not None and not 0.0 <= self.decay_fraction <= 1.0:
            raise ValueError(f"optim.schedule.decay_fraction={self.decay_fraction} must lie in [0, 1]")

    def build(
        self, peak: float | jax.Array, ramp: WarmupDecay, tokens_seen: Callable[[jax.Array], jax.Array] | None
    ) -> Rate:
        import jax.numpy as jnp

        if tokens_seen is None:
            raise ValueError(
                "optim.schedule is the power schedule, a function of tokens seen: build_optimizer needs "
                "tokens_seen(step) (the trainer passes it, with the batch ramp in it)"
            )
        warmup, total_steps = int(ramp.warmup), int(ramp.total_steps)  # not traceable: numbers
        tail = self.decay_steps if self.decay_steps is not None else round((self.decay_fraction or 0.0) * total_steps)
        tail_start = total_steps - tail
        if tail and tail_start < warmup:
            raise ValueError(
                f"optim.schedule: the linear tail of {tail} steps starts at step {tail_start}, "
                f"inside the {warmup} warmup steps of a {total_steps}-step run"
            )
        a, b = self.a, self.b

        def power_law(tokens: jax.Array) -> jax.Array:
            # min(lr_max, a·T^b); at T = 0 the law is infinite and the peak holds.
            return jnp.minimum(peak, a * jnp.power(tokens.astype(jnp.float32), b))

        def power(step: jax.Array) -> jax.Array:
            step = jnp.asarray(step)
            rate = jnp.where(
                step < warmup,
                ramp.warming(step) * power_law(tokens_seen(jnp.asarray(warmup, step.dtype))),
                power_law(tokens_seen(step)),
            )
            if tail:
                left = jnp.clip((total_steps - step.astype(jnp.float32)) / tail, 0.0, 1.0)
                rate = jnp.where(step >= tail_start, rate * left, rate)
            return rate

        return power


def _check_warmup(spec: ScheduleSpec) -> None:
    if spec.warmup_steps < 0:
        raise ValueError(f"optim.schedule.warmup_steps={spec.warmup_steps} must be >= 0")


def build_schedule(
    spec: ScheduleSpec | None,
    peak: float,
    *,
    total_steps: int,
    tokens_seen: Callable[[jax.Array], jax.Array] | None = None,
    inputs: Mapping[str, jax.Array] | None = None,
) -> Rate:
    """Return the learning rate as a function of the step (an int32 array), a float32 array.

    ``spec`` None is the constant ``peak``. ``tokens_seen(step)`` is the number of tokens (records,
    for data without tokens) consumed before ``step``; only the power schedule reads it, and
    requires it. It should return a float array: token counts pass int32's range in real runs.
    ``inputs`` (``step_inputs``'s names, as arrays: a compiled step's inputs) stand for ``peak``,
    the warmup and ``total_steps`` in the rate, once they were checked here as numbers.
    """
    import jax.numpy as jnp

    if spec is not None:
        if total_steps < 1:
            raise ValueError(f"total_steps={total_steps} must be >= 1 for a schedule")
        if spec.warmup_steps > total_steps:
            raise ValueError(
                f"optim.schedule.warmup_steps={spec.warmup_steps} exceeds the run's {total_steps} steps; "
                f"shorten it (optim.schedule.warmup_steps={max(1, total_steps // 10)}, a tenth of the run) "
                f"or train at least {spec.warmup_steps} steps"
            )
    if inputs and "peak" in inputs:
        peak_in: float | jax.Array = inputs["peak"]
        warmup, total = inputs.get("warmup", 0), inputs.get("total_steps", total_steps)
    else:
        peak_in, total = peak, total_steps
        warmup = spec.warmup_steps if spec is not None else 0
    if spec is None:
        return lambda step: jnp.full((), peak_in, jnp.float32)
    return spec.build(peak_in, LinearWarmup(warmup, total), tokens_seen)


def step_inputs(spec: ScheduleSpec | None, peak: float, total_steps: int) -> dict[str, np.ndarray]:
    """The schedule's numbers that a compiled step takes as inputs instead of constants: the peak
    rate (float32), and for a ``traceable`` schedule the warmup and the run's length (int32). Runs
    that differ only in these share one compiled step: the trials of a search over the rate, a run
    trained longer, the suite's many short runs. Empty where the schedule computes with them in
    Python (``ScheduleSpec.traceable`` False) or where int32 cannot hold the run's length."""
    import numpy as np

    if spec is None:
        return {"peak": np.asarray(peak, np.float32)}
    if not spec.traceable or total_steps > np.iinfo(np.int32).max:
        return {}
    return {
        "peak": np.asarray(peak, np.float32),
        "warmup": np.asarray(spec.warmup_steps, np.int32),
        "total_steps": np.asarray(total_steps, np.int32),
    }
