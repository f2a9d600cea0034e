"""Training FLOPs per example: the counted matmul weights are the model's, the formula is 6·N·T plus
the attention term."""

import numpy as np
import pytest
from flax import nnx

from dew.models import build, flops_per_example, of


def matmul_weights(model):
    """Every kernel (embedding tables are lookups, not matmuls)."""
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return sum(int(np.prod(v.shape)) for path, v in flat if path[-1] == "kernel")


@pytest.mark.parametrize(
    "values",
    [
        dict(input_size=8, in_channels=3, patch_size=2, hidden_size=32, depth=3, num_heads=4, learn_sigma=True),
        dict(input_size=12, vocab_size=50, hidden_size=32, depth=2, num_heads=4),
    ],
)
def test_simple_dit_counts_its_own_matmul_weights(values):
    model = nnx.eval_shape(lambda: build("simple_dit", values, nnx.Rngs(0)))
    per_token, per_example, tokens = of("simple_dit", values).matmul_params()
    assert per_token + per_example == matmul_weights(model)
    D, T, L = 32, tokens, values["depth"]
    assert flops_per_example("simple_dit", values) == 6 * (per_token * T + per_example) + 12 * L * T * T * D


def test_transformer_counts_its_own_matmul_weights_and_the_tied_head():
    values = dict(
        vocab_size=64, seq_len=16, hidden_size=32, depth=2, num_heads=4, num_kv_heads=2, head_dim=16, mlp_hidden=48
    )
    model = nnx.eval_shape(lambda: build("transformer", values, nnx.Rngs(0)))
    per_token, _, tokens = of("transformer", values).matmul_params()
    assert per_token == matmul_weights(model) and tokens == 16
    expected = 6 * per_token * 16 + 12 * 2 * 16 * 16 * (4 * 16)
    assert flops_per_example("transformer", values) == expected
    assert flops_per_example("transformer", {**values, "tie_embeddings": True}) == expected
