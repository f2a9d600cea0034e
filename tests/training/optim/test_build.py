"""build_optimizer: Adam-family updates against numpy, groups, muP, options (dew.training.optim.build)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dew.config import OptimConfig, ParamGroup
from dew.training.optim.build import (
    build_optimizer,
    group_labels,
    mup_param_groups,
    optimizers,
    param_paths,
)
from dew.training.optim.schedules import PowerSchedule

rng = np.random.default_rng(0)
PARAMS = {"w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=(4,)).astype(np.float32)}
GRADS = [{k: rng.normal(size=v.shape).astype(np.float32) for k, v in PARAMS.items()} for _ in range(2)]


def run(config, params, grads, total_steps=10):
    opt = build_optimizer(config, params, total_steps=total_steps)
    state = opt.tx.init(params)
    for g in grads:
        updates, state = opt.tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def numpy_adam_moments(grads, b1, b2):
    m = {k: np.zeros_like(v, np.float64) for k, v in PARAMS.items()}
    v = {k: np.zeros_like(x, np.float64) for k, x in PARAMS.items()}
    for g in grads:
        for k in m:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k].astype(np.float64) ** 2
    t = len(grads)
    return {k: m[k] / (1 - b1**t) for k in m}, {k: v[k] / (1 - b2**t) for k in v}


def test_adamw_step_matches_numpy():
    """Loshchilov & Hutter 2019, Algorithm 2 (with the rate multiplying the decay, as optax/torch)."""
    lr, wd, b1, b2, eps = 0.1, 0.05, 0.9, 0.999, 1e-8
    cfg = OptimConfig(optimizer="adamw", learning_rate=lr, weight_decay=wd)
    got, _ = run(cfg, PARAMS, GRADS[:1])
    m_hat, v_hat = numpy_adam_moments(GRADS[:1], b1, b2)
    for k, p in PARAMS.items():
        want = p - lr * (m_hat[k] / (np.sqrt(v_hat[k]) + eps) + wd * p)
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-6)
    # and a second step, where the bias corrections differ from 1/(1-b)
    got2, _ = run(cfg, PARAMS, GRADS)
    p1 = {k: np.asarray(v, np.float64) for k, v in got.items()}
    m_hat, v_hat = numpy_adam_moments(GRADS, b1, b2)
    for k in PARAMS:
        want = p1[k] - lr * (m_hat[k] / (np.sqrt(v_hat[k]) + eps) + wd * p1[k])
        np.testing.assert_allclose(got2[k], want, rtol=1e-5, atol=1e-6)


def test_lamb_step_matches_numpy():
    """You et al. 2020, Algorithm 2, with phi the identity: x -= lr·(||x|| / ||r + λx||)·(r + λx) per layer."""
    lr, wd, b1, b2, eps = 0.01, 0.1, 0.9, 0.999, 1e-6
    cfg = OptimConfig(optimizer="lamb", learning_rate=lr, weight_decay=wd)
    got, _ = run(cfg, PARAMS, GRADS[:1])
    m_hat, v_hat = numpy_adam_moments(GRADS[:1], b1, b2)
    for k, p in PARAMS.items():
        u = m_hat[k] / (np.sqrt(v_hat[k]) + eps) + wd * p
        want = p - lr * np.linalg.norm(p) / np.linalg.norm(u) * u
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-6)


def test_adam_weight_decay_is_l2_in_the_gradient():
    lr, wd, b1, b2, eps = 0.1, 0.5, 0.9, 0.999, 1e-8
    got, _ = run(OptimConfig(optimizer="adam", learning_rate=lr, weight_decay=wd), PARAMS, GRADS[:1])
    coupled = [{k: GRADS[0][k] + wd * PARAMS[k] for k in PARAMS}]
    m_hat, v_hat = numpy_adam_moments(coupled, b1, b2)
    for k, p in PARAMS.items():
        np.testing.assert_allclose(got[k], p - lr * m_hat[k] / (np.sqrt(v_hat[k]) + eps), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["adam", "adamw", "lamb"])
def test_default_weight_decay(name):
    # A zero gradient moves Adam by nothing, so what moves is the documented default decay alone.
    lr = 0.5
    zero = [{k: np.zeros_like(v) for k, v in PARAMS.items()}]
    got, _ = run(OptimConfig(optimizer=name, learning_rate=lr), PARAMS, zero)
    wd = optimizers[name].weight_decay
    if name == "lamb":
        want = {k: p - lr * np.sign(wd) * p for k, p in PARAMS.items()}  # trust ratio 1: u = λx, ||x||/||u|| = 1/λ
    else:
        want = {k: p - lr * wd * p for k, p in PARAMS.items()}
    for k in PARAMS:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-7)


def test_unknown_option_names_it_and_lists_the_taken_ones():
    cfg = OptimConfig(optimizer="adamw", optimizer_opts={"beta1": 0.8})
    with pytest.raises(ValueError, match=r"adamw does not take beta1; it takes b1, b2, eps"):
        build_optimizer(cfg, PARAMS, total_steps=10)
    with pytest.raises(ValueError, match="muon does not take tau"):
        build_optimizer(OptimConfig(optimizer="muon", optimizer_opts={"tau": 50.0}), PARAMS, total_steps=10)
    assert "tau" in optimizers["muonclip"].options
    with pytest.raises(ValueError, match=r"optim.optimizer_opts.b2=1.5 must lie in \[0, 1\)"):
        build_optimizer(OptimConfig(optimizer_opts={"b2": 1.5}), PARAMS, total_steps=10)
    with pytest.raises(ValueError, match="update_scale='rms'"):
        build_optimizer(OptimConfig(optimizer="muon", optimizer_opts={"update_scale": "rms"}), PARAMS, total_steps=10)
    # a taken option changes the update: b1 = 0 is RMSprop-like on the first step too
    build_optimizer(OptimConfig(optimizer="adamw", optimizer_opts={"b1": 0.8}), PARAMS, total_steps=10)


def test_power_schedule_needs_tokens_seen():
    cfg = OptimConfig(schedule=PowerSchedule())
    with pytest.raises(ValueError, match="tokens_seen"):
        build_optimizer(cfg, PARAMS, total_steps=10)
    opt = build_optimizer(cfg, PARAMS, total_steps=10, tokens_seen=lambda s: 1e6 * s.astype(jnp.float32))
    assert float(opt.learning_rate(jnp.int32(5))) > 0


def test_clipping_by_global_norm_before_the_moments():
    big = [{k: 100.0 * v for k, v in GRADS[0].items()}]
    _, state = run(OptimConfig(optimizer="adamw", clip_grads=1.0), PARAMS, big)
    norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in big[0].values()))
    mu = next(
        s
        for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
        if isinstance(s, optax.ScaleByAdamState)
    ).mu
    for k in PARAMS:  # first moment = (1 - b1) · clipped gradient
        np.testing.assert_allclose(mu[k], 0.1 * big[0][k] / norm, rtol=1e-5)


# ------------------------------------------------------------------------------------------- groups

TREE = {
    "embed": {"embedding": np.zeros((11, 8), np.float32)},
    "blocks": {
        "attn": {
            "q": {"kernel": np.zeros((2, 8, 2, 4), np.float32)},
            "o": {"kernel": np.zeros((2, 2, 4, 8), np.float32)},
        },
        "attn_norm": {"scale": np.zeros((2, 8), np.float32)},
        "mlp_in": {"kernel": np.zeros((2, 8, 16), np.float32), "bias": np.zeros((2, 16), np.float32)},
    },
    "final_norm": {"scale": np.zeros((8,), np.float32)},
    "lm_head": {"kernel": np.zeros((8, 11), np.float32)},
}


def flat(tree):
    return dict(zip(jax.tree.leaves(param_paths(tree)), jax.tree.leaves(tree), strict=True))


def test_group_matching_first_match_wins():
    groups = (ParamGroup("attn", 0.5), ParamGroup("kernel", 0.1), ParamGroup("scale$", 1.0, 0.0))
    labels = dict(zip(jax.tree.leaves(param_paths(TREE)), jax.tree.leaves(group_labels(TREE, groups)), strict=True))
    assert labels == {
        "blocks/attn/o/kernel": "group0",
        "blocks/attn/q/kernel": "group0",
        "blocks/attn_norm/scale": "group0",  # "attn" matches first
        "blocks/mlp_in/bias": "group3",
        "blocks/mlp_in/kernel": "group1",
        "embed/embedding": "group3",
        "final_norm/scale": "group2",
        "lm_head/kernel": "group1",
    }


def test_group_rates_and_decay_reach_the_update():
    tree = {"a": {"kernel": np.ones((2, 2), np.float32)}, "b": {"kernel": np.ones((2, 2), np.float32)}}
    grads = [{"a": {"kernel": np.ones((2, 2), np.float32)}, "b": {"kernel": np.ones((2, 2), np.float32)}}]
    cfg = OptimConfig(
        optimizer="adamw",
        learning_rate=0.1,
        weight_decay=0.0,
        param_groups=(ParamGroup("^a/", lr_multiplier=0.5, weight_decay=1.0),),
    )
    got, _ = run(cfg, tree, grads)
    # Adam's first step is lr·sign(g) (up to eps); group a: 0.5·0.1·(1 + 1·1), b: 0.1·1
    np.testing.assert_allclose(got["a"]["kernel"], 1 - 0.05 * 2, rtol=1e-6)
    np.testing.assert_allclose(got["b"]["kernel"], 1 - 0.1, rtol=1e-6)


def test_unmatched_pattern_is_an_error_naming_it():
    cfg = OptimConfig(param_groups=(ParamGroup("kernel"), ParamGroup("atention")))
    with pytest.raises(ValueError, match="'atention' matches no parameter"):
        build_optimizer(cfg, TREE, total_steps=10)
    # a pattern shadowed entirely by an earlier one is also unmatched
    with pytest.raises(ValueError, match="'mlp_in/kernel' matches no parameter"):
        group_labels(TREE, (ParamGroup("kernel"), ParamGroup("mlp_in/kernel")))


@pytest.mark.slow
def test_nnx_state_params_paths_and_step():
    class Tiny(nnx.Module):
        def __init__(self, rngs):
            self.embed = nnx.Embed(5, 4, rngs=rngs)
            self.mlp = nnx.Linear(4, 4, rngs=rngs)
            self.norm = nnx.LayerNorm(4, rngs=rngs)

    state = nnx.state(Tiny(nnx.Rngs(0)), nnx.Param)
    assert sorted(jax.tree.leaves(param_paths(state))) == [
        "embed/embedding",
        "mlp/bias",
        "mlp/kernel",
        "norm/bias",
        "norm/scale",
    ]
    for name in ["adamw", "muon"]:
        cfg = OptimConfig(optimizer=name, param_groups=(ParamGroup("norm", weight_decay=0.0),))
        opt = build_optimizer(cfg, state, total_steps=4)
        updates, _ = jax.jit(opt.tx.update)(jax.tree.map(jnp.ones_like, state), opt.tx.init(state), state)
        new = optax.apply_updates(state, updates)
        assert type(new) is type(state)
        assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(new))


# -------------------------------------------------------------------------------------------- muP


def test_mup_groups_golden_listing():
    assert mup_param_groups(TREE, width_multiplier=4.0) == (
        ParamGroup(
            r"^(?:blocks/attn_norm/scale|blocks/mlp_in/bias|final_norm/scale)$", lr_multiplier=1.0, weight_decay=0.0
        ),
        ParamGroup(
            r"^(?:blocks/attn/o/kernel|blocks/attn/q/kernel|blocks/mlp_in/kernel)$",
            lr_multiplier=0.25,
            weight_decay=None,
        ),
    )


def test_mup_groups_split():
    groups = mup_param_groups(TREE, width_multiplier=4.0)
    labels = dict(zip(jax.tree.leaves(param_paths(TREE)), jax.tree.leaves(group_labels(TREE, groups)), strict=True))
    assert [(g.lr_multiplier, g.weight_decay) for g in groups] == [(1.0, 0.0), (0.25, None)]
    assert labels == {
        "blocks/attn/o/kernel": "group1",  # hidden matrices: lr / m
        "blocks/attn/q/kernel": "group1",
        "blocks/attn_norm/scale": "group0",  # norms and biases, stacked too: no decay
        "blocks/mlp_in/bias": "group0",
        "blocks/mlp_in/kernel": "group1",
        "embed/embedding": "group2",  # embeddings and head: the normal group
        "final_norm/scale": "group0",
        "lm_head/kernel": "group2",
    }


@pytest.mark.parametrize("name", ["adamw", "lamb", "muon"])
def test_the_step_inputs_rebuild_the_optimizer_those_numbers_build(name):
    """``Optimizer.rebuild(inputs)`` inside one jitted update, given another run's numbers (rate,
    warmup, length, weight decay), updates as the optimizer built with those numbers does; the
    numbers are the program's inputs (one compilation for both)."""
    from dew.training.optim.schedules import CosineSchedule

    params = {"w": rng.normal(size=(8, 8)).astype(np.float32), "b": rng.normal(size=(8,)).astype(np.float32)}
    grads = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in params.items()}

    def config(lr, warmup, wd):
        return OptimConfig(optimizer=name, learning_rate=lr, weight_decay=wd, schedule=CosineSchedule(warmup))

    a, b = build_optimizer(config(1e-2, 2, 0.05), params, total_steps=10), config(3e-2, 4, 0.2)
    other = build_optimizer(b, params, total_steps=20)
    assert set(a.inputs) == {"peak", "warmup", "total_steps", "weight_decay"}
    assert isinstance(other.inputs["weight_decay"], float)  # weakly typed on the devices

    @jax.jit
    def update(inputs, state):
        tx = a.rebuild(inputs).tx
        return tx.update(grads, state, params)

    state = other.tx.init(params)
    for _ in range(5):  # past the warmup of 4
        want, _ = other.tx.update(grads, state, params)
        got, state = update(other.inputs, state)
        for k in params:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-8)
    update(a.inputs, state)
    assert update._cache_size() == 1
    assert "weight_decay" not in build_optimizer(config(1e-2, 2, 0.0), params, total_steps=10).inputs
