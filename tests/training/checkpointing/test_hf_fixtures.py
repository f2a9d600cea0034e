"""dew reads the Llama directories transformers itself wrote (``tests/fixtures/hf``, made by
``tests/fixtures/hf/make.py``: the transformers 5 spelling, bfloat16, float16 in 3 shards, tied
embeddings, grouped-query heads, llama3 and linear RoPE scaling, the transformers 4 spelling) and
gives the logits transformers gave (``reference.json``) to 1e-4, and the tokenizer's ids exactly;
what it does not model is refused naming the field, with nothing written.

One tolerance serves every fixture: the references are transformers' float32 forward pass over
the weights as saved, and bfloat16 and float16 weights are exactly representable in float32, so a
bf16 or fp16 directory read into float32 parameters is the same function; what remains is float32
rounding in another order of operations (measured: below 1e-5 on these logits of size ~10)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
READ = ["t5-f32", "bf16", "sharded", "tied", "gqa", "llama3", "t4-llama3", "linear", "qwen2", "qwen3", "mistral"]


def fields(directory: Path, **overrides: object):
    from dew.contract.models import of
    from dew.training.checkpointing import hf_llama

    config = json.loads((directory / "config.json").read_text())
    values = {
        **hf_llama.model_config(str(directory)),
        "vocab_size": config["vocab_size"],
        "seq_len": 16,
        "dtype": "float32",
        "param_dtype": "float32",
        "scan_layers": False,
        **overrides,
    }
    return of("transformer", values).fields


def read(name: str, **overrides: object):
    """The dew ``transformer`` (graph, parameters) with fixture ``name``'s weights, read as
    ``trainer.init_from`` reads them, and its fields; built from shapes alone (no initialisation)."""
    import jax
    from flax import nnx

    from dew.contract.models import architecture
    from dew.training.checkpointing import hf_weights, warmstart

    directory = FIXTURES / name.removesuffix("-unscaled")
    f = fields(directory, **overrides)
    graph, state = nnx.split(nnx.eval_shape(lambda: architecture("transformer")(f).build(nnx.Rngs(params=0))))
    params = nnx.state(nnx.merge(graph, state), nnx.Param)
    if not overrides:
        assert hf_weights.dew_shapes(f, str(directory)) == warmstart.shapes_of(params)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {p: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device) for p, v in nnx.to_flat_state(state)}
    nnx.replace_by_pure_dict(state, warmstart._nested(hf_weights.read(f, str(directory), target)))
    return graph, state


@pytest.fixture(scope="module")
def dew_logits() -> dict[str, np.ndarray]:
    """Each fixture's logits from dew, over its ``tokens`` and its ``windows`` (inputs) as one
    batch, all fixtures in one compiled program (one compilation instead of nine); and the llama3
    fixture's weights without the scaling (``llama3-unscaled``)."""
    import jax
    from flax import nnx

    models = {name: read(name) for name in READ} | {"llama3-unscaled": read("llama3-unscaled", rope_scaling=None)}
    inputs = {}
    for name in models:
        ref = json.loads((FIXTURES / name.removesuffix("-unscaled") / "reference.json").read_text())
        inputs[name] = np.concatenate([ref["tokens"], np.asarray(ref["windows"])[:, :-1]]).astype(np.int32)

    @jax.jit
    def forward(states, tokens):
        return {n: nnx.merge(models[n][0], states[n])(tokens[n]) for n in tokens}

    out = forward({n: m[1] for n, m in models.items()}, inputs)
    return {n: np.asarray(v, np.float64) for n, v in out.items()}


@pytest.mark.parametrize("name", READ)
def test_dew_gives_transformers_logits_and_losses(name: str, dew_logits: dict[str, np.ndarray]):
    ref = json.loads((FIXTURES / name / "reference.json").read_text())
    logits = dew_logits[name]
    assert np.abs(logits[:1] - np.asarray(ref["logits"])).max() < 1e-4
    windows = np.asarray(ref["windows"])
    shifted = logits[1:] - logits[1:].max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    losses = -np.take_along_axis(logp, windows[:, 1:, None], -1)[..., 0]
    assert np.abs(losses - np.asarray(ref["losses"])).max() < 1e-4
    assert losses.mean() == pytest.approx(ref["mean_loss"], abs=1e-5)


def test_rope_scaling_is_what_makes_the_llama3_fixture_match(dew_logits: dict[str, np.ndarray]):
    """Without the llama3 scaling (the field left unset) the same weights give other logits: the
    fixture's scaling is exercised, not a no-op; and its four frequencies take the three branches."""
    from dew.models.attention import rope_frequencies
    from dew.models.rope_scaling import RopeScaling

    config = json.loads((FIXTURES / "llama3" / "config.json").read_text())
    rope = {k: v for k, v in config["rope_parameters"].items() if k != "rope_theta"}
    scaled, unscaled = (
        np.asarray(rope_frequencies(8, 10000.0, RopeScaling(**rope))),
        np.asarray(rope_frequencies(8, 1e4)),
    )
    assert scaled[0] == unscaled[0] and unscaled[1] / 4 < scaled[1] < unscaled[1]  # kept, interpolated
    np.testing.assert_allclose(scaled[2:], unscaled[2:] / 4, rtol=1e-6)  # divided by the factor
    reference = np.asarray(json.loads((FIXTURES / "llama3" / "reference.json").read_text())["logits"])
    assert np.abs(dew_logits["llama3"][:1] - reference).max() < 1e-4
    assert np.abs(dew_logits["llama3-unscaled"][:1] - reference).max() > 1e-2


def test_the_tokenizer_gives_transformers_ids():
    from dew.data.tokenizer import BPETokenizer

    ref = json.loads((FIXTURES / "t5-f32" / "reference.json").read_text())
    tok = BPETokenizer.from_file(str(FIXTURES / "t5-f32" / "tokenizer.json"))
    assert tok.encode(ref["text"]).tolist() == ref["text_ids"]
    assert tok.decode(ref["text_ids"]) == ref["text"]


@pytest.mark.parametrize(
    "name, message",
    [
        ("refuse-yarn", "config.json has rope_type='yarn'; dew's rotary embedding computes default, linear, llama3"),
        ("refuse-bias", "config.json has attention_bias=True; dew's attention has biases on the query, key and value"),
    ],
)
def test_what_dew_does_not_model_is_refused_by_name(tmp_path: Path, name: str, message: str):
    """The refusal comes from ``dew-train``'s building of the run, before it writes anything."""
    from dew.build import build_run
    from tests.training.mesh_runs import compose

    rng = np.random.default_rng(0)
    rng.integers(0, 64, 2048).astype(np.uint16).tofile(tmp_path / "train.bin")
    cfg = compose(
        "model=transformer",
        "data=token_windows",
        f"data.path={tmp_path / 'train.bin'}",
        "data.seq_len=8",
        "data.vocab_size=64",
        "model.config={hidden_size: 16, depth: 1, num_heads: 2, mlp_hidden: 32}",
        "trainer.steps=1",
        f"trainer.checkpoint_dir={tmp_path / 'ck'}",
        f"trainer.init_from={FIXTURES / name}",
    )
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        recipe, objective, dataset = build_run(cfg)  # config.json is read here, to fill model.config
        recipe.train(objective, dataset, name="refused")
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").iterdir())


@pytest.mark.parametrize(
    "fixture, config, message",
    [
        ("t5-f32", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type='dynamic'"),
        ("t5-f32", {"rope_scaling": {"type": "longrope", "factor": 2.0}}, "rope_type='longrope'"),
        ("t5-f32", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ("t5-f32", {"mlp_bias": True}, "mlp_bias=True"),
        ("t5-f32", {"sliding_window": 4096}, "sliding_window=4096; dew's Llama sees every earlier position"),
        (
            "t5-f32",
            {"rope_theta": 5.0, "rope_parameters": {"rope_theta": 6.0}},
            "rope_theta=5.0 and rope_parameters.rope_theta=6.0",
        ),
        ("t5-f32", {"architectures": ["GemmaForCausalLM"]}, "architectures=\\['GemmaForCausalLM'\\]"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 4}, "use_sliding_window=True"),
        ("qwen2", {"layer_types": ["sliding_attention", "sliding_attention"]}, "layer_types with 'sliding_attention'"),
        ("qwen2", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
        ("qwen3", {"attention_bias": True}, "attention_bias=True"),
        ("qwen3", {"use_sliding_window": True}, "use_sliding_window=True"),
        ("mistral", {"layer_types": ["full_attention", "sliding_attention"]}, "'full_attention', 'sliding_attention'"),
        ("mistral", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type='dynamic'"),
    ],
)
def test_config_fields_refused(fixture: str, config: dict, message: str):
    """What a directory of each family may hold and dew does not compute is refused naming the field;
    Qwen's ``sliding_window`` alone (unused without ``use_sliding_window``) is not."""
    from dew.training.checkpointing import hf_llama

    base = json.loads((FIXTURES / fixture / "config.json").read_text())
    with pytest.raises(ValueError, match=message):
        hf_llama.refuse_unmodelled({**base, **config}, "dir")
    if fixture == "qwen2":
        hf_llama.refuse_unmodelled({**base, "sliding_window": 32768}, "dir")  # Qwen2.5's, with use_sliding_window false


def test_a_run_whose_fields_differ_is_told_which_to_set():
    from dew.training.checkpointing import hf_llama

    f = fields(FIXTURES / "llama3", rope_scaling=None)
    with pytest.raises(ValueError, match=r"config.json has rope_scaling=\{rope_type: llama3, factor: 4.0"):
        hf_llama.check_config(f, str(FIXTURES / "llama3"))
    f = fields(FIXTURES / "tied", tie_embeddings=False)
    with pytest.raises(ValueError, match="tie_word_embeddings=true, this model model.config.tie_embeddings=false"):
        hf_llama.check_config(f, str(FIXTURES / "tied"))


def test_rope_scaling_as_a_model_config_field():
    """``model.config.rope_scaling`` takes a partial object (the llama3-only fields keep their
    defaults); a rope_type dew does not compute is refused naming the field and the choices."""
    from dew.contract.models import of
    from dew.contract.typed import ConfigError
    from dew.models.rope_scaling import RopeScaling

    f = of("transformer", {"rope_scaling": {"rope_type": "linear", "factor": 2}}).fields
    assert f.rope_scaling == RopeScaling("linear", 2.0, 1.0, 4.0, 8192)
    assert of("transformer", {}).fields.rope_scaling is None
    with pytest.raises(ConfigError, match="model.config.rope_scaling.rope_type"):
        of("transformer", {"rope_scaling": {"rope_type": "yarn", "factor": 2}})
    with pytest.raises(ConfigError, match="low_freq_factor=4.0 and high_freq_factor=1.0"):
        of(
            "transformer",
            {"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4.0, "high_freq_factor": 1.0}},
        )


def test_weights_cast_to_the_runs_param_dtype():
    """bfloat16 weights read into bfloat16 parameters are the saved bits; float16 ones are rounded
    once, as NumPy rounds float16 to bfloat16."""
    import jax
    import ml_dtypes
    from safetensors.numpy import load_file

    from dew.training.checkpointing import hf_weights

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    for name, saved in (("bf16", "model.safetensors"), ("sharded", "model-00001-of-00003.safetensors")):
        f = fields(FIXTURES / name, param_dtype="bfloat16")
        target = {("embed", "embedding"): jax.ShapeDtypeStruct((64, 16), ml_dtypes.bfloat16, sharding=device)}
        value = np.asarray(hf_weights.read(f, str(FIXTURES / name), target)[("embed", "embedding")])
        expected = load_file(str(FIXTURES / name / saved))["model.embed_tokens.weight"].astype(ml_dtypes.bfloat16)
        assert value.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(value.view(np.uint16), expected.view(np.uint16))


def test_a_sharded_directory_is_a_warm_start_source():
    from dew.training.checkpointing import warmstart

    assert not (FIXTURES / "sharded" / "model.safetensors").exists()
    assert warmstart.resolve(str(FIXTURES / "sharded")) == warmstart.Source(str(FIXTURES / "sharded"), "hf")
