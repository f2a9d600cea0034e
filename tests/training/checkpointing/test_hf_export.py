"""What ``dew-export`` writes for transformers: bfloat16 weights sharded behind an index, a tied head,
RoPE scaling and grouped-query heads in ``config.json`` (both spellings), ``generation_config.json``,
and dew's byte tokenizer as a ``tokenizer.json`` that gives dew's ids. That transformers itself
loads such a directory and computes dew's logits is ``tests/fixtures/hf/make.py --check-export``'s
record (``tests/fixtures/hf/export_check.txt``); here, without torch, the files are read back."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

FIELDS = dict(
    vocab_size=40,
    seq_len=16,
    hidden_size=16,
    depth=3,
    num_heads=4,
    num_kv_heads=2,
    mlp_hidden=32,
    tie_embeddings=True,
    rope_theta=500.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8,
    },
    norm_eps=1e-5,
    dtype="float32",
    param_dtype="float32",
)


def test_bf16_shards_of_a_tied_rope_scaled_gqa_model_read_back_exactly(tmp_path: Path):
    """Every parameter read back is the trained one rounded once to bfloat16; the config carries
    what transformers 5 and 4 read."""
    import jax
    import ml_dtypes
    from flax import nnx

    from dew.contract.models import of
    from dew.training.checkpointing import hf_weights, warmstart

    fields = of("transformer", FIELDS).fields
    abstract = nnx.eval_shape(lambda: of("transformer", FIELDS).build(nnx.Rngs(params=0)))
    state = nnx.state(abstract, nnx.Param)
    flat = dict(nnx.to_flat_state(state))
    rng = np.random.default_rng(0)
    params = {"/".join(map(str, p)): rng.normal(0, 0.3, v.shape).astype(np.float32) for p, v in flat.items()}
    out = tmp_path / "hf"
    out.mkdir()
    written = hf_weights.write_directory(fields, params, str(out), dtype="bfloat16", max_bytes=2500, eos_token_id=7)

    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) > 1 and set(written) == {*shards, hf_weights.INDEX, "config.json", "generation_config.json"}
    umask = os.umask(0)
    os.umask(umask)
    modes = {name: (out / name).stat().st_mode & 0o777 for name in written}
    assert set(modes.values()) == {0o666 & ~umask}, modes  # the weights as ordinary as the JSON files
    index = json.loads((out / hf_weights.INDEX).read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert "lm_head.weight" not in index["weight_map"]  # tied: the head is the embedding
    assert index["metadata"]["total_size"] == 2 * sum(v.size for v in params.values())
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"] == {"rope_theta": 500.0, **FIELDS["rope_scaling"]}
    assert config["rope_scaling"] == FIELDS["rope_scaling"] and config["rope_theta"] == 500.0  # transformers 4
    assert config["max_position_embeddings"] == 32  # 8 positions scaled by 4: above the original
    assert (config["tie_word_embeddings"], config["num_key_value_heads"], config["head_dim"]) == (True, 2, 4)
    assert config["dtype"] == config["torch_dtype"] == "bfloat16" and config["eos_token_id"] == 7
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 7

    assert hf_weights.dew_shapes(fields, str(out)) == warmstart.shapes_of(state)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {p: jax.ShapeDtypeStruct(v.shape, np.float32, sharding=device) for p, v in flat.items()}
    back = hf_weights.read(fields, str(out), target)
    for p, value in back.items():
        rounded = params["/".join(map(str, p))].astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(value), rounded)


def test_the_byte_tokenizer_as_a_tokenizers_file_gives_dew_ids(tmp_path: Path):
    import tokenizers

    from dew.data.tokenizer import ByteTokenizer
    from dew.training.checkpointing import hf_tokenizer

    written = hf_tokenizer.write({"kind": "byte", "eos_id": 256}, str(tmp_path), max_length=64)
    assert written == ["tokenizer.json", "tokenizer_config.json"]
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "naïve café, 東京 — \x00\x7f\n\ttabs  and  spaces <|endoftext|>"
    ids = tok.encode(text).ids
    ours = ByteTokenizer().encode(text.removesuffix("<|endoftext|>")).tolist() + [256]
    assert ids == ours  # every byte its own id; the end-of-text token is 256
    assert tok.decode(ids, skip_special_tokens=False) == text
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|endoftext|>" and config["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_a_models_own_tokenizer_is_exported_as_the_run_kept_it(tmp_path: Path):
    """A run trained on a model directory's tokenizer (a warm start from a downloaded Llama) exports
    that tokenizer: its files as the run kept them, or, without a tokenizer_config.json, one naming
    its end-of-text token; dew reads either back with the same ids and special tokens."""
    from dew.data.tokenizer import load_tokenizer, save_record, saved_record
    from dew.training.checkpointing import hf_tokenizer

    model = Path(__file__).resolve().parents[2] / "fixtures" / "hf" / "t5-f32"
    source = load_tokenizer(str(model), "data.tokenizer")
    kept = tmp_path / "run-tokenizer"
    save_record({**source.record(), "file": source.file}, str(kept))
    for name, record in (("with-config", saved_record(str(kept))), ("bare", None)):
        if record is None:  # the model directory had no tokenizer_config.json
            (kept / "tokenizer_config.json").unlink()
            record = saved_record(str(kept))
        out = tmp_path / name
        out.mkdir()
        assert hf_tokenizer.write(record, str(out), max_length=64) == ["tokenizer.json", "tokenizer_config.json"]
        assert (out / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()
        back = load_tokenizer(str(out), "data.tokenizer")
        assert (back.eos_id, back.bos_id) == (source.eos_id, source.bos_id), name
        text = "The quick brown fox, naïve café."
        assert back.encode(text).tolist() == source.encode(text).tolist(), name
    with_config = json.loads((tmp_path / "with-config" / "tokenizer_config.json").read_text())
    assert with_config == json.loads((model / "tokenizer_config.json").read_text())


@pytest.mark.parametrize(
    "text, size", [("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("2GiB", 2 * 2**30), ("1000", 1000), ("1.5kb", 1500)]
)
def test_shard_sizes_read_as_transformers_reads_them(text: str, size: int):
    from dew.training.checkpointing import hf_weights

    assert hf_weights.parse_size(text) == size


@pytest.mark.parametrize(
    "args, message",
    [
        (["--max-shard-size", "5 parsecs"], "--max-shard-size='5 parsecs': expected a positive size"),
        (["--merge-lora", "--dtype", "bfloat16"], "--dtype and --max-shard-size choose the Hugging Face layout"),
    ],
)
def test_bad_export_options_exit_2_naming_the_option(tmp_path: Path, capsys, args: list[str], message: str):
    from dew.cli import export

    with pytest.raises(SystemExit) as stop:
        export.main([str(tmp_path / "no-run"), "--to", str(tmp_path / "out"), *args])
    assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
