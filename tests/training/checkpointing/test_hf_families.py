"""A Hugging Face directory used without restating its config, for each family dew reads (Llama,
Qwen2, Qwen3, Mistral; the fixtures ``tests/fixtures/hf`` that transformers wrote): ``trainer.init_from``
fills the ``model.config`` fields the run leaves out (``hf_config.with_checkpoint_fields``), a field set
otherwise is refused by name, a hub name is read from the local cache; a damaged directory or an
option dew does not compute is refused in one line with nothing written; and ``dew-export`` writes
each family so that the model transformers would compute from the files is dew's.

That dew's logits are transformers' on these fixtures is ``test_hf_fixtures.py``'s; that transformers
loads what ``dew-export`` writes, ``tests/fixtures/hf/make.py --check-export``'s
(``export_check.txt``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
FAMILIES = {"t5-f32": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mistral": "mistral"}
"""A fixture of each family."""


def token_data(tmp: Path, vocab: int) -> Path:
    rng = np.random.default_rng(0)
    rng.integers(0, vocab, 4096).astype(np.uint16).tofile(tmp / "train.bin")
    return tmp / "train.bin"


def tokenizer_vocab(source: str | Path) -> int:
    """The ids of the directory's tokenizer (300 for each family's fixture, fewer than the qwen2
    fixture's 320 embedding rows, padded as Qwen2.5's are), else its ``config.json``'s rows."""
    from dew.data.tokenizer import PretrainedTokenizer

    if not Path(source).is_dir():
        return 300
    if (Path(source) / "tokenizer.json").is_file():
        return PretrainedTokenizer.from_path(str(source)).vocab_size
    return json.loads((Path(source) / "config.json").read_text())["vocab_size"]


def recipe(tmp: Path, source: str | Path, *overrides: str, vocab: int | None = None):
    """``dew-train``'s typed config: token windows of the fixture's tokenizer's vocabulary (or
    ``vocab``), ``trainer.init_from`` the source, no ``model.config`` unless ``overrides`` give one."""
    from tests.training.mesh_runs import compose

    vocab = vocab or tokenizer_vocab(source)
    return compose(
        "data=token_windows",
        f"data.path={token_data(tmp, vocab)}",
        "data.seq_len=8",
        f"data.vocab_size={vocab}",
        "model.dtype=float32",
        "trainer.batch_size=4",
        "trainer.steps=2",
        "trainer.log_every=1",
        "trainer.eval_every=null",
        "trainer.checkpoint_every=2",
        "trainer.compilation_cache_dir=null",
        f"trainer.checkpoint_dir={tmp / 'ck'}",
        f"trainer.init_from={source}",
        *overrides,
    )


def nothing_written(tmp: Path) -> bool:
    return not (tmp / "ck").exists() or not any((tmp / "ck").iterdir())


def copy(tmp: Path, name: str) -> Path:
    out = tmp / name
    shutil.copytree(FIXTURES / name, out)
    return out


# ------------------------------------------------------------------ the model from config.json


@pytest.mark.parametrize("name", list(FAMILIES))
def test_init_from_fills_every_field_the_run_leaves_out(tmp_path: Path, name: str):
    from dew.training.checkpointing import hf_config

    run = hf_config.with_checkpoint_fields(recipe(tmp_path, FIXTURES / name))
    config = json.loads((FIXTURES / name / "config.json").read_text())
    got = run.model.config
    assert (got["hidden_size"], got["depth"], got["num_heads"], got["mlp_hidden"]) == (
        config["hidden_size"],
        config["num_hidden_layers"],
        config["num_attention_heads"],
        config["intermediate_size"],
    )
    assert got["tie_embeddings"] == config["tie_word_embeddings"]
    assert got["vocab_size"] == config["vocab_size"] == {"qwen2": 320}.get(name, 300)  # the embedding's rows
    assert (got["qkv_bias"], got["qk_norm"], got["sliding_window"]) == {
        "t5-f32": (False, False, None),
        "qwen2": (True, False, None),
        "qwen3": (False, True, None),
        "mistral": (False, False, 4),
    }[name]


def test_a_field_set_otherwise_is_refused_by_name(tmp_path: Path):
    from dew.build import build_run
    from dew.contract.typed import ConfigError
    from dew.training.checkpointing import hf_config

    source = FIXTURES / "qwen2"
    with pytest.raises(ConfigError) as caught:
        build_run(recipe(tmp_path, source, "model.config={hidden_size: 48}"))
    assert str(caught.value) == (
        f"model.config.hidden_size=48 conflicts with config.json of trainer.init_from='{source}' "
        "(hidden_size gives hidden_size=16); drop the field and it follows the directory"
    )
    with pytest.raises(ConfigError, match=r"model.config.qkv_bias=false conflicts .* \(architectures gives"):
        hf_config.with_checkpoint_fields(recipe(tmp_path, source, "model.config={qkv_bias: false}"))
    # A field set to the directory's value (the rope scaling's defaults left out) is no conflict.
    same = "model.config={depth: 2, qkv_bias: true, rope_theta: 10000, tie_embeddings: true}"
    assert hf_config.with_checkpoint_fields(recipe(tmp_path, source, same)).model.config["hidden_size"] == 16
    assert nothing_written(tmp_path)


@pytest.mark.slow
def test_dew_train_from_a_directory_alone_then_rebuilt_without_it(tmp_path: Path):
    """``dew-train ... trainer.init_from=DIR`` with no ``model.config``: the run trains, run.json holds
    the directory's fields, and once the directory is gone the run still rebuilds (what ``dew-sample``
    and ``dew-eval`` of the run read), its parameters the trained ones."""
    from flax import nnx

    from dew.build import build_run
    from dew.inference.restore import restore

    source = copy(tmp_path, "qwen3")
    run, objective, dataset = build_run(recipe(tmp_path, source))
    run.train(objective, dataset, name="tuned")
    record = json.loads((tmp_path / "ck" / "tuned" / "run.json").read_text())
    assert record["trainer"]["init_from"] == str(source)
    assert record["model"]["config"] | {"qk_norm": True, "head_dim": 8, "num_kv_heads": 2} == record["model"]["config"]
    shutil.rmtree(source)
    restored = restore(str(tmp_path / "ck" / "tuned"))
    scales = nnx.state(restored.model, nnx.Param)["blocks"]["attn"]["q_norm"]["scale"]
    assert scales.shape == (2, 8)


@pytest.mark.slow
def test_a_padded_directory_fine_tunes_as_it_is_and_exports_its_rows(tmp_path: Path):
    """The qwen2 fixture pads its embedding as Qwen2.5's is (320 rows for a tokenizer of 300 ids):
    ``dew-train ... trainer.init_from=DIR`` with no ``model.config`` trains on data of the tokenizer's
    300 ids with the directory's 320 rows, run.json records 320, and ``dew-export`` writes the 320
    rows back (that transformers loads it: ``make.py --check-export``). Once the directory is gone,
    ``dew-sample`` and ``dew-eval`` rebuild the run from its record: 320 rows over the data's 300 ids."""
    import jax
    from safetensors import safe_open

    from dew.build import build_run
    from dew.cli import export
    from dew.cli.eval import parse_args
    from dew.inference import evaluating
    from dew.inference.restore import restore

    source = copy(tmp_path, "qwen2")
    run, objective, dataset = build_run(recipe(tmp_path, source))
    assert (run.model.config["vocab_size"], dataset.model_fields()["vocab_size"]) == (320, 300)
    run.train(objective, dataset, name="padded")
    run_dir = tmp_path / "ck" / "padded"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["model"]["config"]["vocab_size"] == 320
    shutil.rmtree(source)  # the record alone gives the model's rows now
    restored = restore(str(run_dir))  # dew-sample's rebuild
    ids, _ = restored.objective.sample_text(restored.model, jax.random.key(0), 2, max_new_tokens=6)
    assert ids.shape == (2, 7) and ids.max() < 300
    _, written = evaluating.run(parse_args([str(run_dir), f"data.val_path={tmp_path / 'train.bin'}"]))
    assert np.isfinite(json.loads(Path(str(written)).read_text())["metrics"]["eval/loss"])
    export.main([str(tmp_path / "ck" / "padded"), "--to", str(tmp_path / "hf")])
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["vocab_size"] == 320
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "np") as f:
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [320, 16]


def test_a_vocabulary_past_the_directorys_rows_is_refused_in_one_line(tmp_path: Path):
    """Data of more ids than the directory's embedding has rows (another tokenizer's) is refused
    before anything is written, naming both and where the model's came from; a ``vocab_size`` the
    run sets against ``config.json``'s is refused by name as the other fields are."""
    from dew.build import build_run
    from dew.contract.typed import ConfigError

    source = FIXTURES / "qwen2"
    with pytest.raises(ConfigError) as caught:
        build_run(recipe(tmp_path, source, vocab=400))
    assert str(caught.value) == (
        "model.config.vocab_size=320 conflicts with the data's vocab_size=400 (architecture 'transformer'); "
        "drop the field and it follows the data, or set it >= 400 (rows past the data's are padding) "
        f"(vocab_size is config.json's of trainer.init_from='{source}')"
    )
    with pytest.raises(ConfigError, match=r"model.config.vocab_size=300 conflicts with config.json .* vocab_size=320"):
        build_run(recipe(tmp_path, source, "model.config={vocab_size: 300}"))
    assert nothing_written(tmp_path)


def test_dew_plan_takes_the_model_from_the_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from omegaconf import OmegaConf

    from dew.cli.plan import plan_from_hydra

    plan = plan_from_hydra(OmegaConf.create(recipe(tmp_path, FIXTURES / "qwen2").to_dict()))
    shapes = {row.path: row.shape for row in plan.params}
    assert shapes["blocks/attn/q/bias"] == (2, 2, 8)
    assert "lm_head/kernel" not in shapes  # tied, as config.json says
    assert "blocks/attn/q/bias" in capsys.readouterr().out


def test_a_hub_name_is_read_from_the_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``trainer.init_from=owner/name`` with the model in the Hugging Face cache (as ``hf download``
    leaves it: ``models--owner--name/snapshots/<commit>/`` and ``refs/main``): the fields and the
    source are the snapshot's, and run.json keeps the name; a name the cache lacks is refused."""
    from huggingface_hub import constants

    from dew.training.checkpointing import hf_config, warmstart

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--tiny--qwen3"
    shutil.copytree(FIXTURES / "qwen3", repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    run = hf_config.with_checkpoint_fields(recipe(tmp_path, "tiny/qwen3"))
    assert run.trainer.init_from == "tiny/qwen3"
    assert run.model.config["qk_norm"] is True and run.model.config["head_dim"] == 8
    assert warmstart.resolve("tiny/qwen3") == warmstart.Source(str(repo / "snapshots" / commit), "hf")
    with pytest.raises(ValueError, match="trainer.init_from='tiny/absent': no such directory, and no model"):
        hf_config.with_checkpoint_fields(recipe(tmp_path, "tiny/absent"))


# --------------------------------------------------------------------------- refused, nothing written


def rewrite(file: Path, name: str, value: np.ndarray) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(file))
    tensors[name] = value
    save_file(tensors, str(file), metadata={"format": "pt"})


def shard_of(directory: Path, name: str) -> Path:
    index = directory / "model.safetensors.index.json"
    if not index.exists():
        return directory / "model.safetensors"
    return directory / json.loads(index.read_text())["weight_map"][name]


def damage(directory: Path, how: str) -> tuple[Path, str]:
    """Damage the copy ``directory`` as ``how`` says; returns the file the refusal must name and a
    piece of the message."""
    tensor = "model.layers.1.self_attn.k_proj.weight"
    file = shard_of(directory, tensor)
    if how == "truncated":
        data = file.read_bytes()
        file.write_bytes(data[: len(data) // 2])
        return file, "is not whole safetensors"
    if how == "missing shard":
        file.unlink()
        return Path(file.name), "which the directory lacks"
    shape = json.loads((directory / "config.json").read_text())["hidden_size"]
    rewrite(file, tensor, np.zeros((3, shape), np.float32))
    return file, f"holds {tensor} of shape [3, {shape}]; config.json gives it"


DAMAGED = [(name, how) for name in FAMILIES for how in ("truncated", "wrong shape")] + [
    ("sharded", "missing shard"),
    ("qwen2", "missing shard"),
    ("mistral", "missing shard"),
]


@pytest.mark.parametrize("name, how", DAMAGED)
def test_a_damaged_directory_is_refused_in_one_line_naming_the_file(tmp_path: Path, name: str, how: str):
    """Through ``dew-train``'s own path (the run built, then trained): the refusal comes before
    anything is written, in one line that names the file."""
    from dew.build import build_run

    source = copy(tmp_path, name)
    file, message = damage(source, how)
    with pytest.raises(ValueError) as caught:
        run, objective, dataset = build_run(recipe(tmp_path, source))
        run.train(objective, dataset, name="refused")
    said = str(caught.value)
    assert "\n" not in said and str(file) in said and message in said, said
    assert nothing_written(tmp_path)


@pytest.mark.parametrize(
    "name, change, message",
    [
        ("t5-f32", {"rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, "rope_type='yarn'"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 4}, "use_sliding_window=True"),
        ("qwen3", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type='dynamic'"),
        ("mistral", {"layer_types": ["sliding_attention", "full_attention"]}, "layer_types with 'full_attention'"),
    ],
)
def test_an_option_dew_does_not_compute_is_refused_by_name(tmp_path: Path, name: str, change: dict, message: str):
    from dew.build import build_run

    source = copy(tmp_path, name)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps(config | change))
    with pytest.raises(ValueError, match=message):
        build_run(recipe(tmp_path, source))
    assert nothing_written(tmp_path)


# -------------------------------------------------------------------------------------- export


EXPORTED = {
    "Qwen2ForCausalLM": {"qkv_bias": True, "mup": True, "mup_base_width": 16},
    "Qwen3ForCausalLM": {"qk_norm": True, "mup": True, "mup_base_width": 16, "num_kv_heads": 2},
    "MistralForCausalLM": {"sliding_window": 3, "residual_multiplier": 0.5},
}
"""dew fields of each family's export, with scales transformers has not (muP, a residual multiplier)
that the export folds into the weights."""


@pytest.mark.slow
@pytest.mark.parametrize("family", list(EXPORTED))
def test_an_export_is_the_model_transformers_computes(tmp_path: Path, family: str):
    """dew's model (with muP's multipliers) exported in its family's layout, then read back as the
    plain model of that family, which is what transformers computes from the files: the same logits.
    The config written is the family's, and fills the same fields back."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dew.contract.models import architecture, of
    from dew.training.checkpointing import hf_config, hf_weights, warmstart

    extra = EXPORTED[family]
    base = {"vocab_size": 40, "seq_len": 12, "hidden_size": 32, "depth": 2, "num_heads": 4, "mlp_hidden": 48}
    f = of("transformer", {**base, **extra, "dtype": "float32", "scan_layers": False}).fields
    # Built as shapes, then every parameter drawn with NumPy: an initialisation ran a program per
    # parameter shape (jax.random.normal's, ~1.3 CPU-s for the first family), all of it overwritten.
    model = nnx.eval_shape(lambda: architecture("transformer")(f).build(nnx.Rngs(params=0)))
    state = nnx.state(model, nnx.Param)  # the model's only variables
    rng = np.random.default_rng(1)
    nnx.update(model, jax.tree.map(lambda x: jnp.asarray(rng.standard_normal(x.shape) * 0.3, x.dtype), state))
    tokens = np.random.default_rng(0).integers(0, 40, (2, 12)).astype(np.int32)
    ours = np.asarray(model(tokens))

    params = {"/".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    hf_weights.write_directory(f, params, str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [family]
    plain = hf_config.model_config(str(tmp_path))  # the family's model, no muP or multiplier
    assert {k: plain[k] for k in ("qkv_bias", "qk_norm", "sliding_window")} == {
        "qkv_bias": f.qkv_bias,
        "qk_norm": f.qk_norm,
        "sliding_window": f.sliding_window,
    }
    g = of("transformer", {**plain, "vocab_size": 40, "seq_len": 12, "dtype": "float32", "scan_layers": False}).fields
    graph, abstract = nnx.split(nnx.eval_shape(lambda: architecture("transformer")(g).build(nnx.Rngs(params=0))))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = {p: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=device) for p, v in nnx.to_flat_state(abstract)}
    nnx.replace_by_pure_dict(abstract, warmstart._nested(hf_weights.read(g, str(tmp_path), target)))
    theirs = np.asarray(nnx.merge(graph, abstract)(tokens))
    assert np.abs(theirs - ours).max() < 1e-4 * max(1.0, np.abs(ours).max())


def test_no_family_has_two_of_the_fields():
    from dew.contract.models import of
    from dew.training.checkpointing import hf_config

    f = of("transformer", {"qk_norm": True, "qkv_bias": True}).fields
    with pytest.raises(ValueError, match="model.config sets qkv_bias and qk_norm; no Hugging Face family has both"):
        hf_config.family_for(f, "dew-export")


def test_dew_eval_names_the_families_the_reader_reads():
    from dew.inference.composing import HF_ARCHITECTURES
    from dew.training.checkpointing.hf_config import FAMILIES

    assert set(HF_ARCHITECTURES) == set(FAMILIES)
