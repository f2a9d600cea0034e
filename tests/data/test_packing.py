"""Documents packed whole into windows (dew.data.packing): every document once, whole, under one
segment id with positions from 0; long ones in pieces; short ones fill >= 95% of the windows; the
token datasets and chat carry the fields, resume and refuse what they cannot read."""

import json
from pathlib import Path

import numpy as np
import pytest

from dew.data.packing import Framing, PackedTable

EOS = 256


def documents(count, seed=0, longest=30):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 250, rng.integers(1, longest)).astype(np.uint16) for _ in range(count)]


def file_of(docs, bos=None):
    return np.concatenate([np.array(([bos] if bos is not None else []) + d.tolist() + [EOS], np.uint16) for d in docs])


def segments(batch):
    """Every (tokens, positions) segment of a batch, row by row."""
    out = []
    for tokens, seg, pos in zip(batch["tokens"], batch["segment_ids"], batch["positions"]):
        assert (seg[: np.count_nonzero(seg)] > 0).all()  # the padding comes last
        for s in range(1, seg.max() + 1):
            at = seg == s
            np.testing.assert_array_equal(pos[at], np.arange(at.sum()))
            out.append(tokens[at].tolist())
    return out


@pytest.mark.parametrize("bos", [None, 255])
def test_every_document_once_whole_and_long_ones_in_overlapping_pieces(bos):
    docs = documents(120, longest=15) + [np.arange(40, dtype=np.uint16)]  # the last is longer than a window of 17
    table = PackedTable([file_of(docs, bos)], 16, Framing(EOS, has_bos=bos is not None))
    start = [EOS] if bos is None else [bos]  # without a begin-of-text id each starts with end-of-text
    framed = [start + d.tolist() + [EOS] for d in docs]
    long = framed.pop()
    want = framed + [long[0:17], long[16:33], long[32:]]
    got = segments(table.gather(np.arange(table.num_windows)))
    assert sorted(got) == sorted(want)
    assert table.real_fraction() > 0.9


def test_short_documents_fill_at_least_95_percent_of_the_windows():
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 250, n).astype(np.uint16) for n in rng.lognormal(3.5, 0.8, 3000).astype(int) + 1]
    table = PackedTable([file_of(docs)], 256, Framing(EOS, has_bos=False))
    assert table.real_fraction() >= 0.95
    batch = table.gather(np.arange(table.num_windows))
    assert np.count_nonzero(batch["segment_ids"]) / batch["segment_ids"].size == pytest.approx(table.real_fraction())


def write_tokens(directory: Path, docs) -> Path:
    directory.mkdir()
    path = directory / "train.bin"
    file_of(docs).tofile(path)
    sidecar = {"format": "dew-tokens", "version": 1, "vocab_size": 257, "tokenizer": {"kind": "byte", "eos_id": EOS}}
    (directory / "tokens.json").write_text(json.dumps(sidecar))
    return path


def test_token_windows_with_documents_resume_and_hold_out_the_last_windows(tmp_path: Path):
    from dew.data.specs import TokenWindows

    path = write_tokens(tmp_path / "data", documents(300))
    spec = TokenWindows(path=str(path), seq_len=32, documents=True, val_fraction=0.1)
    data = spec.load(batch_size=4, seed=0)
    assert set(data.batch_spec()) == {"tokens", "segment_ids", "positions"}
    it = data.iterator()
    it.next()
    state = it.get_state()
    want = it.next()
    again = data.iterator()
    again.set_state(state)
    got = again.next()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    held = list(data.eval_batches())
    assert held and all(set(b) == {"tokens", "segment_ids", "positions", "mask"} for b in held)
    train_docs = segments(data.train.gather(np.arange(data.num_records)))
    held_docs = segments(data.held_out.gather(np.arange(data.num_eval_records)))
    assert len(train_docs) + len(held_docs) == 300

    (tmp_path / "data" / "tokens.json").unlink()
    with pytest.raises(ValueError, match="data.documents=true splits the tokens into documents at the tokenizer's"):
        TokenWindows(path=str(path), seq_len=32, documents=True, vocab_size=257).load(batch_size=4, seed=0)


def test_text_stream_packs_each_file_whole_and_resumes(tmp_path: Path):
    from dew.data.specs import TextStream

    texts = ["short one", "a longer document, still short", "x" * 70, "tiny"]
    for i, text in enumerate(texts):
        (tmp_path / f"{i}.txt").write_text(text)
    data = TextStream(path=str(tmp_path / "*.txt"), seq_len=32, documents=True).load(batch_size=2, seed=0)
    it = data.iterator()
    first = [it.next() for _ in range(3)]
    got = [bytes(t for t in s if t < 256).decode() for b in first for s in segments(b)]
    for text in texts[:2] + texts[3:]:
        assert text in got  # a short file is one segment, whole
    assert "x" * 32 in got  # the long one in pieces of at most 33 tokens
    state = it.get_state()
    want = it.next()
    again = data.iterator()
    again.set_state(state)
    got_next = again.next()
    for k in want:
        np.testing.assert_array_equal(got_next[k], want[k])


def test_hf_text_stream_packs_each_record_whole_once_and_resumes_exactly(tmp_path: Path, monkeypatch):
    """mode=stream with documents: each process's windows hold its own records, each one segment,
    whole (one longer than a window in pieces), and each once per epoch (over several epochs the
    counts of any two differ by at most the epoch the packer is in); a resume mid-stream, from the
    state's JSON, gives the same windows bit for bit, across the end of an epoch."""
    import collections

    import datasets as hf

    from dew.data.specs import HFText

    monkeypatch.setattr(hf.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    texts = [f"doc {i}: " + "xyz"[i % 3] * (i % 7 * 3) for i in range(30)] + ["L" * 40]  # the last > a window
    path = tmp_path / "part.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    data = HFText(path=str(path), seq_len=16, mode="stream", documents=True).load(batch_size=4, seed=0)
    assert set(data.batch_spec()) == {"tokens", "segment_ids", "positions"}
    for p in (0, 1):
        framed = [[EOS, *t.encode(), EOS] for t in texts[p::2]]  # the byte tokenizer has no begin-of-text id
        want = [tuple(f[j * 16 : j * 16 + 17]) for f in framed for j in range(max(1, -(-(len(f) - 1) // 16)))]
        it = data.iterator(p, 2)
        got = collections.Counter(tuple(s) for _ in range(40) for s in segments(it.next()))
        assert set(got) == set(want)  # whole records (and pieces) and nothing else
        assert min(got.values()) >= 3 and max(got.values()) - min(got.values()) <= 1  # each once per epoch
    it = data.iterator()
    for _ in range(3):
        it.next()
    state = json.loads(json.dumps(it.get_state()))
    want_batches = [it.next() for _ in range(12)]  # past the end of the first epoch
    again = data.iterator()
    again.set_state(state)
    for want_batch in want_batches:
        got_batch = again.next()
        for k in want_batch:
            np.testing.assert_array_equal(got_batch[k], want_batch[k])
    held = HFText(path=str(path), val_path=str(path), seq_len=16, mode="stream", documents=True).load(4, 0)
    held_docs = [
        s for b in held.eval_batches() for s in segments({k: v[b["mask"] == 1] for k, v in b.items() if k != "mask"})
    ]
    assert sorted(map(tuple, held_docs)) == sorted(
        tuple(f[j * 16 : j * 16 + 17])
        for f in ([EOS, *t.encode(), EOS] for t in texts)
        for j in range(max(1, -(-(len(f) - 1) // 16)))
    )
