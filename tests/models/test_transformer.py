"""transformer: causality through gradients, GQA/QK-norm/tied head, muP's logit scale, scanned
against unrolled, the reported maximum logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.models import build
from dew.models.attention import apply_rope, rope_tables

TINY = dict(
    vocab_size=32,
    seq_len=8,
    hidden_size=32,
    depth=2,
    num_heads=4,
    num_kv_heads=2,
    qk_norm=True,
    matmul_precision="highest",
)


def tiny(**overrides):
    return build("transformer", {**TINY, **overrides}, nnx.Rngs(0))


@pytest.mark.slow
def test_an_early_output_has_no_gradient_from_a_later_token():
    model = tiny(depth=1)
    graphdef, state = nnx.split(model)
    tokens = jnp.arange(8, dtype=jnp.int32)[None]  # token j appears only at position j

    def outputs(state):  # one number per position
        return nnx.merge(graphdef, state)(tokens)[0].sum(-1)

    # one program for both positions: i is an argument, not a constant (one compile, not two)
    grad_of = jax.jit(jax.grad(lambda state, i: outputs(state)[i]))
    for i in (0, 4):  # output i is moved by the tokens at positions 0..i, and by no later one
        grad = grad_of(state, i)["embed"]["embedding"][...]
        seen_J = np.abs(np.asarray(grad)[:8]).sum(-1)
        np.testing.assert_array_equal(seen_J > 0, np.arange(8) <= i)


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": True, "num_kv_heads": 1, "qk_norm": False}])
def test_scanned_and_unrolled_give_the_same_outputs(overrides, jitted):
    tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, 32)
    out_s, ml_s = jitted(tiny(scan_layers=True, **overrides), return_max_logits=True)(tokens)
    out_u, ml_u = jitted(tiny(scan_layers=False, **overrides), return_max_logits=True)(tokens)
    assert out_s.shape == (2, 8, 32) and ml_s.shape == (2, 4)
    np.testing.assert_allclose(out_s, out_u, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ml_s, ml_u, rtol=1e-5, atol=1e-6)


def param_shapes(model):
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    return {"/".join(map(str, path)): variable[...].shape for path, variable in flat}


def test_parameter_layout():
    shapes = param_shapes(tiny())
    assert shapes["blocks/attn/q/kernel"] == (2, 32, 4, 8)
    assert shapes["blocks/attn/k/kernel"] == (2, 32, 2, 8)
    assert shapes["blocks/attn/o/kernel"] == (2, 4, 8, 32)
    assert shapes["blocks/attn/q_norm/scale"] == (2, 8)
    assert shapes["blocks/mlp_gate/kernel"] == (2, 32, 128)
    assert shapes["lm_head/kernel"] == (32, 32)
    assert not any(k.endswith("bias") for k in shapes)
    assert not any(k.startswith("lm_head") for k in param_shapes(tiny(tie_embeddings=True)))


def explicit_max_logits(model, tokens):
    """Each block's causal attention logits computed by hand from its parameters, maxed per head."""
    x = model.embed(tokens)
    rope = rope_tables(jnp.arange(8), 8, 10000.0)
    graphdef, state = nnx.split(model.blocks)
    maxima = []
    for i in range(2):
        block = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))
        h = block.attn_norm(x)
        q = apply_rope(block.attn.q_norm(block.attn.q(h)), rope)
        k = jnp.repeat(apply_rope(block.attn.k_norm(block.attn.k(h)), rope), 2, axis=2)
        logits = jnp.einsum("btnh,bsnh->bnts", q, k, precision="highest") * block.attn.scale
        logits = jnp.where(jnp.tril(jnp.ones((8, 8), bool)), logits, -jnp.inf)
        maxima.append(logits.max(axis=(0, 2, 3)))
        x, _ = block(x, rope, False)
    return jnp.stack(maxima)


def test_max_logits_equal_an_explicit_computation_per_block(jitted):
    model = tiny()
    tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, 32)
    _, got = jitted(model, return_max_logits=True)(tokens)
    want = jax.jit(lambda tokens: explicit_max_logits(model, tokens))(tokens)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_mup_divides_logits_by_the_width_multiplier(jitted):
    tokens = jax.random.randint(jax.random.key(2), (2, 8), 0, 32)
    # the same attention scale in both (the base head_dim given): only the logit multiplier differs
    wide = tiny(mup=True, mup_base_width=16, mup_base_head_dim=4)  # width multiplier 2
    narrow = tiny(mup=True, mup_base_width=8, mup_base_head_dim=4)  # width multiplier 4, same parameters
    assert wide.blocks.attn.scale == narrow.blocks.attn.scale == 2 / 8
    # Same parameters, a twice larger width multiplier: exactly half the logits.
    nnx.update(narrow, nnx.state(wide))
    np.testing.assert_allclose(jitted(narrow)(tokens), jitted(wide)(tokens) / 2, rtol=1e-6)


@pytest.mark.parametrize(
    "fields, scale",
    [
        ({}, 1 / 8**0.5),  # standard: 1/sqrt(head_dim), head_dim 32/4
        ({"mup": True, "mup_base_width": 32}, 1 / 8**0.5),  # muP at its base width: the standard model
        ({"mup": True, "mup_base_width": 8}, 2**0.5 / 8),  # width x4, head_dim x4: sqrt(base head_dim 2)/8
        ({"mup": True, "mup_base_width": 8, "mup_base_head_dim": 8}, 1 / 8**0.5),  # heads grew instead
        ({"mup": True, "mup_base_width": 8, "mup_base_head_dim": 1}, 1 / 8),  # lm-engine's plain 1/head_dim
    ],
)
def test_mups_attention_scale_is_the_standard_one_at_the_base_head_dim(fields, scale):
    from dew.models.decoder import attention_scale
    from dew.models.transformer import TransformerFields

    assert attention_scale(TransformerFields(**{**TINY, **fields})) == pytest.approx(scale, rel=1e-12)


@pytest.mark.slow
def test_embedding_and_residual_multipliers_act(jitted):
    tokens = jax.random.randint(jax.random.key(3), (1, 8), 0, 32)
    base = jitted(tiny())(tokens)
    assert np.abs(jitted(tiny(embedding_multiplier=3.0))(tokens) - base).max() > 1e-4
    # A zero residual multiplier removes every block: logits are the head on the normed embedding.
    model = tiny(residual_multiplier=0.0)
    expected = model.lm_head(model.final_norm(model.embed(tokens)))
    np.testing.assert_allclose(jitted(model)(tokens), expected, rtol=1e-5, atol=1e-6)


def test_sequence_longer_than_seq_len_raises():
    with pytest.raises(ValueError, match="length <= seq_len=8"):
        tiny()(jnp.zeros((1, 9), jnp.int32))


@pytest.mark.slow
def test_a_sliding_window_keeps_each_query_to_its_latest_positions_and_the_cache_follows_it():
    """``sliding_window=3`` (Mistral's): output ``i`` has a gradient from the tokens at ``i-2..i`` of
    a one-block model and from none earlier; over the key/value cache (a prompt of 3, then one token a
    call) the logits are the full forward's; without the window the same weights give others."""
    model = tiny(depth=1, sliding_window=3, qk_norm=False, qkv_bias=True)
    graphdef, state = nnx.split(model)
    tokens = jnp.arange(8, dtype=jnp.int32)[None]
    grad = jax.jit(jax.grad(lambda s: nnx.merge(graphdef, s)(tokens)[0, 6].sum()))(state)["embed"]["embedding"][...]
    np.testing.assert_array_equal(np.abs(np.asarray(grad)[:8]).sum(-1) > 0, (np.arange(8) >= 4) & (np.arange(8) <= 6))

    @jax.jit
    def cached(state, tokens):
        m = nnx.merge(graphdef, state)
        first, cache = m.extend(tokens[:, :3], m.init_cache(1))
        rest = []
        for i in range(3, 8):
            logits, cache = m.extend(tokens[:, i : i + 1], cache)
            rest.append(logits)
        return jnp.concatenate([first, *rest], axis=1)

    full = np.asarray(model(tokens))
    np.testing.assert_allclose(np.asarray(cached(state, tokens)), full, atol=1e-5)
    unwindowed = tiny(depth=1, qk_norm=False, qkv_bias=True)
    nnx.update(unwindowed, nnx.state(model))
    plain = np.asarray(unwindowed(tokens))
    assert np.abs(plain[:, 3:] - full[:, 3:]).max() > 1e-3
    assert np.abs(plain[:, :3] - full[:, :3]).max() < 1e-5
    assert nnx.state(model, nnx.Param)["blocks"]["attn"]["q"]["bias"].shape == (1, 4, 8)
