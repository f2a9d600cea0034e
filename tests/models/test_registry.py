"""The architecture registry: fields, their errors, the data's fields, precision injection."""

import subprocess
import sys

import pytest
from flax import nnx

from dew.config import ModelConfig
from dew.contract.typed import ConfigError
from dew.models import build, resolve_fields, with_data_fields
from dew.models.simple_dit import SimpleDiTFields
from dew.models.transformer import TransformerFields


def test_registry_and_flops_import_no_jax():
    code = (
        "import sys, dew.models, dew.contract.models, dew.models.flops; assert 'jax' not in sys.modules, 'jax imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_defaults_resolve():
    assert resolve_fields("simple_dit", {}) == SimpleDiTFields()
    assert resolve_fields("transformer", {"depth": 2}).depth == 2


@pytest.mark.parametrize(
    "name, values, message",
    [
        (
            "simple_dit",
            {"hiden_size": 64},
            r"architecture 'simple_dit' takes no field 'hiden_size'; it takes input_size, .*hidden_size",
        ),
        (
            "transformer",
            {"depth": "four"},
            r"model.config.depth: expected int.*architecture 'transformer'; "
            r"it takes vocab_size, .*depth",
        ),
        ("simple_dit", {"learn_sigma": 1}, r"model.config.learn_sigma.*it takes"),
        ("simple_dit", {"dtype": "float64"}, r"model.config.dtype.*it takes"),
        ("transformer", {"attention_impl": "flash"}, r"model.config.attention_impl.*it takes"),
        ("simple_dit", {"hidden_size": 100, "num_heads": 6}, r"hidden_size=100 is not a multiple of num_heads=6"),
        ("simple_dit", {"vocab_size": 10, "learn_sigma": True}, r"learn_sigma=True .* token data"),
        ("simple_dit", {"depth": 0}, r"depth=0 must be >= 1"),
        ("simple_dit", {"num_classes": -1}, r"num_classes=-1 must be >= 0"),
        ("transformer", {"num_heads": 12, "num_kv_heads": 5}, r"num_heads=12 is not a multiple of num_kv_heads=5"),
        ("transformer", {"hidden_size": 60, "num_heads": 4}, r"head_dim=15 must be even"),
        ("transformer", {"mlp_hidden": 0}, r"mlp_hidden=0 must be >= 1"),
    ],
)
def test_bad_fields_raise_naming_the_field(name, values, message):
    with pytest.raises(ConfigError, match=message):
        resolve_fields(name, values)


def test_unknown_architecture_lists_the_known():
    with pytest.raises(ValueError, match="unknown architecture 'unet'; known: simple_dit, transformer"):
        resolve_fields("unet", {})


def test_data_dependent_check_runs_at_build():
    with pytest.raises(ConfigError, match="input_size=9 is not a multiple of patch_size=2"):
        build(
            "simple_dit",
            {"input_size": 9, "in_channels": 1, "hidden_size": 16, "depth": 1, "num_heads": 2},
            nnx.Rngs(0),
        )


def test_data_fields_fill_in_and_conflicts_raise():
    data = {"input_size": 8, "in_channels": 1, "num_classes": 10, "seq_len": 99}
    assert with_data_fields("simple_dit", {"depth": 2}, data) == {
        "depth": 2,
        "input_size": 8,
        "in_channels": 1,
        "num_classes": 10,
    }
    assert with_data_fields("simple_dit", {"num_classes": 10}, data)["num_classes"] == 10
    with pytest.raises(
        ConfigError,
        match=r"model.config.num_classes=100 conflicts with the data's "
        r"num_classes=10",
    ):
        with_data_fields("simple_dit", {"num_classes": 100}, data)


def test_a_vocabulary_may_be_padded_past_the_datas():
    """transformer's ``vocab_size`` (its ``padded_fields``) may be larger than the data's: the
    model's rows; a smaller one, or a padded ``seq_len`` or simple_dit vocabulary, is refused."""
    data = {"vocab_size": 300, "seq_len": 16}
    assert with_data_fields("transformer", {"vocab_size": 320}, data) == {"vocab_size": 320, "seq_len": 16}
    assert with_data_fields("transformer", {}, data)["vocab_size"] == 300
    with pytest.raises(ConfigError) as caught:
        with_data_fields("transformer", {"vocab_size": 256}, data)
    assert str(caught.value) == (
        "model.config.vocab_size=256 conflicts with the data's vocab_size=300 (architecture 'transformer'); "
        "drop the field and it follows the data, or set it >= 300 (rows past the data's are padding)"
    )
    with pytest.raises(ConfigError, match="model.config.seq_len=32 conflicts with the data's seq_len=16"):
        with_data_fields("transformer", {"seq_len": 32}, data)
    with pytest.raises(ConfigError, match="model.config.vocab_size=320 conflicts with the data's vocab_size=300"):
        with_data_fields("simple_dit", {"vocab_size": 320}, data)


def test_model_config_writes_the_runs_precision_where_declared():
    config = ModelConfig(
        "transformer",
        {"depth": 2, "dtype": "float32"},
        dtype="float32",
        param_dtype="bfloat16",
        matmul_precision="highest",
    )
    fields = config.fields()
    assert fields["dtype"] == "float32"  # set in both places, agreeing (disagreeing raises)
    assert fields["param_dtype"] == "bfloat16" and fields["matmul_precision"] == "highest"
    assert config.precision_settings() == {"param_dtype", "matmul_precision", "attention_impl"}
    record = resolve_fields("transformer", fields)
    assert isinstance(record, TransformerFields) and record.param_dtype == "bfloat16"
