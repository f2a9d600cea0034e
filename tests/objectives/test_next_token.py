"""next_token: cross-entropy against a NumPy reference, bits per token, deterministic evaluation,
sampling with temperature and top-k."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.config import ModelConfig
from dew.objectives.autoregressive import NextToken
from dew.objectives.next_token import NextTokenKnobs

V, L = 13, 8


@pytest.fixture(scope="module")
def setup():
    fields = {"hidden_size": 32, "depth": 1, "num_heads": 2, "vocab_size": V, "seq_len": L}
    o = NextToken(
        ModelConfig("transformer", fields, dtype="float32"),
        NextTokenKnobs(),
        V,
        L,
        tokenizer={"kind": "byte", "eos_id": 12},
    )
    return o, o.build(nnx.Rngs(params=0))


def jitted(fn, model, **static):
    graphdef, state = nnx.split(model)
    call = jax.jit(lambda state, *args: fn(nnx.merge(graphdef, state), *args, **static))
    return lambda *args: call(state, *args)


def tokens(n: int) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(0).integers(0, V, (n, L + 1)), jnp.int32)


def reference_ce(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0]


def test_loss_is_cross_entropy_over_the_shifted_window(setup):
    o, model = setup
    batch = {"tokens": tokens(4)}
    out = jitted(o.loss, model)(batch, jax.random.PRNGKey(0))
    logits = np.asarray(jitted(lambda m, x: m(x), model)(batch["tokens"][:, :-1]))
    want = reference_ce(logits, np.asarray(batch["tokens"][:, 1:]))
    assert float(out.count) == 4 * L
    assert float(out.total) == pytest.approx(want.sum(), rel=1e-5)
    # A small random init is near uniform: about log V nats per token.
    assert float(out.total / out.count) == pytest.approx(math.log(V), rel=0.05)
    with_logits = jitted(o.loss, model, max_logits=True)(batch, jax.random.PRNGKey(0))
    assert with_logits.max_logits.shape == (1, 2) and float(with_logits.total) == float(out.total)


def test_evaluation_reports_bits_per_token_and_ignores_padding(setup):
    o, model = setup
    batch = {"tokens": tokens(4), "mask": jnp.array([1, 1, 1, 0], jnp.float32)}
    evaluate = jitted(o.evaluate, model)
    a, b = evaluate(batch, jax.random.PRNGKey(0)), evaluate(batch, jax.random.PRNGKey(1))
    assert float(a.total) == float(b.total) and float(a.count) == 3 * L  # nothing is drawn
    assert float(a.sums["bits_per_token"]) == pytest.approx(float(a.total) / math.log(2), rel=1e-6)
    three = jitted(o.loss, model)({"tokens": batch["tokens"][:3]}, jax.random.PRNGKey(0))
    assert float(a.total) == pytest.approx(float(three.total), rel=1e-6)
    assert o.derived_metrics({"eval/loss": 2.0}) == {"eval/perplexity": pytest.approx(math.exp(2.0))}


@pytest.mark.slow
def test_sampling_top_k_one_is_greedy_and_keeps_the_prompt(setup):
    o, model = setup
    ids = np.asarray(o.sample(model, 3, jax.random.PRNGKey(0), prompt=[12, 3], top_k=1))
    assert (ids[:, :2] == [12, 3]).all()
    # The greedy reference recomputes the whole context for each token, in one shape: the context
    # padded to L (the model is causal: position n's logits read tokens 0..n only), one compilation
    # instead of one per prefix length (six: ~1.4 CPU-s).
    forward = jitted(lambda m, x: m(x), model)
    greedy = np.zeros((1, L), np.int64)
    greedy[0, :2] = [12, 3]
    for n in range(2, L):
        greedy[0, n] = np.asarray(forward(jnp.asarray(greedy)))[0, n - 1].argmax()
    assert (ids == greedy).all()


@pytest.mark.slow
def test_sampling_is_seeded_and_temperature_spreads_it(setup):
    o, model = setup
    a = np.asarray(o.sample(model, 16, jax.random.PRNGKey(0), temperature=5.0))
    b = np.asarray(o.sample(model, 16, jax.random.PRNGKey(0), temperature=5.0))
    c = np.asarray(o.sample(model, 16, jax.random.PRNGKey(1), temperature=5.0))
    assert (a == b).all() and (a != c).any()
    assert (a[:, 0] == 12).all() and a.min() >= 0 and a.max() < V  # the default start id: end-of-text
    ids, texts = o.sample_text(model, jax.random.PRNGKey(0), 2)
    assert ids.shape == (2, L) and len(texts) == 2 and all(isinstance(t, str) for t in texts)


@pytest.mark.slow
def test_a_run_logs_the_perplexity_of_its_mean_losses(tmp_path):
    from dew.build import build_run
    from dew.config import TrainerConfig
    from dew.contract.journal import read_journal
    from dew.data.prepare import prepare
    from dew.data.specs import TokenWindows
    from dew.recipe import Recipe

    (tmp_path / "a.txt").write_text("the cat sat on the mat. " * 40)
    prepare([str(tmp_path / "a.txt")], str(tmp_path / "prep"))
    recipe = Recipe(
        model=ModelConfig("transformer", {"hidden_size": 32, "depth": 1, "num_heads": 2}, dtype="float32"),
        data=TokenWindows(path=str(tmp_path / "prep" / "train.bin"), seq_len=16, val_fraction=0.2),
        trainer=TrainerConfig(
            checkpoint_dir=str(tmp_path / "ck"),
            batch_size=8,
            steps=2,
            log_every=1,
            eval_every=2,
            checkpoint_every=None,
            compilation_cache_dir=None,
            final_samples=False,  # the journal's perplexities are what it checks (the samples: 0.7 CPU-s)
        ),
    )
    run, objective, dataset = build_run(recipe)
    run.train(objective, dataset, name="lm")
    records = read_journal(tmp_path / "tracking" / "lm" / "journal.jsonl")
    evals = [r for r in records if "eval/loss" in r and "event" not in r]
    trains = [r for r in records if "train/loss" in r]
    assert evals and trains
    for r in evals:
        assert r["eval/perplexity"] == pytest.approx(math.exp(r["eval/loss"]))
    for r in trains:
        assert r["train/perplexity"] == pytest.approx(math.exp(r["train/loss"]))
