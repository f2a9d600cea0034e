"""Fixtures of the model tests."""

import jax
import pytest
from flax import nnx


def _jitted(model, **static):
    """``model``'s call compiled once (eager NNX calls dispatch op by op and are slower on CPU)."""
    graphdef, state = nnx.split(model)
    call = jax.jit(lambda state, *args: nnx.merge(graphdef, state)(*args, **static))
    return lambda *args: call(state, *args)


@pytest.fixture
def jitted():
    """``jitted(model, **static_kwargs)(*args)``: call a model through ``jax.jit``."""
    return _jitted
