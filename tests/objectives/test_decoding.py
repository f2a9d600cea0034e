"""Decoding with the key/value cache: the cache's logits against the full forward pass, greedy samples
token for token against the uncached path (GQA or not, scanned or unrolled, past seq_len through the
moving window), the window's schedule, seeded draws."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.config import ModelConfig
from dew.models.kv_cache import KVCache
from dew.objectives.autoregressive import NextToken
from dew.objectives.decoding import context_start, generate
from dew.objectives.next_token import NextTokenKnobs

V, L = 32, 8
# A larger init than the default 0.02 spreads the logits, so greedy decoding does not just repeat a token.
TINY = dict(
    vocab_size=V,
    seq_len=L,
    hidden_size=32,
    depth=2,
    num_heads=4,
    qk_norm=True,
    init_std=0.3,
    matmul_precision="highest",
)
SHAPES = {
    "gqa-scan": dict(num_kv_heads=2, scan_layers=True),
    "mha-tied-unrolled": dict(num_kv_heads=None, scan_layers=False, tie_embeddings=True, qk_norm=False),
}
PROMPTS = jnp.asarray([[3, 3], [5, 1], [9, 2]], jnp.int32)


def objective(**overrides) -> tuple[NextToken, nnx.Module]:
    fields = {**TINY, **overrides}
    o = NextToken(ModelConfig("transformer", fields, dtype="float32"), NextTokenKnobs(), V, L)
    return o, o.build(nnx.Rngs(params=0))


def incremental_logits(model: nnx.Module, tokens_BxL: jax.Array) -> tuple[jax.Array, KVCache]:
    """A 3-token prefill, then one token per call, through one jit: the calls a scan over the rest
    (unrolled, the L - 3 calls' copies of the model made the program ~0.45 CPU-s longer to compile)."""
    graphdef, state = nnx.split(model)

    @jax.jit
    def run(state, tokens):
        m = nnx.merge(graphdef, state)
        first, cache = m.extend(tokens[:, :3], m.init_cache(tokens.shape[0]))

        def one(cache, token_B):
            logits, cache = m.extend(token_B[:, None], cache)
            return cache, logits[:, 0]

        cache, rest_LxBxV = jax.lax.scan(one, cache, tokens[:, 3:].T)
        return jnp.concatenate([first, rest_LxBxV.transpose(1, 0, 2)], axis=1), cache

    return run(state, tokens_BxL)


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES)
def test_the_cache_gives_the_full_forward_and_greedy_samples_equal_the_uncached_path(shape):
    _o, model = objective(**SHAPES[shape])
    graphdef, state = nnx.split(model)
    tokens = jax.random.randint(jax.random.key(1), (2, L), 0, V)
    logits, cache = incremental_logits(model, tokens)
    np.testing.assert_allclose(logits, model(tokens), rtol=1e-5, atol=1e-5)
    kv_heads = SHAPES[shape]["num_kv_heads"] or 4
    assert cache.k.shape == (2, 2, L, kv_heads, 8) and int(cache.length) == L  # (depth, B, size, K, H)

    # Three prompts, 3 * seq_len + 3 new tokens: the first window, then three moves of it.
    new = 3 * L + 3
    run = {
        cached: generate(
            graphdef, state, PROMPTS, jax.random.PRNGKey(0), jnp.float32(1.0), new=new, window=L, top_k=1, cached=cached
        )
        for cached in (True, False)
    }
    cached, uncached = np.asarray(run[True]), np.asarray(run[False])
    assert cached.shape == (3, 2 + new) and (cached[:, :2] == PROMPTS).all()
    np.testing.assert_array_equal(cached, uncached)
    assert len(set(cached[:, 2:].ravel().tolist())) > 3  # not one token repeated


@pytest.mark.slow
def test_greedy_samples_equal_an_explicit_loop_over_the_window():
    """Each token is the argmax of the model's logits on the window's tokens, run from position 0 (the
    window padded to seq_len: later tokens do not reach earlier logits)."""
    o, model = objective(**SHAPES["gqa-scan"])
    forward = jax.jit(lambda t: model(t))
    ids = [5, 1]
    while len(ids) < 2 + 3 * L + 3:
        i = len(ids) - 1
        context = ids[context_start(i, L) :]
        assert len(context) <= L
        padded = jnp.asarray([context + [0] * (L - len(context))])
        ids.append(int(np.asarray(forward(padded))[0, len(context) - 1].argmax()))
    got = np.asarray(o.sample(model, 3, jax.random.PRNGKey(0), prompt=[5, 1], top_k=1, max_new_tokens=3 * L + 3))
    np.testing.assert_array_equal(got[0], ids)


def test_the_window_keeps_half_of_itself_when_it_moves_on():
    # seq_len 8: tokens 0..7 from position 0; token 8 is fed after 4..7 re-run from position 0, and so
    # on every 4 tokens; context_start also works on traced indices.
    assert [context_start(i, 8) for i in (0, 7, 8, 11, 12, 15, 16)] == [0, 0, 4, 4, 8, 8, 12]
    assert [int(context_start(jnp.asarray(i), 8)) for i in (7, 8, 12)] == [0, 4, 8]
    assert [context_start(i, 3) for i in (2, 3, 4, 5, 6)] == [0, 2, 2, 4, 4]  # keep 1, stride 2


def test_seeded_samples_repeat_and_differ_by_seed():
    o, model = objective(num_kv_heads=2)
    a, b, c = (
        np.asarray(o.sample(model, 8, jax.random.PRNGKey(s), temperature=3.0, max_new_tokens=12)) for s in (0, 0, 1)
    )
    assert a.shape == (8, 13) and (a == b).all() and (a != c).any()
    assert (a[:, 0] == 0).all()  # without a tokenizer the default prompt is id 0
    assert a.min() >= 0 and a.max() < V


def test_bad_lengths_are_refused_with_the_limit():
    o, model = objective()
    with pytest.raises(ValueError, match="max_new_tokens=0 must be >= 1"):
        o.sample(model, 1, jax.random.PRNGKey(0), max_new_tokens=0)
    with pytest.raises(ValueError, match="1 to seq_len - 1 = 7"):
        o.sample(model, 1, jax.random.PRNGKey(0), prompt=list(range(L)))
    with pytest.raises(ValueError, match="1 to seq_len=8"):
        model.init_cache(1, L + 1)


@pytest.mark.slow
def test_a_padded_vocabulary_draws_only_the_datas_ids():
    """A model of 2·V rows (``vocab_size`` padded past the data's V, as Qwen2.5's embedding is) draws
    among the data's V ids alone: at a temperature that makes the rows near-uniform, 96 draws over
    the whole table would fall past V with probability 1 - 2^-96."""
    o, model = objective(vocab_size=2 * V)
    # The logits are every row's: their shape, which tracing the forward gives (no compilation).
    assert nnx.eval_shape(lambda m: m(jnp.zeros((1, L), jnp.int32)), model).shape == (1, L, 2 * V)
    ids = np.asarray(o.sample(model, 8, jax.random.PRNGKey(0), temperature=1e4, max_new_tokens=12))
    assert ids.max() < V and len(set(ids[:, 1:].ravel().tolist())) > V // 2  # near-uniform over the V
