"""hf_text from save_to_disk, JSONL and Parquet: packing against a plain reference, exact resume, every
window (cache) or record (stream) once per epoch over 2 processes, the cache built once and rebuilt
when damaged; pretrained tokenizers; dew-prepare's dataset sources; bad inputs."""

import json
import threading
import time

import numpy as np
import pytest

from dew.contract.lock import RunLock
from dew.data import hf_text
from dew.data.prepare import main as prepare_main
from dew.data.specs import HFText, TextStream, TokenWindows, datasets
from dew.data.tokenizer import ByteTokenizer, PretrainedTokenizer, from_record

L = 8
TEXTS = [f"record {i}: " + "abcdefgh"[: i % 8 + 1] * (i % 5 + 1) for i in range(23)]


@pytest.fixture(autouse=True)
def _caches(tmp_path, monkeypatch):
    """The token cache and the datasets library's own cache in the test's directory."""
    import datasets as hf

    monkeypatch.setenv("DEW_DATA_DIR", str(tmp_path / "dew-cache"))
    monkeypatch.setattr(hf.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def write_source(root, kind, texts=TEXTS, field="text"):
    """``texts`` as one of the sources hf_text reads; returns its data.path."""
    import datasets as hf

    rows = [{field: t, "id": i} for i, t in enumerate(texts)]
    if kind == "jsonl":
        path = root / "part.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif kind == "parquet":
        path = root / "part.parquet"
        hf.Dataset.from_list(rows).to_parquet(str(path))
    else:
        path = root / "saved"
        hf.Dataset.from_list(rows).save_to_disk(str(path))
    return str(path)


def byte_ids(texts):
    return np.concatenate([list(t.encode()) + [256] for t in texts]).astype(np.int32)


def packed(ids, n):
    """The first ``n`` non-overlapping windows of ``L + 1`` of ``ids`` repeated pass after pass."""
    reps = -(-n * (L + 1) // len(ids)) + 1
    return np.tile(ids, reps)[: n * (L + 1)].reshape(n, L + 1)


@pytest.mark.parametrize("kind", ["saved", "jsonl", "parquet"])
def test_cache_reads_windows_resumes_and_shards(tmp_path, kind):
    path = write_source(tmp_path, kind)
    assert datasets["hf_text"] is HFText
    ds = HFText(path=path, seq_len=L).load(batch_size=4, seed=3)
    ids = byte_ids(TEXTS)
    n = (len(ids) - 1) // L
    assert ds.num_records == n and ds.model_fields() == {"vocab_size": 257, "seq_len": L}
    # The windows of token_windows over the same ids, in its shuffled order.
    every = ds.iterator().next(batch_size=n)["tokens"]
    order = np.random.default_rng([3, 0]).permutation(n)
    np.testing.assert_array_equal(every, np.stack([ids[i * L : i * L + L + 1] for i in order]))
    # Resumed mid-epoch: bit-identical; 2 processes: each window once per epoch.
    it = ds.iterator()
    it.next(), it.next()
    state = json.loads(json.dumps(it.get_state()))
    want = [it.next()["tokens"] for _ in range(40)]
    fresh = ds.iterator()
    fresh.set_state(state)
    for w in want:
        np.testing.assert_array_equal(fresh.next()["tokens"], w)
    a, b = ds.iterator(0, 2), ds.iterator(1, 2)
    seen = np.concatenate([x for _ in range(n // 4) for x in (a.next()["tokens"], b.next()["tokens"])])
    np.testing.assert_array_equal(seen, every[: 4 * (n // 4)])  # every a permutation of the windows


def test_cache_is_built_once_reused_and_rebuilt_when_damaged(tmp_path, monkeypatch):
    path = write_source(tmp_path, "jsonl")
    first = HFText(path=path, seq_len=L).load(4, 0).iterator().next(batch_size=16)["tokens"]
    (cache,) = [p for p in (tmp_path / "dew-cache" / "hf_text").iterdir() if p.is_dir() and "." not in p.name]

    def no_tokenizing(self, text):
        raise AssertionError("the cache was tokenized again")

    with monkeypatch.context() as m:  # another run, another seq_len: the same cache, no tokenization
        m.setattr(ByteTokenizer, "encode", no_tokenizing)
        again = HFText(path=path, seq_len=L).load(4, 0).iterator().next(batch_size=16)["tokens"]
        assert HFText(path=path, seq_len=4).load(4, 0).num_records == (len(byte_ids(TEXTS)) - 1) // 4
    np.testing.assert_array_equal(again, first)
    # A truncated shard is not read: the cache is built again, whole.
    train = cache / "train.bin"
    train.write_bytes(train.read_bytes()[:-10])
    rebuilt = HFText(path=path, seq_len=L).load(4, 0).iterator().next(batch_size=16)["tokens"]
    np.testing.assert_array_equal(rebuilt, first)
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name, f"{cache.name}.lock"]
    # A changed source is another cache.
    (tmp_path / "part.jsonl").write_text(json.dumps({"text": "other text " * 9}) + "\n")
    other = HFText(path=path, seq_len=L).load(4, 0)
    assert other.num_records == (len(byte_ids(["other text " * 9])) - 1) // L


def test_one_process_builds_the_cache_while_another_waits(tmp_path, monkeypatch):
    path = write_source(tmp_path, "jsonl")
    spec = HFText(path=path, seq_len=L)
    tok = ByteTokenizer()
    train, val = hf_text.sources(spec)
    directory = tmp_path / "dew-cache" / "hf_text" / hf_text.cache_key(spec, tok, train, val)
    real_build, builds = hf_text.build_cache, []
    monkeypatch.setattr(hf_text, "build_cache", lambda *a: builds.append(a))
    held = RunLock(f"{directory}.lock").acquire()  # another process is building it
    done = []
    waiter = threading.Thread(target=lambda: done.append(spec.load(4, 0)))
    waiter.start()
    time.sleep(0.5)
    assert waiter.is_alive() and not directory.exists()  # it waits, and writes nothing
    real_build(str(directory), hf_text.cache_key(spec, tok, train, val), tok, train, val)
    held.release()
    waiter.join(10)
    assert done and done[0].num_records == (len(byte_ids(TEXTS)) - 1) // L and builds == []


@pytest.mark.parametrize("kind", ["saved", "jsonl", "parquet"])
def test_stream_packs_in_order_resumes_and_splits_records_over_processes(tmp_path, kind):
    path = write_source(tmp_path, kind)
    ds = HFText(path=path, seq_len=L, mode="stream").load(batch_size=4, seed=0)
    assert ds.num_records is None and ds.resumable and ds.model_fields() == {"vocab_size": 257, "seq_len": L}
    ids = byte_ids(TEXTS)
    it = ds.iterator()
    got = np.concatenate([it.next()["tokens"] for _ in range(3)])
    np.testing.assert_array_equal(got, packed(ids, 12))
    # Resumed mid-record, then across the end of the epoch: bit-identical.
    state = json.loads(json.dumps(it.get_state()))
    want = [it.next()["tokens"] for _ in range(25)]
    fresh = ds.iterator()
    fresh.set_state(state)
    assert json.loads(json.dumps(fresh.get_state())) == state
    for w in want:
        np.testing.assert_array_equal(fresh.next()["tokens"], w)
    # Two processes: process p reads records p, p + 2, ...: each record once per epoch between them.
    parts = [ds.iterator(p, 2) for p in (0, 1)]
    for p, part in enumerate(parts):
        mine = byte_ids(TEXTS[p::2])
        rows = np.concatenate([part.next()["tokens"] for _ in range(12)])  # past an epoch of its records
        np.testing.assert_array_equal(rows, packed(mine, 24))
        local = json.loads(json.dumps(part.local_state()))
        later = [part.next()["tokens"] for _ in range(3)]
        again = ds.iterator(p, 2)
        again.set_state({"version": 1, "dataset": "hf_text", "processes": [local, local]})
        for w in later:
            np.testing.assert_array_equal(again.next()["tokens"], w)
    with pytest.raises(ValueError, match="saved by 1 processes and this run has 2"):
        ds.iterator(0, 2).set_state(state)


def make_tokenizer(directory, texts=TEXTS, reverse=False):
    """A small word-level tokenizer in a model directory, with <s> and </s> named in its config;
    ``reverse``: the same words, their ids in reverse order."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts, trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>"]))
    if reverse:
        vocab = tok.get_vocab()
        words = sorted((w for w in vocab if vocab[w] > 2), key=vocab.get)
        tok = Tokenizer(
            models.WordLevel(
                {**{w: vocab[w] for w in vocab if vocab[w] <= 2}, **{w: 3 + i for i, w in enumerate(reversed(words))}},
                unk_token="<unk>",
            )
        )
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
    directory.mkdir(exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": {"content": "</s>"}}))
    return tok


def test_a_pretrained_tokenizer_encodes_records_streams_and_prepared_files(tmp_path, capsys):
    model = tmp_path / "model"
    tok = make_tokenizer(model)
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    ids = np.concatenate([[bos, *tok.encode(t, add_special_tokens=False).ids, eos] for t in TEXTS]).astype(np.int32)
    path = write_source(tmp_path, "jsonl")
    for mode in ("cache", "stream"):
        ds = HFText(path=path, seq_len=L, tokenizer=str(model), mode=mode).load(4, 0)
        assert ds.model_fields()["vocab_size"] == tok.get_vocab_size()
        assert ds.tokenizer["kind"] == "pretrained" and (ds.tokenizer["eos_id"], ds.tokenizer["bos_id"]) == (eos, bos)
        assert from_record(ds.tokenizer).decode(ids[1:4]) == tok.decode(ids[1:4].tolist())
    np.testing.assert_array_equal(ds.iterator().next()["tokens"], packed(ids, 4))
    # text_stream and dew-prepare take the same tokenizer (a tokenizer.json, or its directory).
    for i, t in enumerate(TEXTS[:3]):
        (tmp_path / f"doc{i}.txt").write_text(t)
    stream = TextStream(path=str(tmp_path / "doc*.txt"), seq_len=L, tokenizer=str(model / "tokenizer.json")).load(2, 0)
    assert stream.tokenizer["kind"] == "pretrained" and stream.model_fields()["vocab_size"] == tok.get_vocab_size()
    prepare_main(["--out", str(tmp_path / "prep"), "--tokenizer", str(model), str(tmp_path / "doc0.txt")])
    sidecar = json.loads((tmp_path / "prep" / "tokens.json").read_text())
    assert sidecar["tokenizer"] == {"kind": "pretrained", "file": "tokenizer.json", "eos_id": eos, "bos_id": bos}
    assert (tmp_path / "prep" / "tokenizer_config.json").is_file()
    windows = TokenWindows(path=str(tmp_path / "prep" / "train.bin"), seq_len=2, tokenizer=str(model)).load(2, 0)
    assert windows.model_fields()["vocab_size"] == tok.get_vocab_size() and windows.tokenizer["kind"] == "pretrained"
    doc0 = [bos, *tok.encode(TEXTS[0], add_special_tokens=False).ids, eos]
    np.testing.assert_array_equal(windows.train.gather(np.array([0]))["tokens"][0], doc0[:3])
    capsys.readouterr()


@pytest.mark.parametrize("flag, kind", [("--jsonl", "jsonl"), ("--parquet", "parquet"), ("--hf", "saved")])
def test_dew_prepare_writes_what_the_cache_holds(tmp_path, flag, kind, capsys):
    path = write_source(tmp_path, kind)
    prepare_main(["--out", str(tmp_path / "out"), flag, path, "--field", "text"])
    assert f"train.bin: {len(byte_ids(TEXTS))} tokens" in capsys.readouterr().out
    prepared = TokenWindows(path=str(tmp_path / "out" / "train.bin"), seq_len=L).load(4, 0)
    cached = HFText(path=path, seq_len=L).load(4, 0)
    np.testing.assert_array_equal(
        prepared.iterator().next(batch_size=20)["tokens"], cached.iterator().next(batch_size=20)["tokens"]
    )


def test_bad_inputs_fail_in_one_line_naming_the_field(tmp_path, capsys):
    path = write_source(tmp_path, "jsonl")
    with pytest.raises(ValueError, match=r"data.field='body': data.path=.*has no such column; it has text, id"):
        HFText(path=path, field="body").load(4, 0)
    with pytest.raises(ValueError, match=r"data.field='body'"):
        HFText(path=path, field="body", mode="stream").load(4, 0).iterator().next()
    assert not any((tmp_path / "dew-cache" / "hf_text").glob("*/tokens.json"))  # nothing half-written
    assert not list((tmp_path / "dew-cache" / "hf_text").glob("*.lock"))  # nor the build's lock
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="holds no records"):
        HFText(path=str(empty)).load(4, 0)
    with pytest.raises(FileNotFoundError, match=r"data.path='nowhere/\*.jsonl' matches no file"):
        HFText(path="nowhere/*.jsonl").load(4, 0)
    with pytest.raises(FileNotFoundError, match="not in the local hub cache|local hub cache"):
        HFText(path="someone/no-such-dataset").load(4, 0)
    with pytest.raises(FileNotFoundError, match=r"data.tokenizer=.*holds no tokenizer.json"):
        HFText(path=path, tokenizer=str(tmp_path)).load(4, 0)
    with pytest.raises(ValueError, match="data.val_split and data.val_path each choose"):
        HFText(path=path, val_split="test", val_path=path)
    with pytest.raises(SystemExit):
        prepare_main(["--out", str(tmp_path / "o"), "--jsonl", path, "--field", "body"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dew-prepare: error: data.field='body': --jsonl=")
    assert not (tmp_path / "o").exists()


def test_a_vocabulary_larger_than_the_model_is_refused_before_a_step(tmp_path):
    from dew.build import build_run
    from dew.config import ModelConfig, TrainerConfig
    from dew.contract.typed import ConfigError
    from dew.recipe import Recipe

    make_tokenizer(tmp_path / "model")
    path = write_source(tmp_path, "jsonl")
    small = {"vocab_size": 16, "seq_len": L, "hidden_size": 32, "depth": 1, "num_heads": 2}
    recipe = Recipe(
        model=ModelConfig("transformer", small, dtype="float32"),
        data=HFText(path=path, seq_len=L, tokenizer=str(tmp_path / "model")),
        trainer=TrainerConfig(steps=1, batch_size=4, checkpoint_dir=str(tmp_path / "ck")),
    )
    with pytest.raises(
        ConfigError, match=r"model.config.vocab_size=16 conflicts with the data's vocab_size=\d+"
    ) as err:
        build_run(recipe)
    assert "\n" not in str(err.value)
    assert PretrainedTokenizer.from_path(str(tmp_path / "model")).vocab_size > 16


TWO_PROCESSES = """
import json, sys
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")
p, port, path, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=p)
from dew.data.specs import HFText
ds = HFText(path=path, seq_len=8, mode="stream").load(4, 0)
it = ds.iterator(p, 2)
for _ in range(3):
    it.next()
state = it.get_state()
want = [it.next()["tokens"].tolist() for _ in range(8)]
fresh = ds.iterator(p, 2)
fresh.set_state(json.loads(json.dumps(state)))
got = [fresh.next()["tokens"].tolist() for _ in range(8)]
json.dump({"state": state, "resumed": got == want}, open(out, "w"))
"""


@pytest.mark.slow
def test_two_processes_save_the_streams_position_together_and_each_resumes_its_own(tmp_path):
    import subprocess
    import sys

    from dew.launching.pool import free_ports
    from tests.conftest import cli_env

    path = write_source(tmp_path, "jsonl")
    (port,) = free_ports(1).values()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TWO_PROCESSES, str(p), str(port), path, str(tmp_path / f"{p}.json")],
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for p in (0, 1)
    ]
    try:
        outs = [proc.communicate(timeout=120)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    assert [proc.returncode for proc in procs] == [0, 0], outs
    results = [json.loads((tmp_path / f"{p}.json").read_text()) for p in (0, 1)]
    assert results[0]["state"] == results[1]["state"]  # one position, gathered: what a checkpoint holds
    mine = results[0]["state"]["processes"]
    assert len(mine) == 2 and mine[0] != mine[1] and all(r["resumed"] for r in results)


@pytest.mark.parametrize("mode", ["cache", "stream"])
def test_held_out_text_from_a_split_or_files(tmp_path, mode):
    import datasets as hf

    rows = [{"text": t} for t in TEXTS]
    hf.DatasetDict({"train": hf.Dataset.from_list(rows[:15]), "test": hf.Dataset.from_list(rows[15:])}).save_to_disk(
        str(tmp_path / "dict")
    )
    val = byte_ids(TEXTS[15:])
    windows = np.stack([val[i * L : i * L + L + 1] for i in range((len(val) - 1) // L)])
    by_split = HFText(path=str(tmp_path / "dict"), val_split="test", seq_len=L, mode=mode).load(4, 0)
    (tmp_path / "repo" / "data").mkdir(parents=True)  # a dataset repository, as cloned from the hub
    for split, part in (("train", rows[:15]), ("test", rows[15:])):
        (tmp_path / "repo" / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    repo = HFText(path=str(tmp_path / "repo"), val_split="test", seq_len=L, mode=mode).load(4, 0)
    if mode == "cache":
        assert repo.num_records == by_split.num_records == (len(byte_ids(TEXTS[:15])) - 1) // L
    (tmp_path / "val").mkdir()
    files = HFText(
        path=write_source(tmp_path, "jsonl", TEXTS[:15]),
        val_path=write_source(tmp_path / "val", "jsonl", TEXTS[15:]),
        seq_len=L,
        mode=mode,
    ).load(4, 0)
    for ds in (by_split, repo, files):
        assert ds.num_eval_records == len(windows)
        batches = list(ds.eval_batches())
        got = np.concatenate([b["tokens"][b["mask"] > 0] for b in batches])
        np.testing.assert_array_equal(got, windows)
    with pytest.raises(ValueError, match="no split 'validation'; it has train, test"):
        HFText(path=str(tmp_path / "dict"), val_split="validation", mode=mode).load(4, 0)
