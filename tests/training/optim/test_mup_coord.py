"""muP's coordinate check (dew.training.optim.coordinate_check) on the transformer and the DiT: under
muP no hidden layer's activation RMS moves with the width after a few Adam steps, under the standard
parametrization the output grows with it; and simple_dit under muP at its base width is the standard
model exactly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.contract.models import build
from dew.training.optim.coordinate_check import coordinate_check, slope

# Two widths, 4x apart. The least-squares slope over log widths equally spaced, as 48, 96 and 192
# were, is (y_192 - y_48) / (x_192 - x_48): the middle point's weight, x_96 - mean(x), is 0, so the
# third width moved no slope and no assertion; it cost a third of the compilations (the DiT's muP
# check 24.2 -> 14.4 CPU-s, the transformer's two 27 -> 18, the slopes the same to the last digit).
WIDTHS = (48, 192)  # the transformer's SwiGLU width, 8/3 of these rounded to 128, stays 8/3 of them
# 4 seeds, not fewer: with 2 the DiT's final adaLN modulation's muP slope is -0.105, past the 0.1.
CHECK = dict(steps=5, learning_rate=3e-3, seeds=4)
# The transformer's blocks unrolled (scan_layers=False): the same model and the same numbers to the
# last digit (test_transformer.py's scanned-against-unrolled test), and its four programs compile
# faster unrolled at depth 2 (the check 18.2, 18.3 -> 13.2, 13.7 CPU-s); the DiT's do not (25.4 -> 25.9).
LM = dict(
    vocab_size=64, seq_len=16, depth=2, num_heads=4, mup_base_width=48, dtype="float32", remat="none", scan_layers=False
)
DIT = dict(
    input_size=8, in_channels=1, patch_size=2, depth=2, num_heads=4, num_classes=4, mup_base_width=48, dtype="float32"
)


def test_slope_is_the_power_law_exponent():
    assert slope([1, 2, 4], [3.0, 6.0, 12.0]) == pytest.approx(1.0)
    assert slope([64, 128, 256], [0.5, 0.5, 0.5]) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("architecture, fields", [("transformer", LM), ("simple_dit", {**DIT, "remat": "none"})])
def test_under_mup_no_hidden_layer_moves_with_the_width_and_under_sp_the_output_grows(architecture, fields):
    mup = coordinate_check(architecture, fields, WIDTHS, mup=True, **CHECK)
    sp = coordinate_check(architecture, fields, WIDTHS, mup=False, **CHECK)
    blocks = {f"blocks_{i}" for i in range(fields["depth"])}
    assert blocks <= set(mup.rms) and "output" in mup.rms and set(mup.rms) == set(sp.rms)
    hidden = {name: s for name, s in mup.slopes.items() if name != "output"}
    assert max(abs(s) for s in hidden.values()) < 0.1, hidden
    # muP's output does not grow (its initial part, 0.02·sqrt(width)/m, shrinks as 1/sqrt(m): the
    # transformer's slope is about -0.2 at this rate), SP's does
    assert mup.slopes["output"] < 0.1, mup.slopes
    assert sp.slopes["output"] > 0.3, sp.slopes


def dit(seed=0, **fields):
    return build("simple_dit", {**DIT, "matmul_precision": "highest", **fields}, nnx.Rngs(seed))


def perturb(*models: nnx.Module) -> None:
    """Add one draw of N(0, 0.1^2) to every parameter of each of ``models`` (the same draw to each).
    NumPy draws it: jax.random.normal compiles a program for each parameter shape, 3.0 CPU-s for the
    DiT's against 0.01."""
    rng = np.random.default_rng(1)
    noise = jax.tree.map(lambda x: 0.1 * rng.standard_normal(x.shape, np.float32), nnx.state(models[0], nnx.Param))
    for model in models:
        moved = jax.tree.map(lambda p, n: jnp.asarray(np.asarray(p) + n), nnx.state(model, nnx.Param), noise)
        nnx.update(model, moved)


def forward(model: nnx.Module, *inputs: jax.Array) -> np.ndarray:
    """``model(*inputs)`` compiled as one program: op by op, the DiT's first forward compiled each op
    on its own (1.13 + 0.31 CPU-s for the base-width pair, against 0.59 + 0.40)."""
    graphdef, state = nnx.split(model)
    return np.asarray(jax.jit(lambda state, *inputs: nnx.merge(graphdef, state)(*inputs))(state, *inputs))


@pytest.mark.slow
def test_dit_under_mup_at_its_base_width_is_the_standard_model():
    standard, base = dit(hidden_size=48), dit(mup=True, hidden_size=48)
    for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(standard)), nnx.to_flat_state(nnx.state(base))):
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(path))
    assert base.blocks.attn.scale == standard.blocks.attn.scale == 1 / np.sqrt(12)
    # trained away from adaLN-Zero's zeros (a random perturbation of every parameter), the same outputs
    perturb(standard, base)
    x = jax.random.normal(jax.random.key(2), (2, 8, 8, 1))
    t, y = jnp.array([0.3, 0.7]), jnp.array([1, 4])
    out = forward(standard, x, t, y)
    assert float(np.abs(out).max()) > 0.1
    np.testing.assert_array_equal(forward(base, x, t, y), out)


@pytest.mark.slow
def test_dit_under_mup_divides_its_output_by_the_width_multiplier_and_rescales_its_init():
    wide, narrow = dit(mup=True, hidden_size=96), dit(mup=True, hidden_size=96, mup_base_width=24)  # m = 2 and 4
    assert wide.blocks.attn.scale == pytest.approx(np.sqrt(12) / 24)  # head_dim 24, 12 at the base width
    assert narrow.blocks.attn.scale == pytest.approx(np.sqrt(6) / 24)
    # the timestep MLP's hidden x hidden matrix at 0.02 / sqrt(m); the patch embedding at the base width's Xavier
    assert float(jnp.std(wide.t_embedder.mlp_out.kernel[...])) == pytest.approx(0.02 / np.sqrt(2), rel=0.05)
    assert float(jnp.std(wide.x_embedder.kernel[...])) == pytest.approx(np.sqrt(2 / (4 + 48)), rel=0.05)
    nnx.update(narrow, nnx.state(wide))
    perturb(wide, narrow)
    nnx.update(narrow, nnx.state(wide))
    x, t, y = jax.random.normal(jax.random.key(2), (2, 8, 8, 1)), jnp.array([0.3, 0.7]), jnp.array([1, 4])
    narrow.blocks.attn.scale = wide.blocks.attn.scale  # the same attention: only the readout differs
    np.testing.assert_allclose(forward(narrow, x, t, y), forward(wide, x, t, y) / 2, rtol=1e-5, atol=1e-7)
