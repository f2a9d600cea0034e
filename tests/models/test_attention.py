"""The shared attention layer: the xla kernel against a naive softmax reference, the kernel choice,
and the reported maximum logits."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.models.attention import Attention, attend, choose_implementation, max_logits
from dew.models.precision import Precision

F32 = Precision(jnp.dtype(jnp.float32), jnp.dtype(jnp.float32), "highest")


def naive_logits(q, k, scale, causal, kv_lengths):
    """scale·QKᵀ per query head (GQA by repeating key heads), -inf where masked: (B, N, T, S)."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    k = np.repeat(k, q.shape[2] // k.shape[2], axis=2)
    logits = np.einsum("btnh,bsnh->bnts", q, k) * scale
    B, T, S = q.shape[0], q.shape[1], k.shape[1]
    allowed = np.ones((B, 1, T, S), bool)
    if causal:
        allowed &= np.tril(np.ones((T, S), bool))
    if kv_lengths is not None:
        allowed &= (np.arange(S)[None, :] < np.asarray(kv_lengths)[:, None])[:, None, None, :]
    return np.where(allowed, logits, -np.inf)


def naive_attention(q, k, v, scale, causal=False, kv_lengths=None):
    logits = naive_logits(q, k, scale, causal, kv_lengths)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    v = np.repeat(np.asarray(v, np.float64), q.shape[2] // v.shape[2], axis=2)
    return np.einsum("bnts,bsnh->btnh", weights, v)


CASES = {  # name: (num_heads, num_kv_heads, causal, kv_lengths)
    "multi-head": (4, 4, False, None),
    "grouped-query": (4, 2, False, None),
    "multi-query": (4, 1, False, None),
    "causal": (4, 4, True, None),
    "causal grouped-query": (4, 2, True, None),
    "padded": (4, 4, False, [7, 3]),
    "padded causal grouped-query": (4, 2, True, [5, 7]),
}


@pytest.mark.parametrize("case", CASES)
def test_xla_attention_matches_naive_softmax(case):
    N, K, causal, lengths = CASES[case]
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, (2, 7, N, 8))
    k, v = jax.random.normal(kk, (2, 7, K, 8)), jax.random.normal(kv, (2, 7, K, 8))
    kv_lengths = None if lengths is None else jnp.array(lengths, jnp.int32)
    out = attend(q, k, v, scale=0.3, causal=causal, kv_lengths=kv_lengths, impl="xla", matmul_precision="highest")
    np.testing.assert_allclose(out, naive_attention(q, k, v, 0.3, causal, kv_lengths), atol=1e-5)
    got = max_logits(q, k, scale=0.3, causal=causal, kv_lengths=kv_lengths, matmul_precision="highest")
    want = naive_logits(q, k, 0.3, causal, kv_lengths).max(axis=(0, 2, 3))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_max_logits_exclude_masked_entries_and_the_gradient():
    q = jnp.zeros((1, 3, 1, 2)).at[0, 0, 0].set(jnp.array([1.0, 0.0]))
    k = jnp.zeros((1, 3, 1, 2)).at[0, 2, 0].set(jnp.array([100.0, 0.0]))  # only a future/padded key is large
    assert float(max_logits(q, k, scale=1.0)[0]) == 100.0
    assert float(max_logits(q, k, scale=1.0, causal=True)[0]) == 0.0
    assert float(max_logits(q, k, scale=1.0, kv_lengths=jnp.array([2]))[0]) == 0.0
    grad = jax.grad(lambda q: max_logits(q, k, scale=1.0).sum())(q)
    assert not np.any(grad)


def test_auto_chooses_xla_on_cpu_and_says_so(caplog):
    with caplog.at_level(logging.INFO, logger="dew.models.attention"):
        import dew.models.attention as attention

        attention._logged.clear()
        assert choose_implementation("auto", jnp.bfloat16, 64) == "xla"
    assert "chose xla" in caplog.text and "not a CUDA GPU" in caplog.text
    assert choose_implementation("xla", jnp.bfloat16, 64) == "xla"


def test_explicit_cudnn_that_cannot_run_raises_why():
    with pytest.raises(ValueError, match=r"attention_impl='cudnn' cannot run.*not a CUDA GPU.*float32"):
        choose_implementation("cudnn", jnp.float32, 12)


@pytest.mark.slow
def test_layer_reports_the_max_of_its_explicit_logits():
    layer = Attention(16, 4, num_kv_heads=2, precision=F32, rngs=nnx.Rngs(0), qk_norm=True)
    x = jax.random.normal(jax.random.key(1), (2, 5, 16))
    out, got = layer(x, causal=True, return_max_logits=True)
    q, k = layer.q_norm(layer.q(x)), layer.k_norm(layer.k(x))
    want = naive_logits(q, k, layer.scale, True, None).max(axis=(0, 2, 3))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert out.shape == x.shape and got.shape == (4,) and got.dtype == jnp.float32
    np.testing.assert_array_equal(out, layer(x, causal=True))
