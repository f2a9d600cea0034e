"""text_stream: packing against a plain reference, no record count, exact resume, sharding."""

import json

import numpy as np
import pytest

from dew.data.specs import TextStream, datasets

L = 16


@pytest.fixture
def corpus(tmp_path):
    texts = [f"document {i}: " + "abcdefgh"[: i + 1] * (i + 3) for i in range(5)]
    for i, text in enumerate(texts):
        (tmp_path / f"doc{i}.txt").write_text(text)
    return tmp_path, texts


def reference(texts, seed, passes):
    """The packed stream as plain Python: grain's shuffled file order per pass, bytes + 256."""
    import grain

    order = grain.MapDataset.range(len(texts)).shuffle(seed=seed).repeat()
    ids = []
    for i in range(passes * len(texts)):
        ids.extend(list(texts[order[i]].encode()) + [256])
    n = len(ids) // (L + 1)
    return np.array(ids[: n * (L + 1)]).reshape(n, L + 1)


def test_stream_is_registered_and_packs_like_reference(corpus):
    root, texts = corpus
    assert datasets["text_stream"] is TextStream
    ds = TextStream(path=str(root / "doc*.txt"), seq_len=L).load(batch_size=4, seed=5)
    assert ds.num_records is None and ds.resumable
    assert ds.model_fields() == {"vocab_size": 257, "seq_len": L}
    assert ds.batch_spec() == {"tokens": ((4, L + 1), np.dtype("int32"))}
    it = ds.iterator()
    got = np.concatenate([it.next()["tokens"] for _ in range(6)])
    np.testing.assert_array_equal(got, reference(texts, 5, 3)[:24])


def test_stream_resume_shards_and_ramp(corpus):
    root, _ = corpus
    ds = TextStream(path=str(root / "doc*.txt"), seq_len=L).load(batch_size=4, seed=0)
    whole, a, b = ds.iterator(), ds.iterator(0, 2), ds.iterator(1, 2)
    for size in (2, 4, 8):
        g = whole.next(batch_size=size)["tokens"]
        np.testing.assert_array_equal(
            np.concatenate([a.next(batch_size=size)["tokens"], b.next(batch_size=size)["tokens"]]), g
        )
    state = json.loads(json.dumps(whole.get_state()))
    want = [whole.next()["tokens"] for _ in range(5)]
    fresh = ds.iterator()
    fresh.set_state(state)
    for w in want:
        np.testing.assert_array_equal(fresh.next()["tokens"], w)


def test_stream_eval_and_epoch_rules(corpus):
    from dew.config import TrainerConfig

    root, texts = corpus
    ds = TextStream(path=str(root / "doc*.txt"), val_path=str(root / "doc0.txt"), seq_len=4).load(batch_size=2, seed=0)
    ids = list(texts[0].encode()) + [256]
    assert ds.num_eval_records == (len(ids) - 1) // 4
    batches = list(ds.eval_batches())
    assert sum(b["mask"].sum() for b in batches) == ds.num_eval_records
    np.testing.assert_array_equal(batches[0]["tokens"][0], ids[:5])
    with pytest.raises(ValueError, match="stream"):
        TrainerConfig(eval_every="epoch").eval_interval(ds)
    with pytest.raises(ValueError, match="stream"):
        TrainerConfig(epochs=1).total_steps(ds)


def test_stream_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.path=.*matches no file"):
        TextStream(path=str(tmp_path / "*.txt")).load(4, 0)
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe\xfa")
    it = TextStream(path=str(tmp_path / "bad.txt"), seq_len=2).load(2, 0).iterator()
    with pytest.raises(ValueError, match=r"bad\.txt: not UTF-8 text"):
        it.next()
