"""masked_diffusion (MDLM): the loss at initialisation, SUBS, the times, the sampler, the data fields."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.build import build_run
from dew.config import ModelConfig, TrainerConfig
from dew.contract.typed import ConfigError
from dew.data.specs import TokenWindows
from dew.objectives.masked_diffusion import MaskedDiffusionKnobs
from dew.objectives.mdlm import MaskedDiffusion, subs_log_probs
from dew.recipe import Recipe

V, L = 11, 16
TINY = {"hidden_size": 32, "depth": 1, "num_heads": 2}


def objective(**knobs) -> MaskedDiffusion:
    fields = {**TINY, "vocab_size": V + 1, "input_size": L, "num_classes": 0}
    return MaskedDiffusion(ModelConfig("simple_dit", fields, dtype="float32"), MaskedDiffusionKnobs(**knobs), V, L)


@pytest.fixture(scope="module")
def model() -> nnx.Module:
    return objective().build(nnx.Rngs(params=0))


def jitted(fn, model: nnx.Module, **static):
    """``fn(model, *args)`` compiled, the parameters passed as arguments (XLA:CPU's YNNPACK fusion
    miscompiles some of these graphs when the parameters are compile-time constants)."""
    graphdef, state = nnx.split(model)
    call = jax.jit(lambda state, *args: fn(nnx.merge(graphdef, state), *args, **static))
    return lambda *args: call(state, *args)


def tokens(n: int, seed: int = 0) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(seed).integers(0, V, (n, L + 1)), jnp.int32)


@pytest.mark.slow
def test_loss_at_init_is_log_v_per_token(model):
    """simple_dit's output layer starts at zero: every masked token costs log V (the mask is never
    predicted), and E[1{masked} / t] = 1, so the expected loss is log V per token."""
    o = objective()
    batch = {"tokens": tokens(512)}
    logits = jitted(lambda m, x, t: m(x, t), model)(batch["tokens"][:, :L], jnp.full((512,), 0.5))
    assert float(jnp.abs(logits).max()) == 0.0
    out = jitted(o.loss, model)(batch, jax.random.PRNGKey(0))
    assert float(out.count) == 512 * L
    assert float(out.total / out.count) == pytest.approx(math.log(V), rel=0.02)
    # Exactly: each masked token costs log V / t, each unmasked one nothing.
    x0 = batch["tokens"][:, :L]
    t = o.times(jax.random.split(jax.random.PRNGKey(0))[0], 512, antithetic=True)
    z = o.corrupt(jax.random.split(jax.random.PRNGKey(0))[1], x0, t)
    expected = float(((z == V) / t[:, None]).sum() * math.log(V))
    assert float(out.total) == pytest.approx(expected, rel=1e-5)


def test_subs_never_predicts_the_mask_and_carries_unmasked_tokens():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(3, L, V + 1)) * 5, jnp.float32)
    z = jnp.asarray(rng.integers(0, V + 1, (3, L)), jnp.int32)
    z = z.at[:, 0].set(V).at[:, 1].set(2)  # at least one masked and one unmasked position per row
    p = np.asarray(jnp.exp(subs_log_probs(logits, z, V)))
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)
    assert (p[..., V] == 0.0).all()  # zero masking probability, exactly
    unmasked = np.asarray(z != V)
    one_hot = np.eye(V + 1)[np.asarray(z)]
    assert (p[unmasked] == one_hot[unmasked]).all()  # carry-over unmasking, exactly one-hot
    masked = ~unmasked
    want = jax.nn.softmax(logits[..., :V], axis=-1)
    np.testing.assert_allclose(p[masked][:, :V], np.asarray(want)[masked], rtol=1e-5, atol=1e-7)


def test_unmasked_positions_cost_nothing_and_time_weights_by_one_over_t(model):
    o = objective()
    x0 = tokens(4)[:, :L]
    t = jnp.array([0.1, 0.3, 0.6, 0.9])
    z = x0.at[:, ::2].set(V)
    per_token, _ = jitted(o.per_token, model)(x0, t, z)
    assert (np.asarray(per_token)[:, 1::2] == 0).all()
    np.testing.assert_allclose(
        np.asarray(per_token)[:, ::2], np.broadcast_to(math.log(V) / np.asarray(t)[:, None], (4, L // 2)), rtol=1e-5
    )


def test_antithetic_times_cover_every_stripe():
    o = objective(eps=1e-3)
    t = np.asarray(o.times(jax.random.PRNGKey(3), 8, antithetic=True))
    u = (t - 1e-3) / (1 - 1e-3)
    assert sorted(np.floor(u * 8).astype(int)) == list(range(8))
    assert t.min() >= 1e-3 and t.max() <= 1.0


def test_evaluation_is_deterministic_given_the_key_and_ignores_padding(model):
    o = objective()
    evaluate = jitted(o.evaluate, model)
    batch = {"tokens": tokens(8), "mask": jnp.array([1, 1, 1, 1, 1, 1, 0, 0], jnp.float32)}
    a = evaluate(batch, jax.random.PRNGKey(5))
    b = evaluate(batch, jax.random.PRNGKey(5))
    assert float(a.total) == float(b.total) and float(a.count) == 6 * L
    assert float(a.sums["bits_per_token"]) == pytest.approx(float(a.total) / math.log(2))
    other = dict(batch, tokens=batch["tokens"].at[6:].set(0))  # the padding's content changes nothing
    assert float(evaluate(other, jax.random.PRNGKey(5)).total) == float(a.total)


@pytest.mark.slow
def test_max_logits_on_request(model):
    o = objective()
    out = jitted(o.loss, model, max_logits=True)({"tokens": tokens(2)}, jax.random.PRNGKey(0))
    assert out.max_logits.shape == (1, 2)
    # Without the request: no max_logits in the output's structure, which tracing alone gives (no
    # second compilation of the loss).
    plain = jax.eval_shape(jitted(o.loss, model), {"tokens": tokens(2)}, jax.random.PRNGKey(0))
    assert plain.max_logits is None and plain.total.shape == out.total.shape


@pytest.mark.slow
def test_sampler_ends_with_no_mask(model):
    o = objective()
    model = nnx.clone(model)
    # Random weights in the output layer, so the sampler draws from a non-uniform p_θ.
    final = model.final_layer.linear
    final.kernel[...] = jax.random.normal(jax.random.PRNGKey(2), final.kernel.shape)
    for steps, top_k in [(1, 0), (5, 3)]:
        ids = np.asarray(o.sample(model, 6, jax.random.PRNGKey(0), steps=steps, top_k=top_k))
        assert ids.shape == (6, L) and ids.min() >= 0 and ids.max() < V
        assert len(np.unique(ids)) > 1
        again = np.asarray(o.sample(model, 6, jax.random.PRNGKey(0), steps=steps, top_k=top_k))
        assert (ids == again).all()


def test_data_fields_add_the_mask_token_and_are_recorded(tmp_path):
    ids = np.random.default_rng(0).integers(0, V, 400).astype(np.uint16)
    path = tmp_path / "t.npy"
    np.save(path, ids)
    run = Recipe(
        model=ModelConfig("simple_dit", TINY, dtype="float32"),
        data=TokenWindows(path=str(path), seq_len=L, vocab_size=V),
        trainer=TrainerConfig(batch_size=4, steps=1),
    )
    resolved, o, _ = build_run(run)
    assert isinstance(o, MaskedDiffusion) and o.vocab_size == V and o.mask_id == V
    assert resolved.model.config["vocab_size"] == V + 1 and resolved.model.config["input_size"] == L
    assert resolved.model.config["num_classes"] == 0
    assert Recipe.from_dict(resolved.to_dict()).model.config == resolved.model.config
    wrong = Recipe(model=ModelConfig("simple_dit", {**TINY, "vocab_size": V}), data=run.data, trainer=run.trainer)
    with pytest.raises(ConfigError, match="mask token"):
        build_run(wrong)


def test_knobs_are_checked():
    with pytest.raises(ValueError, match=r"masked_diffusion.eps=0.0"):
        MaskedDiffusionKnobs(eps=0.0)
    with pytest.raises(ValueError, match=r"masked_diffusion.top_k=-1"):
        MaskedDiffusionKnobs(top_k=-1)


def randomised(seed: int = 3) -> nnx.Module:
    """simple_dit (tokens) with every parameter drawn at random: adaLN-Zero's zero layers would make
    every output 0, whatever attends to what. (NumPy's draws instead, to spare jax.random.normal's
    program per parameter shape, ~1 CPU-s, made the packed-documents test miss its 1e-5 by 2.6e-5 in
    a suite run: those parameters amplify float32 rounding more; these are the ones it was written for.)"""
    m = objective().build(nnx.Rngs(0))
    state = nnx.state(m, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(state))))
    nnx.update(m, jax.tree.map(lambda p: 0.3 * jax.random.normal(next(keys), p.shape, p.dtype), state))
    return m


@pytest.mark.slow
def test_packed_documents_are_denoised_as_each_alone():
    """Three documents and padding in one row: with segment_ids and positions, each document's
    logits are those of the document run alone (attention within it, positions from 0), to 1e-5."""
    m = randomised()
    rng = np.random.default_rng(4)
    lengths = (5, 7, 2)
    z = jnp.asarray(rng.integers(0, V + 1, (1, L)), jnp.int32)  # masks among the ids
    seg = np.zeros((1, L), np.int32)
    pos = np.zeros((1, L), np.int32)
    at = 0
    for d, n in enumerate(lengths, start=1):
        seg[0, at : at + n], pos[0, at : at + n] = d, np.arange(n)
        at += n
    t = jnp.asarray([0.4])
    bounds = np.cumsum((0, *lengths))

    def logits(model, z, t, seg, pos):  # one compiled program: packed, each document alone, unpacked
        alone = [model(z[:, a:b], t) for a, b in itertools.pairwise(bounds)]
        return model(z, t, segment_ids=seg, positions=pos), alone, model(z, t)

    packed, alone, plain = jitted(logits, m)(z, t, jnp.asarray(seg), jnp.asarray(pos))
    for (a, b), own in zip(itertools.pairwise(bounds), alone, strict=True):
        np.testing.assert_allclose(np.asarray(packed[:, a:b]), np.asarray(own), atol=1e-5, rtol=1e-5)
    assert float(jnp.abs(plain[:, 5:14] - packed[:, 5:14]).max()) > 1e-3  # the mask is what made them so


@pytest.mark.slow
def test_padding_and_prompts_are_never_masked_and_weigh_nothing():
    """With segment_ids and a loss_mask, a token of weight 0 (padding, a prompt) is never masked, the
    loss counts the weighted tokens alone, and evaluation weighs the same way over the real records."""
    o = objective()
    m = randomised()
    batch = {
        "tokens": tokens(4),
        "segment_ids": np.ones((4, L + 1), np.int32),
        "loss_mask": np.ones((4, L + 1), np.int32),
    }
    batch["segment_ids"][:, 12:] = 0  # padding
    batch["loss_mask"][:, :5] = 0  # the prompt
    batch["positions"] = np.broadcast_to(np.arange(L + 1, dtype=np.int32), (4, L + 1)).copy()
    x0, weight, kwargs = o.inputs({k: jnp.asarray(v) for k, v in batch.items()})
    assert set(kwargs) == {"segment_ids", "positions"} and float(weight.sum()) == 4 * 7
    for i in range(20):
        z = o.corrupt(jax.random.key(i), x0, jnp.full((4,), 0.99), weight)
        assert bool((z[weight == 0] == x0[weight == 0]).all()) and bool((z[weight == 1] == V).any())
    out = jitted(o.loss, m)({k: jnp.asarray(v) for k, v in batch.items()}, jax.random.key(0))
    assert float(out.count) == 4 * 7 and float(out.total) > 0
    held = {**batch, "mask": np.array([1, 1, 0, 1], np.int32)}
    ev = jitted(o.evaluate, m)({k: jnp.asarray(v) for k, v in held.items()}, jax.random.key(0))
    assert float(ev.count) == 3 * 7


def test_an_objective_that_ignores_the_fields_is_refused_naming_both():
    from dew.contract.objectives import ObjectiveSpec, check_batch_fields, objectives

    class Plain(ObjectiveSpec):
        name = "plain_tokens"
        data_kind = "tokens"

    fields = {"tokens": None, "segment_ids": None, "positions": None, "loss_mask": None}
    with pytest.raises(
        ValueError,
        match=r"objective='plain_tokens' does not read the batch fields segment_ids, "
        r"positions, loss_mask that data=chat gives",
    ):
        check_batch_fields(Plain, fields, "data=chat")
    check_batch_fields(Plain, {"tokens": None}, "data=token_windows")  # nothing to ignore
    for name in ("next_token", "masked_diffusion"):
        check_batch_fields(objectives[name], fields, "data=chat")
