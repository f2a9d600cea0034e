"""The Hugging Face Llama layout: a tiny ``transformer`` (grouped-query heads, muP, an embedding and a
residual multiplier, every weight and norm scale moved off its initialisation) written by
``dew.training.checkpointing.hf_llama`` gives, in a NumPy forward pass written here from the Llama layout alone, the
logits dew gives; read back into dew it gives them again."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

FIELDS = dict(
    vocab_size=37,
    seq_len=16,
    hidden_size=32,
    depth=2,
    num_heads=4,
    num_kv_heads=2,
    mlp_hidden=48,
    mup=True,
    mup_base_width=16,
    embedding_multiplier=1.5,
    residual_multiplier=0.7,
    norm_eps=1e-5,
    rope_theta=500.0,
    dtype="float32",
    param_dtype="float32",
)


@functools.cache
def _built():
    """One compiled program initialising the model for a seed (built op by op, every op compiled on
    its own: the model and its jax.random nudges cost 3.7 CPU-s, against 1.3 so)."""
    import jax
    from flax import nnx

    from dew.contract.models import of

    arch = of("transformer", FIELDS)
    return arch.fields, nnx.jit(lambda seed: arch.build(nnx.Rngs(params=jax.random.key(seed))))


def _model():
    import jax.numpy as jnp
    from flax import nnx

    fields, build = _built()
    model = build(0)
    # Every weight and norm scale moved off its initialisation, by NumPy's draws (no program per shape).
    for i, (_, param) in enumerate(nnx.to_flat_state(nnx.state(model, nnx.Param))):
        noise = np.random.default_rng(i).standard_normal(param.shape, np.float32)
        param[...] = jnp.asarray(np.asarray(param[...]) + np.float32(0.1) * noise)
    return fields, model


@functools.cache
def _forward():
    from flax import nnx

    return nnx.jit(lambda model, tokens: model(tokens))


def _logits(model, tokens: np.ndarray) -> np.ndarray:
    """The model's forward as one compiled program (op by op it compiled each op: 0.88 against 0.37
    CPU-s), which the read-back model's call reuses, its graph being the same."""
    return np.asarray(_forward()(model, tokens))


def _flat(model) -> dict:
    from flax import nnx

    return {"/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def _rms(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def llama_logits(directory: Path, tokens: np.ndarray) -> np.ndarray:
    """Llama's forward pass in NumPy, from config.json and model.safetensors alone."""
    from safetensors.numpy import load_file

    c = json.loads((directory / "config.json").read_text())
    w = {k: v.astype(np.float64) for k, v in load_file(directory / "model.safetensors").items()}
    N, K, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["rms_norm_eps"]
    B, T = tokens.shape
    inv_freq = 1.0 / c["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    angles = np.arange(T)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))
    mask = np.triu(np.full((T, T), -np.inf), 1)
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(B, T, N, hd).transpose(0, 2, 1, 3)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(B, T, K, hd).transpose(0, 2, 1, 3)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(B, T, K, hd).transpose(0, 2, 1, 3)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = np.repeat(k, N // K, axis=1), np.repeat(v, N // K, axis=1)  # repeat_kv
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hd) + mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = (probs @ v).transpose(0, 2, 1, 3).reshape(B, T, N * hd)
        x = x + out @ w[p + "self_attn.o_proj.weight"].T
        h = _rms(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return _rms(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


def test_export_matches_a_numpy_llama_and_reads_back(tmp_path: Path):
    import jax

    from dew.training.checkpointing import hf_weights, warmstart

    fields, model = _model()
    tokens = np.random.default_rng(0).integers(0, FIELDS["vocab_size"], (2, 11)).astype(np.int32)
    ours = _logits(model, tokens)
    (tmp_path / "hf").mkdir()
    hf_weights.write_directory(fields, _flat(model), str(tmp_path / "hf"))
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 2
    reference = llama_logits(tmp_path / "hf", tokens)
    assert np.abs(reference - ours).max() < 1e-4, np.abs(reference - ours).max()

    # Read back into a freshly seeded model of the same fields: the same logits.
    from flax import nnx

    fresh = _built()[1](5)
    state = nnx.state(fresh, nnx.Param)
    assert hf_weights.dew_shapes(fields, str(tmp_path / "hf")) == warmstart.shapes_of(state)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {p: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device) for p, v in nnx.to_flat_state(state)}
    values = hf_weights.read(fields, str(tmp_path / "hf"), target)
    nnx.replace_by_pure_dict(state, warmstart._nested(values))
    nnx.update(fresh, state)
    assert np.abs(_logits(fresh, tokens) - ours).max() < 1e-5


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"tie_embeddings": True}, "model.config.tie_embeddings=true"),
        ({"qk_norm": True, "qkv_bias": True}, "model.config sets qkv_bias and qk_norm; no Hugging Face family"),
    ],
)
def test_what_no_family_has_is_refused_by_name(tmp_path: Path, fields: dict, message: str):
    """A tied head with muP's logit divisor and an embedding multiplier (FIELDS), which the one tied
    matrix cannot carry both of; QK-norm (Qwen3's) with query/key/value biases (Qwen2's)."""
    from dew.contract.models import of
    from dew.training.checkpointing import hf_weights

    fields = of("transformer", {**FIELDS, **fields}).fields
    (tmp_path / "hf").mkdir()
    with pytest.raises(ValueError, match=message):
        hf_weights.write_directory(fields, {}, str(tmp_path / "hf"))
    assert not any((tmp_path / "hf").iterdir())


def test_a_trained_transformer_run_exported_then_started_from(tmp_path: Path):
    from dew.build import build_run
    from dew.cli import export
    from dew.inference import exporting
    from tests.training.conftest import journal, losses
    from tests.training.mesh_runs import compose

    rng = np.random.default_rng(0)
    for name in ("train", "val"):
        rng.integers(0, 64, 4096).astype(np.uint16).tofile(tmp_path / f"{name}.bin")
    # The suite's compilation cache (the default's DEW_COMPILATION_CACHE): the second run loads the
    # programs the first compiled that it shares (10.0-10.3 -> 8.5-9.0 CPU-s on an empty cache).
    common = [
        "model=transformer",
        "data=token_windows",
        f"data.path={tmp_path / 'train.bin'}",
        f"data.val_path={tmp_path / 'val.bin'}",
        "data.seq_len=16",
        "data.vocab_size=64",
        "model.config={hidden_size: 32, depth: 2, num_heads: 4, num_kv_heads: 2}",
        "model.dtype=float32",
        "trainer.batch_size=8",
        "trainer.log_every=1",
        f"trainer.checkpoint_dir={tmp_path / 'ck'}",
    ]

    def train(name: str, *overrides: str) -> dict[int, float]:
        recipe, objective, dataset = build_run(compose(*common, *overrides))
        recipe.train(objective, dataset, name=name)
        return losses(journal(tmp_path, name), "eval/loss")

    trained = train("lm", "trainer.steps=10", "trainer.eval_every=10", "trainer.checkpoint_every=10")
    exporting.run(export.parse_args([str(tmp_path / "ck" / "lm"), "--to", str(tmp_path / "hf")]))
    # raw token files without a tokens.json sidecar: no tokenizer to write
    assert {p.name for p in (tmp_path / "hf").iterdir()} == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
    }
    # A learning rate of 0: step 1 evaluates the parameters read from the directory.
    warm = train(
        "warm",
        "trainer.steps=1",
        "trainer.eval_every=1",
        "optim.learning_rate=0",
        f"trainer.init_from={tmp_path / 'hf'}",
    )
    assert warm[1] == pytest.approx(trained[10], abs=1e-5)
