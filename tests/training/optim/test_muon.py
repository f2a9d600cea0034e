"""Muon's orthogonalisation, routing and update, and MuonClip's QK-clip (dew.training.optim.muon)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dew.config import OptimConfig
from dew.training.optim.build import build_optimizer, optimizers
from dew.training.optim.muon import MatrixAxes, muon_route, newton_schulz, orthogonalize
from dew.training.optim.muonclip import QKClipLayer, qk_clip

A, B, C = 3.4445, -4.7750, 2.0315


def numpy_newton_schulz(g, steps=5):
    """Keller Jordan's zeropower_via_newtonschulz5, in float64."""
    x = np.asarray(g, np.float64)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (np.linalg.norm(x) + 1e-7)
    for _ in range(steps):
        a = x @ x.T
        x = A * x + (B * a + C * a @ a) @ x
    return x.T if tall else x


@pytest.mark.parametrize("shape", [(16, 16), (12, 32), (40, 8)])
def test_newton_schulz_matches_float64_reference_and_band(shape):
    g = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    got = np.asarray(newton_schulz(jnp.asarray(g)))
    want = numpy_newton_schulz(g)
    np.testing.assert_allclose(got, want, atol=2e-4)
    # Keller: US'V^T with S'_ii roughly Uniform(0.5, 1.5) instead of exactly 1
    sv = np.linalg.svd(got.astype(np.float64), compute_uv=False)
    assert sv.min() > 0.5 and sv.max() < 1.5, sv
    # and the singular vectors are the gradient's: got ≈ U S' V^T with U, V from g
    u, _, vt = np.linalg.svd(g.astype(np.float64), full_matrices=False)
    np.testing.assert_allclose(u.T @ got @ vt.T, np.diag(np.diag(u.T @ got @ vt.T)), atol=1e-4)


def test_stacked_layers_are_orthogonalised_one_by_one():
    g = np.random.default_rng(2).normal(size=(3, 8, 12)).astype(np.float32)
    got = np.asarray(orthogonalize(jnp.asarray(g), MatrixAxes((1,), (2,))))
    for layer in range(3):
        np.testing.assert_allclose(got[layer], numpy_newton_schulz(g[layer]), atol=2e-4)
    # an attention kernel (depth, hidden, heads, head_dim) is one (hidden, heads·head_dim) matrix a layer
    q = np.random.default_rng(3).normal(size=(2, 8, 2, 4)).astype(np.float32)
    got = np.asarray(orthogonalize(jnp.asarray(q), MatrixAxes((1,), (2, 3))))
    for layer in range(2):
        np.testing.assert_allclose(got[layer].reshape(8, 8), numpy_newton_schulz(q[layer].reshape(8, 8)), atol=2e-4)


def test_routing_of_a_toy_tree():
    opts = optimizers["muon"].options
    route = lambda path, shape: muon_route(path, shape, opts["adam_patterns"], opts["matrix_axes"])  # noqa: E731
    table = {
        ("embed/embedding", (100, 16)): None,
        ("x_embedder/kernel", (8, 16)): None,
        ("t_embedder/mlp_in/kernel", (256, 16)): None,
        ("y_embedder/embedding", (11, 16)): None,
        ("lm_head/kernel", (16, 100)): None,
        ("final_layer/linear/kernel", (16, 8)): None,
        ("final_layer/adaLN_modulation/kernel", (16, 32)): MatrixAxes((0,), (1,)),
        ("final_norm/scale", (16,)): None,
        ("blocks/attn_norm/scale", (2, 16)): None,  # stacked: rank 2, still a norm
        ("blocks/mlp_in/bias", (2, 64)): None,
        ("blocks/mlp_in/kernel", (2, 16, 64)): MatrixAxes((1,), (2,)),
        ("blocks/attn/q/kernel", (2, 16, 4, 4)): MatrixAxes((1,), (2, 3)),
        ("blocks/attn/k/kernel", (2, 16, 2, 4)): MatrixAxes((1,), (2, 3)),
        ("blocks/attn/o/kernel", (2, 4, 4, 16)): MatrixAxes((1, 2), (3,)),
        ("blocks/attn/q_norm/scale", (2, 4)): None,
    }
    for (path, shape), want in table.items():
        assert route(path, shape) == want, path


def test_muon_step_matches_numpy():
    """One step of Muon (Nesterov, Moonlight's RMS match, decoupled decay) on a stack of two layers."""
    rng = np.random.default_rng(4)
    params = {
        "blocks": {"mlp_in": {"kernel": rng.normal(size=(2, 6, 10)).astype(np.float32)}},
        "norm": {"scale": np.ones((6,), np.float32)},
    }
    grads = [jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32), params) for _ in range(2)]
    lr, wd, beta = 0.02, 0.1, 0.95
    opt = build_optimizer(OptimConfig(optimizer="muon", learning_rate=lr, weight_decay=wd), params, total_steps=10)
    state = opt.tx.init(params)
    p = params
    for g in grads:
        updates, state = opt.tx.update(g, state, p)
        p = optax.apply_updates(p, updates)

    w = params["blocks"]["mlp_in"]["kernel"].astype(np.float64)
    buf = np.zeros_like(w)
    for g in grads:
        g = g["blocks"]["mlp_in"]["kernel"].astype(np.float64)
        buf = beta * buf + (1 - beta) * g
        u = (1 - beta) * g + beta * buf
        o = np.stack([numpy_newton_schulz(u[i]) for i in range(2)]) * 0.2 * math.sqrt(10)
        w = w - lr * (o + wd * w)
    np.testing.assert_allclose(p["blocks"]["mlp_in"]["kernel"], w, atol=1e-5)
    # the norm went to AdamW, with Moonlight's betas (0.9, 0.95) and the same rate and decay
    x, m, v = params["norm"]["scale"].astype(np.float64), 0.0, 0.0
    for t, g in enumerate(grads, start=1):
        g = g["norm"]["scale"].astype(np.float64)
        m, v = 0.9 * m + 0.1 * g, 0.95 * v + 0.05 * g**2
        x = x - lr * ((m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.95**t)) + 1e-8) + wd * x)
    np.testing.assert_allclose(p["norm"]["scale"], x, rtol=1e-5)
    assert optimizers["muon"].weight_decay == 0.1


def test_keller_shape_factor():
    g = np.random.default_rng(5).normal(size=(4, 16)).astype(np.float32)
    params = {"mlp": {"kernel": np.zeros((4, 16), np.float32)}}
    cfg = OptimConfig(
        optimizer="muon",
        learning_rate=1.0,
        weight_decay=0.0,
        optimizer_opts={"update_scale": "keller", "nesterov": False},
    )
    opt = build_optimizer(cfg, params, total_steps=1)
    updates, _ = opt.tx.update({"mlp": {"kernel": g}}, opt.tx.init(params), params)
    # no Nesterov: u = (1-β)·g, orthogonalised (scale-free), times sqrt(max(1, fan_out/fan_in)) = 2
    np.testing.assert_allclose(-np.asarray(updates["mlp"]["kernel"]), 2 * numpy_newton_schulz(g), atol=2e-4)


# ------------------------------------------------------------------------------------------ QK-clip


class TinyAttention:
    """An explicit attention layer: q, k kernels (d_model, heads, head_dim), logits scaled by 1/sqrt(hd)."""

    def __init__(self, heads=2, kv_heads=2, d=8, hd=4, seed=0):
        rng = np.random.default_rng(seed)
        self.heads, self.kv_heads, self.hd = heads, kv_heads, hd
        self.params = {
            "attn": {
                "q": {"kernel": rng.normal(size=(d, heads, hd)).astype(np.float32)},
                "k": {"kernel": rng.normal(size=(d, kv_heads, hd)).astype(np.float32)},
                "v": {"kernel": rng.normal(size=(d, kv_heads, hd)).astype(np.float32)},
            }
        }
        self.x = rng.normal(size=(3, 5, d)).astype(np.float32)
        self.layer = QKClipLayer(
            query=("attn/q/kernel",), key=("attn/k/kernel",), num_heads=heads, num_kv_heads=kv_heads, split_heads=True
        )

    def max_logits(self, params):
        q = jnp.einsum("btd,dnh->btnh", self.x, params["attn"]["q"]["kernel"])
        k = jnp.einsum("bsd,dkh->bskh", self.x, params["attn"]["k"]["kernel"])
        k = jnp.repeat(k, self.heads // self.kv_heads, axis=2)
        logits = jnp.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(self.hd)
        return logits.max(axis=(0, 2, 3))


def with_max_logits(layer, targets):
    # rescale each query head so that its max logit is exactly what the test wants
    s = np.asarray(layer.max_logits(layer.params))
    q = layer.params["attn"]["q"]["kernel"] * (np.asarray(targets) / s)[None, :, None]
    layer.params["attn"]["q"]["kernel"] = q.astype(np.float32)
    return layer


def test_qk_clip_caps_the_hot_head_and_leaves_the_other_bit_identical():
    layer = with_max_logits(TinyAttention(), [200.0, 50.0])
    s = layer.max_logits(layer.params)
    np.testing.assert_allclose(s, [200.0, 50.0], rtol=1e-4)
    clipped = qk_clip(layer.params, {"attn": s}, 100.0, layers={"attn": layer.layer})
    after = np.asarray(layer.max_logits(clipped))
    np.testing.assert_allclose(after[0], 100.0, rtol=1e-5)
    for name in "qk":  # head 1: bit-identical; head 0: both sides by sqrt(100 / 200)
        before, now = layer.params["attn"][name]["kernel"], np.asarray(clipped["attn"][name]["kernel"])
        assert np.array_equal(now[:, 1], before[:, 1])
        np.testing.assert_allclose(now[:, 0], before[:, 0] * math.sqrt(100.0 / float(s[0])), rtol=1e-6)
    assert np.array_equal(clipped["attn"]["v"]["kernel"], layer.params["attn"]["v"]["kernel"])
    # a second clip, from the new logits, changes nothing
    again = qk_clip(clipped, {"attn": layer.max_logits(clipped)}, 100.0, layers={"attn": layer.layer})
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(clipped), strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_qk_clip_under_grouped_query_attention_scales_queries_only():
    layer = with_max_logits(TinyAttention(heads=4, kv_heads=2, seed=1), [200.0, 50.0, 80.0, 400.0])
    s = layer.max_logits(layer.params)
    clipped = qk_clip(layer.params, {"attn": s}, 100.0, layers={"attn": layer.layer})
    np.testing.assert_allclose(layer.max_logits(clipped), [100.0, 50.0, 80.0, 100.0], rtol=1e-4)
    assert np.array_equal(clipped["attn"]["k"]["kernel"], layer.params["attn"]["k"]["kernel"])
    q0, q1 = layer.params["attn"]["q"]["kernel"], np.asarray(clipped["attn"]["q"]["kernel"])
    assert np.array_equal(q1[:, 1:3], q0[:, 1:3])


def test_qk_clip_on_stacked_flat_kernels():
    # a scanned stack of 2 layers, kernels (depth, d_model, heads·head_dim) with a bias
    rng = np.random.default_rng(6)
    params = {
        "blocks": {
            "q": {
                "kernel": rng.normal(size=(2, 4, 6)).astype(np.float32),
                "bias": rng.normal(size=(2, 6)).astype(np.float32),
            },
            "k": {"kernel": rng.normal(size=(2, 4, 6)).astype(np.float32)},
        }
    }
    layout = QKClipLayer(query=("blocks/q/kernel", "blocks/q/bias"), key=("blocks/k/kernel",), num_heads=3)
    s = jnp.asarray([[400.0, 10.0, 100.0], [10.0, 10.0, 25.0]])
    out = qk_clip(params, {"blocks": s}, 100.0, layers={"blocks": layout})
    factor = np.ones((2, 3))
    factor[0, 0] = 0.5  # sqrt(100 / 400)
    want = params["blocks"]["q"]["kernel"].reshape(2, 4, 3, 2) * factor[:, None, :, None]
    np.testing.assert_allclose(out["blocks"]["q"]["kernel"], want.reshape(2, 4, 6), rtol=1e-7)
    np.testing.assert_allclose(
        out["blocks"]["q"]["bias"], (params["blocks"]["q"]["bias"].reshape(2, 3, 2) * factor[:, :, None]).reshape(2, 6)
    )
    with pytest.raises(KeyError, match="no parameter"):
        qk_clip(params, {"blocks": s}, 100.0, layers={"blocks": QKClipLayer(("blocks/nope",), (), 3)})


def test_muonclip_clips_after_the_update_what_muon_updated():
    """MuonClip is Muon's chain plus QK-clip as a post-update transform: params + updates equals
    qk_clip(params + Muon's updates), and a head under tau keeps Muon's update bit for bit."""

    class Stack:  # an architecture as the optimizer sees it: where its attention is
        def qk_clip_layers(self):
            return {
                "attn": QKClipLayer(query=("blocks/q/kernel",), key=("blocks/k/kernel",), num_heads=2, split_heads=True)
            }

    rng = np.random.default_rng(3)
    params = {
        "blocks": {
            "q": {"kernel": rng.normal(size=(2, 4, 2, 3)).astype(np.float32)},
            "k": {"kernel": rng.normal(size=(2, 4, 2, 3)).astype(np.float32)},
        }
    }
    grads = jax.tree.map(lambda p: np.asarray(rng.normal(size=p.shape), np.float32), params)
    logits = jnp.asarray([[400.0, 10.0], [10.0, 120.0]])  # (depth, heads): two heads pass tau

    clip = build_optimizer(
        OptimConfig(optimizer="muonclip", optimizer_opts={"tau": 100.0}), params, total_steps=1, architecture=Stack()
    )
    plain = build_optimizer(OptimConfig(optimizer="muon"), params, total_steps=1)
    assert clip.extra_args == ("max_logits",) and plain.extra_args == ()
    updates, _ = clip.tx.update(grads, clip.tx.init(params), params, max_logits=logits)
    plain_updates, _ = plain.tx.update(grads, plain.tx.init(params), params)
    got = optax.apply_updates(params, updates)
    want = qk_clip(optax.apply_updates(params, plain_updates), {"attn": logits}, 100.0, layers=Stack().qk_clip_layers())
    for path in (("q", "kernel"), ("k", "kernel")):
        g, w = np.asarray(got["blocks"][path[0]][path[1]]), np.asarray(want["blocks"][path[0]][path[1]])
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
        u, pu = np.asarray(updates["blocks"][path[0]][path[1]]), np.asarray(plain_updates["blocks"][path[0]][path[1]])
        assert np.array_equal(u[0, :, 1], pu[0, :, 1]) and np.array_equal(u[1, :, 0], pu[1, :, 0])  # under tau
        assert not np.allclose(u[0, :, 0], pu[0, :, 0])  # clipped
    with pytest.raises(ValueError, match="architecture"):
        build_optimizer(OptimConfig(optimizer="muonclip"), params, total_steps=1)


@pytest.mark.slow
def test_qk_clip_on_dew_transformer_layout():
    """The documented layout for dew's models, against the transformer's own max logits (GQA, RoPE)."""
    from flax import nnx

    from dew.config import ModelConfig

    fields = {"vocab_size": 32, "hidden_size": 16, "depth": 1, "num_heads": 4, "num_kv_heads": 2, "seq_len": 8}
    model = ModelConfig(architecture="transformer", config=fields, dtype="float32").build(nnx.Rngs(0))
    graph, params, rest = nnx.split(model, nnx.Param, ...)
    tokens = jnp.arange(16, dtype=jnp.int32).reshape(2, 8) % 32

    def max_logits(p):
        return nnx.merge(graph, p, rest)(tokens, return_max_logits=True)[1]

    s = max_logits(params)  # (depth, heads); one layer, so a clip cannot move a later layer's inputs
    tau = float(jnp.median(s))
    layer = QKClipLayer(
        query=("blocks/attn/q/kernel",), key=("blocks/attn/k/kernel",), num_heads=4, num_kv_heads=2, split_heads=True
    )
    clipped = qk_clip(params, {"blocks": s}, tau, layers={"blocks": layer})
    after = max_logits(clipped)
    np.testing.assert_allclose(after, np.minimum(s, tau), rtol=1e-4)
    assert type(clipped) is type(params)
