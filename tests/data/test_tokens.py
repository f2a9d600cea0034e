"""token_windows over every file format, against a plain-NumPy reference; dew-prepare; bad inputs."""

import json

import numpy as np
import pytest

from dew.data.prepare import main as prepare_main
from dew.data.specs import TokenWindows
from dew.data.token_files import LLMC_MAGIC

L = 8


def llmc_bytes(tokens, version=1, count=None, magic=LLMC_MAGIC):
    header = np.zeros(256, "<i4")
    header[:3] = magic, version, len(tokens) if count is None else count
    return header.tobytes() + np.asarray(tokens, "<u2" if version == 1 else "<u4").tobytes()


@pytest.fixture
def tokens():
    return np.random.default_rng(0).integers(0, 1000, size=801).astype(np.uint16)


def windows_ref(tokens, idx):
    return np.stack([tokens[i * L : i * L + L + 1] for i in idx]).astype(np.int32)


def reference_order(n, seed, count):
    out = []
    for epoch in range(count // n + 2):
        out.extend(np.random.default_rng([seed, epoch]).permutation(n))
    return np.array(out[:count])


@pytest.mark.parametrize("kind", ["raw16", "raw32", "npy", "llmc"])
def test_every_format_matches_reference(tmp_path, tokens, kind):
    path = tmp_path / {"npy": "t.npy"}.get(kind, "t.bin")
    spec = dict(seq_len=L, vocab_size=1000)
    if kind == "raw16":
        tokens.tofile(path)
    elif kind == "raw32":
        tokens.astype("<u4").tofile(path)
        spec["dtype"] = "uint32"
    elif kind == "npy":
        np.save(path, tokens.astype(np.uint32))
    else:
        path.write_bytes(llmc_bytes(tokens))
    ds = TokenWindows(path=str(path), **spec).load(batch_size=4, seed=3)
    assert ds.num_records == 100 and ds.model_fields() == {"vocab_size": 1000, "seq_len": L}
    assert ds.batch_spec() == {"tokens": ((4, L + 1), np.dtype("int32"))}
    assert ds.tokens_per_record == L
    it = ds.iterator()
    got = np.concatenate([it.next()["tokens"] for _ in range(30)])  # 120 windows: two epochs
    np.testing.assert_array_equal(got, windows_ref(tokens, reference_order(100, 3, 120)))


def test_glob_over_shards_windows_stay_inside_shards(tmp_path, tokens):
    parts = [tokens[:300], tokens[300:700], tokens[700:]]  # 37, 49 and 12 windows
    for i, part in enumerate(parts):
        (tmp_path / f"shard_{i:03d}.bin").write_bytes(llmc_bytes(part))
    ds = TokenWindows(path=str(tmp_path / "shard_*.bin"), seq_len=L, vocab_size=1000).load(8, 0)
    assert ds.num_records == 37 + 49 + 12
    ref = np.concatenate([windows_ref(p, range((len(p) - 1) // L)) for p in parts])
    batch = ds.iterator().next(batch_size=ds.num_records)["tokens"]
    np.testing.assert_array_equal(batch, ref[reference_order(98, 0, 98)])


def test_sharding_resume_and_ramp(tmp_path, tokens):
    tokens.tofile(tmp_path / "t.bin")
    ds = TokenWindows(path=str(tmp_path / "t.bin"), seq_len=L, vocab_size=1000).load(8, 1)
    whole, a, b = ds.iterator(), ds.iterator(0, 2), ds.iterator(1, 2)
    for size in (4, 8, 8, 16, 16):
        g = whole.next(batch_size=size)["tokens"]
        pa, pb = a.next(batch_size=size)["tokens"], b.next(batch_size=size)["tokens"]
        np.testing.assert_array_equal(np.concatenate([pa, pb]), g)
    state = json.loads(json.dumps(a.get_state()))
    want = [a.next()["tokens"] for _ in range(20)]
    fresh = ds.iterator(0, 2)
    fresh.set_state(state)
    for w in want:
        np.testing.assert_array_equal(fresh.next()["tokens"], w)


def test_val_fraction_and_val_file(tmp_path, tokens):
    tokens.tofile(tmp_path / "t.bin")
    ds = TokenWindows(path=str(tmp_path / "t.bin"), seq_len=L, vocab_size=1000, val_fraction=0.1).load(
        batch_size=4, seed=0
    )
    assert ds.num_records == 90 and ds.num_eval_records == 10
    train = ds.iterator().next(batch_size=90)["tokens"]
    np.testing.assert_array_equal(np.sort(train[:, 0]), np.sort(tokens[: 90 * L : L].astype(np.int32)))
    evals = list(ds.eval_batches())
    assert len(evals) == 3 and [b["mask"].sum() for b in evals] == [4, 4, 2]
    np.testing.assert_array_equal(
        np.concatenate([b["tokens"] for b in evals])[:10], windows_ref(tokens, range(90, 100))
    )
    tokens[:161].tofile(tmp_path / "v.bin")
    ds = TokenWindows(path=str(tmp_path / "t.bin"), val_path=str(tmp_path / "v.bin"), seq_len=L, vocab_size=1000).load(
        batch_size=4, seed=0
    )
    assert ds.num_records == 100 and ds.num_eval_records == 20


def test_prepare_byte_then_load_with_sidecar(tmp_path, capsys):
    text = tmp_path / "a.txt"
    text.write_text("héllo dew\n" * 30, encoding="utf-8")
    (tmp_path / "b.txt").write_text("held out text " * 10)
    prepare_main(["--out", str(tmp_path / "out"), str(text), "--val", str(tmp_path / "b.txt")])
    assert "train.bin" in capsys.readouterr().out
    sidecar = json.loads((tmp_path / "out" / "tokens.json").read_text())
    assert sidecar["vocab_size"] == 257 and sidecar["tokenizer"] == {"kind": "byte", "eos_id": 256}
    ds = TokenWindows(
        path=str(tmp_path / "out" / "train.bin"), val_path=str(tmp_path / "out" / "val.bin"), seq_len=L
    ).load(4, 0)
    assert ds.model_fields()["vocab_size"] == 257 and ds.tokenizer["kind"] == "byte"
    raw = np.fromfile(tmp_path / "out" / "train.bin", "<u2", offset=1024)
    expected = list(("héllo dew\n" * 30).encode()) + [256]
    np.testing.assert_array_equal(raw, expected)
    assert ds.num_records == (len(expected) - 1) // L


def test_prepare_bpe_roundtrips_text(tmp_path):
    from dew.data.tokenizer import from_sidecar

    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    prepare_main(["--out", str(tmp_path / "o"), "--tokenizer", "bpe", "--vocab-size", "300", str(corpus)])
    sidecar = json.loads((tmp_path / "o" / "tokens.json").read_text())
    tok = from_sidecar(str(tmp_path / "o" / "tokens.json"))
    # The trainer stops early when the corpus runs out of merges; the sidecar states what it got.
    assert 257 < sidecar["vocab_size"] == tok.vocab_size <= 300
    assert sidecar["tokenizer"]["kind"] == "bpe"
    ids = np.fromfile(tmp_path / "o" / "train.bin", "<u2", offset=1024)
    assert len(ids) < len(corpus.read_text()) / 2  # merges learned
    assert ids[-1] == tok.eos_id
    assert tok.decode(ids[:-1]) == corpus.read_text()
    ds = TokenWindows(path=str(tmp_path / "o" / "train.bin"), seq_len=L).load(2, 0)
    assert ds.model_fields()["vocab_size"] == tok.vocab_size and ds.tokenizer["file"].endswith("tokenizer.json")


def test_prepare_missing_input_exits_with_message(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        prepare_main(["--out", str(tmp_path), str(tmp_path / "nope.txt")])
    assert e.value.code == 1 and "nope.txt does not exist" in capsys.readouterr().err


def test_out_of_vocabulary_names_file_and_offset(tmp_path, tokens):
    tokens[537] = 1000
    tokens.tofile(tmp_path / "t.bin")
    with pytest.raises(
        ValueError,
        match=r"t\.bin: token id 1000 at token offset 537 lies outside "
        r"the vocabulary \[0, 1000\)",
    ):
        TokenWindows(path=str(tmp_path / "t.bin"), seq_len=L, vocab_size=1000).load(4, 0)


@pytest.mark.parametrize(
    "content, fmt, message",
    [
        (llmc_bytes(np.arange(100), version=7), "auto", "llm.c header version 7"),
        (llmc_bytes(np.arange(100), count=200), "auto", "header says 200 tokens .* truncated"),
        (llmc_bytes(np.arange(100))[:600], "auto", "llm.c header truncated"),
        (llmc_bytes(np.arange(100), magic=1234), "llmc", "wrong header: magic 1234"),
        (b"\x01\x02\x03", "raw", "3 bytes is not a whole number of uint16"),
    ],
)
def test_bad_files(tmp_path, content, fmt, message):
    (tmp_path / "t.bin").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        TokenWindows(path=str(tmp_path / "t.bin"), seq_len=L, vocab_size=70000, format=fmt).load(4, 0)


def test_missing_things(tmp_path, tokens):
    with pytest.raises(FileNotFoundError, match=r"data.path='.*nothing\*.bin' matches no file"):
        TokenWindows(path=str(tmp_path / "nothing*.bin"), vocab_size=10).load(4, 0)
    tokens.tofile(tmp_path / "t.bin")
    with pytest.raises(FileNotFoundError, match=r"data.vocab_size is unset and .*tokens.json"):
        TokenWindows(path=str(tmp_path / "t.bin"), seq_len=L).load(4, 0)
    with pytest.raises(ValueError, match="holds no training window of data.seq_len=1000"):
        TokenWindows(path=str(tmp_path / "t.bin"), seq_len=1000, vocab_size=1000).load(4, 0)
    with pytest.raises(ValueError, match="both choose the held-out windows"):
        TokenWindows(
            path=str(tmp_path / "t.bin"), val_path=str(tmp_path / "t.bin"), val_fraction=0.1, vocab_size=1000
        ).load(4, 0)
    with pytest.raises(ValueError, match="data.dtype='int8'"):
        TokenWindows(path="x", dtype="int8")
