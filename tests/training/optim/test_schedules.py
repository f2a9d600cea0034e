"""Schedules against their closed forms (dew.training.optim.schedules)."""

import dataclasses
import functools
import math

import jax.numpy as jnp
import numpy as np
import pytest

from dew.contract.schedules import schedules
from dew.training.optim.schedules import CosineSchedule, LinearSchedule, PowerSchedule, build_schedule, step_inputs

PEAK = 3e-3
TOTAL = 100


def values(fn, steps):
    return np.array([float(fn(jnp.int32(s))) for s in steps])


def test_registry_and_records_are_plain():
    assert schedules == {"cosine": CosineSchedule, "linear": LinearSchedule, "power": PowerSchedule}
    with pytest.raises(ValueError, match="exclusive"):
        PowerSchedule(decay_steps=3, decay_fraction=0.1)


def test_constant_when_unset():
    fn = build_schedule(None, PEAK, total_steps=TOTAL)
    np.testing.assert_allclose(values(fn, [0, 7, 1000]), PEAK, rtol=1e-6)


def test_cosine_closed_form_and_warmup_continuity():
    warmup, floor = 10, 0.1
    fn = build_schedule(CosineSchedule(warmup, floor), PEAK, total_steps=TOTAL)
    steps = [0, 5, 9, 10, 30, 55, 99, 100, 150]

    def closed(s):
        if s < warmup:
            return PEAK * s / warmup
        t = min((s - warmup) / (TOTAL - warmup), 1.0)
        return PEAK * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))

    np.testing.assert_allclose(values(fn, steps), [closed(s) for s in steps], rtol=1e-5, atol=1e-9)
    assert float(fn(jnp.int32(10))) == pytest.approx(PEAK, rel=1e-6)  # the peak at the end of warmup
    assert float(fn(jnp.int32(TOTAL))) == pytest.approx(floor * PEAK, rel=1e-5)  # the floor at the last step
    # continuity: the jump across the end of warmup is one warmup increment, no more
    assert abs(float(fn(jnp.int32(10))) - float(fn(jnp.int32(9)))) <= PEAK / warmup + 1e-9


def test_linear_closed_form():
    warmup, end = 20, 0.25
    fn = build_schedule(LinearSchedule(warmup, end), PEAK, total_steps=TOTAL)
    steps = [0, 10, 19, 20, 60, 100]
    closed = [
        PEAK * s / warmup if s < warmup else PEAK * (1 + (end - 1) * (s - warmup) / (TOTAL - warmup)) for s in steps
    ]
    np.testing.assert_allclose(values(fn, steps), closed, rtol=1e-5, atol=1e-9)


def _power_closed(s, tokens, warmup, a, b, tail_start, total):
    law = lambda t: min(PEAK, a * t**b) if t > 0 else PEAK  # noqa: E731
    rate = s / warmup * law(tokens(warmup)) if s < warmup else law(tokens(s))
    if s >= tail_start:
        rate *= (total - s) / (total - tail_start)
    return rate


def test_power_closed_form_with_tail():
    batch_tokens = 4096.0
    spec = PowerSchedule(warmup_steps=10, a=0.5, b=-0.51, decay_fraction=0.2)
    fn = build_schedule(spec, PEAK, total_steps=TOTAL, tokens_seen=lambda s: s.astype(jnp.float32) * batch_tokens)
    tokens = lambda s: s * batch_tokens  # noqa: E731
    steps = [0, 3, 9, 10, 11, 40, 79, 80, 90, 99, 100]
    closed = [_power_closed(s, tokens, 10, 0.5, -0.51, 80, TOTAL) for s in steps]
    np.testing.assert_allclose(values(fn, steps), closed, rtol=1e-5, atol=1e-10)
    assert float(fn(jnp.int32(TOTAL))) == 0.0
    # the law is below the peak here, so the rate decays with tokens seen
    assert float(fn(jnp.int32(40))) < float(fn(jnp.int32(11))) < PEAK
    # continuity at the end of warmup
    w_end = float(fn(jnp.int32(10)))
    assert abs(w_end - float(fn(jnp.int32(9)))) <= w_end / 10 * (1 + 1e-5)


def test_power_follows_tokens_under_a_batch_ramp():
    # 100 tokens a step for 10 steps, then 400: the rate is the law of the tokens actually seen.
    def ramp(s):
        s = s.astype(jnp.float32)
        return jnp.where(s <= 10, 100.0 * s, 1000.0 + 400.0 * (s - 10))

    tokens = lambda s: 100.0 * s if s <= 10 else 1000.0 + 400.0 * (s - 10)  # noqa: E731
    spec = PowerSchedule(warmup_steps=5, a=0.01, b=-0.5, decay_steps=10)
    fn = build_schedule(spec, PEAK, total_steps=TOTAL, tokens_seen=ramp)
    steps = [0, 2, 5, 8, 10, 11, 30, 89, 90, 95]
    closed = [_power_closed(s, tokens, 5, 0.01, -0.5, 90, TOTAL) for s in steps]
    np.testing.assert_allclose(values(fn, steps), closed, rtol=1e-5, atol=1e-10)
    constant = build_schedule(spec, PEAK, total_steps=TOTAL, tokens_seen=lambda s: s.astype(jnp.float32) * 100.0)
    assert float(fn(jnp.int32(30))) < float(constant(jnp.int32(30)))  # more tokens seen, a lower rate


def test_power_requires_tokens_seen():
    with pytest.raises(ValueError, match="tokens_seen"):
        build_schedule(PowerSchedule(), PEAK, total_steps=TOTAL)


def test_warmup_longer_than_run_is_an_error():
    with pytest.raises(ValueError, match="warmup_steps=200"):
        build_schedule(CosineSchedule(warmup_steps=200), PEAK, total_steps=TOTAL)


@pytest.mark.parametrize("spec", [None, CosineSchedule(10, 0.1), LinearSchedule(0, 0.2), LinearSchedule(7, 0.0)])
def test_the_numbers_as_inputs_of_a_compiled_program_give_the_same_rates(spec):
    """``step_inputs`` as traced arguments of one jitted function: the rates of the schedule compiled
    with the numbers as constants, to within float32's rounding (with a constant divisor XLA
    multiplies by its reciprocal instead: a few ulps apart), and one program for other numbers."""
    import jax

    inputs = step_inputs(spec, PEAK, TOTAL)
    assert set(inputs) == ({"peak"} if spec is None else {"peak", "warmup", "total_steps"})
    rate = jax.jit(lambda arrays, s: build_schedule(spec, PEAK, total_steps=TOTAL, inputs=arrays)(s))
    steps = [0, 3, 7, 9, 10, 11, 50, 99, 100, 140]
    close = functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=0)
    close([rate(inputs, jnp.int32(s)) for s in steps], constants(spec, PEAK, TOTAL, steps))
    other = step_inputs(dataclasses.replace(spec, warmup_steps=3) if spec else None, 2 * PEAK, 2 * TOTAL)
    close(
        [rate(other, jnp.int32(s)) for s in steps],
        constants(spec and dataclasses.replace(spec, warmup_steps=3), 2 * PEAK, 2 * TOTAL, steps),
    )
    assert rate._cache_size() == 1  # the other numbers ran the same program


def test_a_schedule_that_is_not_traceable_keeps_its_numbers_as_constants():
    assert step_inputs(PowerSchedule(warmup_steps=5, decay_fraction=0.1), PEAK, TOTAL) == {}
    assert step_inputs(CosineSchedule(10), PEAK, 2**31) == {}  # int32 cannot hold the run's length


def constants(spec, peak, total, steps):
    """The rates of the schedule compiled with its numbers as constants (as before ``step_inputs``)."""
    import jax

    fn = jax.jit(build_schedule(spec, peak, total_steps=total))
    return np.array([fn(jnp.int32(s)) for s in steps])
