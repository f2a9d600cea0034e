"""simple_dit: the paper's parameter counts, adaLN-Zero at initialisation, patches, token mode,
scanned against unrolled, the reported maximum logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.models import build, flops_per_example
from dew.models.dit import patchify, unpatchify
from dew.models.simple_dit import DIT_PRESETS

TINY = dict(
    input_size=8,
    in_channels=1,
    patch_size=2,
    hidden_size=32,
    depth=2,
    num_heads=4,
    num_classes=10,
    matmul_precision="highest",
)


def paper_fields(preset):
    return dict(DIT_PRESETS[preset], input_size=32, in_channels=4, num_classes=1000, learn_sigma=True)


def count(module, kind=nnx.Param):
    return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(nnx.state(module, kind)))


# Table 4 of the paper: parameters and forward GFLOPs at 256x256 (32x32x4 latents).
PAPER = {"S/2": (33e6, 6.06), "B/2": (130e6, 23.01), "XL/2": (675e6, 118.64)}


@pytest.mark.parametrize("preset", PAPER)
def test_parameter_count_and_flops_match_the_paper(preset):
    fields = paper_fields(preset)
    model = nnx.eval_shape(lambda: build("simple_dit", fields, nnx.Rngs(0)))
    params, gflops = PAPER[preset]
    assert abs(count(model) / params - 1) < 0.01, count(model)
    # The paper's "Gflops" are forward multiply-adds: a third of training FLOPs over 2.
    assert abs(flops_per_example("simple_dit", fields) / 6e9 / gflops - 1) < 0.01


def tiny(rngs=0, **overrides):
    return build("simple_dit", {**TINY, **overrides}, nnx.Rngs(rngs))


def batch(B=3):
    x = jax.random.normal(jax.random.key(1), (B, 8, 8, 1))
    return x, jnp.linspace(0.0, 1.0, B), jnp.arange(B, dtype=jnp.int32) % 11  # 10 is the null class


@pytest.mark.slow
def test_output_is_exactly_zero_at_init(jitted):
    model = tiny(learn_sigma=True)
    out = jitted(model)(*batch())
    assert out.shape == (3, 8, 8, 2) and not np.any(out)
    assert not np.any(jitted(model)(batch()[0], batch()[1]))  # y=None: the null class


@pytest.mark.slow
def test_every_block_is_the_identity_at_init():
    model = tiny()
    graphdef, state = nnx.split(model.blocks)
    x = jax.random.normal(jax.random.key(2), (3, 16, 32))
    c = jax.random.normal(jax.random.key(3), (3, 32))
    for i in range(TINY["depth"]):
        block = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))
        out, _ = block(x, c, False)
        np.testing.assert_array_equal(out, x)


def test_patchify_then_unpatchify_is_the_identity():
    x = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
    patches = patchify(x, 2)
    assert patches.shape == (2, 16, 12)
    np.testing.assert_array_equal(patches[:, 1].reshape(2, 2, 2, 3), x[:, 0:2, 2:4])  # row-major
    np.testing.assert_array_equal(unpatchify(patches, 2, 3), x)


def perturbed(model):
    """The model with every parameter moved off its initialisation, so no block is the identity."""
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    leaves = [a + 0.05 * jax.random.normal(k, a.shape, a.dtype) for a, k in zip(leaves, keys)]
    return nnx.merge(graphdef, jax.tree.unflatten(treedef, leaves))


@pytest.mark.slow
def test_scanned_and_unrolled_give_the_same_outputs_and_max_logits(jitted):
    scanned, unrolled = perturbed(tiny(scan_layers=True)), perturbed(tiny(scan_layers=False))
    out_s, ml_s = jitted(scanned, return_max_logits=True)(*batch())
    out_u, ml_u = jitted(unrolled, return_max_logits=True)(*batch())
    assert np.abs(out_s).max() > 1e-3
    np.testing.assert_allclose(out_s, out_u, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ml_s, ml_u, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_max_logits_equal_an_explicit_computation_per_block(jitted):
    model = perturbed(tiny())
    x, t, y = batch()
    _, got = jitted(model, return_max_logits=True)(x, t, y)
    assert got.shape == (TINY["depth"], TINY["num_heads"])
    # Replay the blocks one by one and compute each block's logits by hand.
    h = model.x_embedder(patchify(x, 2)) + model.position_embedding(16)
    c = model.t_embedder(t) + model.y_embedder(y)
    graphdef, state = nnx.split(model.blocks)
    for i in range(TINY["depth"]):
        block = nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))
        shift, scale = jnp.split(block.adaLN_modulation(jax.nn.silu(c)), 6, axis=-1)[:2]
        a = block.norm1(h) * (1 + scale[:, None]) + shift[:, None]
        logits = jnp.einsum("btnh,bsnh->bnts", block.attn.q(a), block.attn.k(a), precision="highest") * block.attn.scale
        np.testing.assert_allclose(got[i], logits.max(axis=(0, 2, 3)), rtol=1e-5, atol=1e-5)
        h, _ = block(h, c, False)


@pytest.mark.slow
def test_token_mode(jitted):
    model = tiny(vocab_size=13, input_size=12)
    tokens = jax.random.randint(jax.random.key(0), (2, 12), 0, 13)
    logits = jitted(model)(tokens, jnp.array([0.2, 0.7]))
    assert logits.shape == (2, 12, 13) and not np.any(logits)
    assert "embedding" in nnx.state(model.x_embedder, nnx.Param)
    model = perturbed(model)
    # Bidirectional: the first position sees the last token.
    apply = jitted(model)
    changed = apply(tokens.at[:, -1].set((tokens[:, -1] + 1) % 13), jnp.array([0.2, 0.7]))
    assert np.abs(changed[:, 0] - apply(tokens, jnp.array([0.2, 0.7]))[:, 0]).max() > 0
    with pytest.raises(ValueError, match="length <= input_size=12"):
        model(jnp.zeros((2, 13), jnp.int32), jnp.zeros(2))


@pytest.mark.slow
def test_unconditional_model_has_no_label_embedding_and_shapes_are_checked():
    model = tiny(num_classes=0)
    assert model.y_embedder is None
    assert model(batch()[0], batch()[1]).shape == (3, 8, 8, 1)
    with pytest.raises(ValueError, match=r"images of shape \(batch, 8, 8, 1\) \(NHWC\)"):
        model(jnp.zeros((3, 1, 8, 8)), jnp.zeros(3))


def test_presets_table():
    assert DIT_PRESETS["XL/2"] == {"hidden_size": 1152, "depth": 28, "num_heads": 16, "patch_size": 2}
    assert set(DIT_PRESETS) == {f"{s}/{p}" for s in ("S", "B", "L", "XL") for p in (2, 4, 8)}


@pytest.mark.parametrize("size", ["S", "B", "L", "XL"])
def test_the_preset_options_are_the_presets(size):
    """conf/model/dit_<size>2.yaml sets exactly DIT_PRESETS["<size>/2"]: one table, two views."""
    import yaml

    from tests.conftest import REPO

    option = yaml.safe_load((REPO / "conf" / "model" / f"dit_{size.lower()}2.yaml").read_text())
    assert option["config"] == DIT_PRESETS[f"{size}/2"]
