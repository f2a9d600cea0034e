"""Documents packed into one row (``segment_ids``, ``positions``): each document's per-token losses are
the ones it has run alone, through the full model and through the key/value cache, and the
maximum logits MuonClip reads are the documents' own."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dew.models import build
from dew.objectives.tokens import next_token_inputs

FIELDS = dict(
    vocab_size=40,
    seq_len=32,
    hidden_size=32,
    depth=2,
    num_heads=4,
    num_kv_heads=2,
    rope_theta=100.0,
    matmul_precision="highest",
    attention_impl="xla",
)
LENGTHS = (7, 12, 9)  # three documents and 5 padding tokens in a row of 33


def packed_row():
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 40, n).astype(np.int32) for n in LENGTHS]
    width = FIELDS["seq_len"] + 1
    tokens, seg, pos = np.zeros(width, np.int32), np.zeros(width, np.int32), np.zeros(width, np.int32)
    at = 0
    for i, d in enumerate(docs):
        tokens[at : at + len(d)], seg[at : at + len(d)], pos[at : at + len(d)] = d, i + 1, np.arange(len(d))
        at += len(d)
    batch = {"tokens": tokens[None], "segment_ids": seg[None], "positions": pos[None]}
    return docs, {k: jnp.asarray(v) for k, v in batch.items()}


def per_token_losses(logits, targets):
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)


@pytest.mark.slow
def test_each_documents_losses_in_a_packed_row_are_its_own_alone_and_through_the_cache():
    model = build("transformer", FIELDS, nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    docs, batch = packed_row()

    @jax.jit
    def packed(state, batch):
        inputs, targets, weight, kwargs = next_token_inputs(batch)
        return per_token_losses(nnx.merge(graphdef, state)(inputs, **kwargs), targets)[0], weight[0]

    @jax.jit
    def alone(state, doc):
        return per_token_losses(nnx.merge(graphdef, state)(doc[None, :-1]), doc[None, 1:])[0]

    @jax.jit
    def cached_step(state, token, cache):
        logits, cache = nnx.merge(graphdef, state).extend(token[None, None], cache)
        return logits[0, 0], cache

    losses, weight = packed(state, batch)
    # every target inside a document counts; the boundary targets and the padding do not
    starts = np.cumsum((0,) + LENGTHS)
    want_weight = np.zeros(FIELDS["seq_len"])
    for s, n in zip(starts, LENGTHS):
        want_weight[s : s + n - 1] = 1
    np.testing.assert_array_equal(weight, want_weight)
    for s, doc in zip(starts, docs):
        own = np.asarray(alone(state, jnp.asarray(doc)))
        np.testing.assert_allclose(losses[s : s + len(doc) - 1], own, rtol=0, atol=1e-5)
        cache = model.init_cache(1, 16)
        logits = []
        for token in doc[:-1]:  # one token per call through the key/value cache
            step_logits, cache = cached_step(state, jnp.asarray(token), cache)
            logits.append(step_logits)
        through_cache = per_token_losses(jnp.stack(logits), jnp.asarray(doc[1:]))
        np.testing.assert_allclose(losses[s : s + len(doc) - 1], through_cache, rtol=0, atol=1e-5)
    assert np.abs(np.diff(losses[: LENGTHS[0] - 1])).max() > 1e-3  # the losses are not all alike


@pytest.mark.slow
def test_max_logits_of_a_packed_row_are_the_largest_of_its_documents_alone():
    model = build("transformer", FIELDS, nnx.Rngs(1))
    graphdef, state = nnx.split(model)
    docs, batch = packed_row()

    @jax.jit
    def max_logits(state, tokens, segment_ids=None, positions=None):
        call = nnx.merge(graphdef, state)
        return call(tokens, segment_ids=segment_ids, positions=positions, return_max_logits=True)[1]

    inputs = {k: v[:, :-1] for k, v in batch.items()}  # the last document ends before the padding
    packed = max_logits(state, inputs["tokens"], inputs["segment_ids"], inputs["positions"])
    each = [max_logits(state, jnp.asarray(d)[None]) for d in docs]
    assert packed.shape == (FIELDS["depth"], FIELDS["num_heads"])
    np.testing.assert_allclose(packed, jnp.max(jnp.stack(each), axis=0), rtol=1e-5, atol=1e-5)
    unpacked = max_logits(state, inputs["tokens"])  # across the boundaries and the padding: larger
    assert (np.asarray(unpacked) >= np.asarray(packed) - 1e-6).all() and (
        np.asarray(unpacked) > np.asarray(packed)
    ).any()
