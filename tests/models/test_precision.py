"""Precision: compute dtype on every layer, storage dtype of every parameter (also after an
optimizer step), matmul precision on every matmul."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dew.models import build

MODELS = {
    "simple_dit": (
        dict(input_size=8, in_channels=1, hidden_size=32, depth=2, num_heads=4, num_classes=10),
        lambda: (jnp.zeros((2, 8, 8, 1)), jnp.zeros(2), jnp.zeros(2, jnp.int32)),
    ),
    "simple_dit tokens": (
        dict(input_size=8, vocab_size=16, hidden_size=32, depth=2, num_heads=4),
        lambda: (jnp.zeros((2, 8), jnp.int32), jnp.zeros(2)),
    ),
    "transformer": (
        dict(vocab_size=16, seq_len=8, hidden_size=32, depth=2, num_heads=4, qk_norm=True, tie_embeddings=True),
        lambda: (jnp.zeros((2, 8), jnp.int32),),
    ),
}
DTYPES = ["float32", "bfloat16"]


def architecture(name):
    return name.split()[0]


@pytest.mark.parametrize(
    "name, dtype, param_dtype",
    [(n, d, p) for n, (d, p) in itertools.product(MODELS, itertools.product(DTYPES, DTYPES))],
)
def test_output_and_parameter_dtypes(name, dtype, param_dtype):
    fields, inputs = MODELS[name]
    fields = {**fields, "dtype": dtype, "param_dtype": param_dtype}
    model = nnx.eval_shape(lambda: build(architecture(name), fields, nnx.Rngs(0)))
    assert {a.dtype for a in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype(param_dtype)}
    graphdef, state = nnx.split(model)
    out, max_logits = jax.eval_shape(
        lambda state, *args: nnx.merge(graphdef, state)(*args, return_max_logits=True), state, *inputs()
    )
    assert out.dtype == jnp.dtype(dtype)
    assert max_logits.dtype == jnp.float32 and max_logits.shape == (2, 4)


def dot_precisions(jaxpr):
    """The precision of every dot_general in ``jaxpr``, sub-jaxprs (scan bodies) included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                sub = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr's jaxpr
                if hasattr(sub, "eqns"):
                    found += dot_precisions(sub)
    return found


@pytest.mark.parametrize("name", MODELS)
def test_every_matmul_asks_for_the_matmul_precision(name):
    fields, inputs = MODELS[name]
    model = nnx.eval_shape(lambda: build(architecture(name), {**fields, "matmul_precision": "highest"}, nnx.Rngs(0)))
    graphdef, state = nnx.split(model)
    jaxpr = jax.make_jaxpr(lambda state, *args: nnx.merge(graphdef, state)(*args, return_max_logits=True))(
        state, *inputs()
    )
    precisions = dot_precisions(jaxpr.jaxpr)
    assert len(precisions) >= 8
    highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
    assert all(p == highest for p in precisions), precisions


@pytest.mark.slow
def test_parameters_stay_in_param_dtype_after_an_optimizer_step():
    model = build(
        "transformer", {**MODELS["transformer"][0], "dtype": "bfloat16", "param_dtype": "bfloat16"}, nnx.Rngs(0)
    )
    graphdef, params = nnx.split(model)
    optimizer = optax.adamw(1e-2)
    tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, 16)

    @jax.jit
    def step(params, opt_state):
        def loss(params):
            logits = nnx.merge(graphdef, params)(tokens).astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens).mean()

        grads = jax.grad(loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    new_params, _ = step(params, optimizer.init(params))
    leaves = jax.tree.leaves(new_params)
    assert {a.dtype for a in leaves} == {jnp.dtype(jnp.bfloat16)}
    assert any(np.any(a != b) for a, b in zip(leaves, jax.tree.leaves(params)))
