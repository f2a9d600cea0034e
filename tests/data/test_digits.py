"""digits on the shared pipeline: batches against a plain-NumPy reference, sharding, resume, epochs,
the batch ramp and the padded evaluation pass."""

import json

import numpy as np
import pytest

from dew.data.specs import Digits, datasets

SEED = 7


@pytest.fixture(scope="module")
def raw():
    # Imported here, not at the top: every pytest worker collects every module, and scikit-learn's
    # import (SciPy's with it) is ~1.4 CPU-s that only the worker running these tests needs.
    import sklearn.datasets

    bunch = sklearn.datasets.load_digits()
    return bunch.images, bunch.target


@pytest.fixture(scope="module")
def ds():
    return Digits(eval_fraction=0.1).load(batch_size=32, seed=SEED)


def reference_stream(train_idx, seed, count):
    """Record indices (into the full digits arrays) of the first ``count`` training positions."""
    n = len(train_idx)
    out = []
    epoch = 0
    while len(out) < count:
        out.extend(train_idx[np.random.default_rng([seed, epoch]).permutation(n)])
        epoch += 1
    return np.array(out[:count])


def test_registered_and_fields(ds):
    assert datasets["digits"] is Digits
    assert ds.model_fields() == {"input_size": 8, "in_channels": 1, "num_classes": 10}
    assert ds.num_records == 1617 and ds.num_eval_records == 180  # 1797 - 180 held out
    assert ds.resumable and ds.seed == SEED and ds.batch_size == 32
    assert ds.batch_spec() == {"image": ((32, 8, 8, 1), np.dtype("float32")), "label": ((32,), np.dtype("int32"))}


def test_held_out_split_is_stratified_and_fixed(raw):
    from dew.data.digits import split_digits

    _, labels = raw
    train, held = split_digits(0.1)
    assert len(np.intersect1d(train, held)) == 0 and len(train) + len(held) == len(labels)
    per_class = np.bincount(labels[held], minlength=10)
    expected = np.bincount(labels, minlength=10) * 0.1
    assert np.all(np.abs(per_class - expected) <= 1), per_class
    _again_train, again_held = split_digits(0.1)
    np.testing.assert_array_equal(held, again_held)


def test_batches_equal_numpy_reference(ds, raw):
    images, labels = raw
    from dew.data.digits import split_digits

    train_idx, _ = split_digits(0.1)
    it = ds.iterator()
    got = [it.next() for _ in range(60)]  # 60 * 32 = 1920 > 1617: crosses an epoch boundary
    ref = reference_stream(train_idx, SEED, 60 * 32).reshape(60, 32)
    for batch, idx in zip(got, ref):
        np.testing.assert_array_equal(batch["label"], labels[idx])
        np.testing.assert_allclose(batch["image"][..., 0], images[idx] / 8.0 - 1.0, atol=1e-6)
        assert batch["image"].dtype == np.float32 and batch["label"].dtype == np.int32
    all_images = np.concatenate([b["image"] for b in got])
    assert all_images.min() == -1.0 and all_images.max() == 1.0


def test_epoch_visits_every_record_once(ds):
    n = ds.num_records
    it = ds.iterator()
    # A batch of exactly n records is one whole epoch; two of them are two different orders.
    first, second = it.next(batch_size=n), it.next(batch_size=n)

    def ids(b):
        return [tuple(x) for x in np.c_[b["label"], b["image"].reshape(n, -1)]]

    assert sorted(ids(first)) == sorted(ids(second))
    assert not np.array_equal(first["label"], second["label"])
    assert it.position == 2 * n


def test_two_shards_disjoint_and_cover_global_batch(ds):
    whole = ds.iterator(0, 1)
    shards = [ds.iterator(p, 2) for p in range(2)]
    for _ in range(55):
        g = whole.next()
        a, b = (s.next() for s in shards)
        assert len(a["label"]) == len(b["label"]) == 16
        for key in g:
            np.testing.assert_array_equal(np.concatenate([a[key], b[key]]), g[key])


def test_resume_from_saved_position_is_exact(ds):
    it = ds.iterator()
    for _ in range(49):
        it.next()
    state = json.loads(json.dumps(it.get_state()))  # survives a JSON round trip
    expected = [it.next() for _ in range(5)]
    fresh = ds.iterator()
    fresh.set_state(state)
    for want in expected:
        got = fresh.next()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])


def test_resume_through_grain_checkpoint_handler(ds, tmp_path):
    import grain
    from etils import epath

    it = ds.iterator()
    for _ in range(3):
        it.next()
    handler = grain.checkpoint.CheckpointHandler()
    handler.save(epath.Path(tmp_path), item=it)
    want = it.next()
    fresh = handler.restore(epath.Path(tmp_path), item=ds.iterator())
    np.testing.assert_array_equal(fresh.next()["label"], want["label"])


def test_batch_ramp_keeps_its_place(ds):
    it = ds.iterator()
    sizes = [8, 8, 16, 32, 32, 64]
    parts = [it.next(batch_size=s)["label"] for s in sizes]
    flat = ds.iterator().next(batch_size=sum(sizes))["label"]
    np.testing.assert_array_equal(np.concatenate(parts), flat)
    # Sharded, a ramp stage reads that stage's global batch split over the processes.
    a, b = ds.iterator(0, 2), ds.iterator(1, 2)
    for s in sizes:
        np.testing.assert_array_equal(
            np.concatenate([a.next(batch_size=s)["label"], b.next(batch_size=s)["label"]]),
            flat[a.position - s : a.position],
        )


def test_eval_batches_fixed_full_and_masked(ds, raw):
    _images, labels = raw
    from dew.data.digits import split_digits

    _, held = split_digits(0.1)
    batches = list(ds.eval_batches())
    assert len(batches) == 6  # ceil(180 / 32)
    assert all(b["label"].shape == (32,) and b["mask"].dtype == np.float32 for b in batches)
    mask = np.concatenate([b["mask"] for b in batches])
    assert mask.sum() == 180 and np.all(mask[:180] == 1) and np.all(mask[180:] == 0)
    got = np.concatenate([b["label"] for b in batches])[:180]
    np.testing.assert_array_equal(got, labels[held])
    # Two processes: the same records, split per global batch.
    halves = [list(ds.eval_batches(p, 2)) for p in range(2)]
    for whole, a, b in zip(batches, *halves):
        np.testing.assert_array_equal(np.concatenate([a["mask"], b["mask"]]), whole["mask"])
        np.testing.assert_array_equal(np.concatenate([a["label"], b["label"]]), whole["label"])


def test_seed_changes_order_only(raw):
    a = Digits().load(batch_size=16, seed=0).iterator().next()
    b = Digits().load(batch_size=16, seed=1).iterator().next()
    assert not np.array_equal(a["label"], b["label"])


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(batch_size=30, process_count=4), "batch_size=30 does not divide over 4 processes"),
        (dict(batch_size=0, process_count=1), "batch_size=0"),
    ],
)
def test_bad_batch_sizes(bad, message):
    with pytest.raises(ValueError, match=message):
        ds = Digits().load(batch_size=bad["batch_size"], seed=0)
        ds.iterator(0, bad["process_count"])


def test_ramp_stage_that_does_not_divide(ds):
    it = ds.iterator(0, 2)
    with pytest.raises(ValueError, match="batch_size=7 does not divide over 2 processes"):
        it.next(batch_size=7)


def test_state_from_other_data_is_refused(ds):
    state = ds.iterator().get_state()
    other = Digits().load(batch_size=32, seed=SEED + 1).iterator()
    with pytest.raises(ValueError, match=f"seed={SEED}.*seed={SEED + 1}"):
        other.set_state(state)
    with pytest.raises(ValueError, match="position=-1"):
        ds.iterator().set_state({**state, "position": -1})


def test_bad_eval_fraction():
    with pytest.raises(ValueError, match=r"data.eval_fraction=1.5"):
        Digits(eval_fraction=1.5)


def test_the_arrays_are_kept_whole_and_a_later_process_loads_them_without_scikit_learn(tmp_path, raw, monkeypatch):
    """The first load builds the arrays and the split with scikit-learn and keeps them; a later
    process reads them back, equal, without importing scikit-learn (0.7 s a process); a damaged file
    is built again, and a cache that cannot be written is only not kept."""
    import os
    import subprocess
    import sys

    from dew.data.digits import FIELDS, cached_path, digits_arrays, split_digits

    env = {**os.environ, "DEW_DATA_DIR": str(tmp_path / "data")}
    code = (
        "import sys, numpy as np\n"
        "from dew.data.digits import FIELDS, digits_arrays\n"
        "a = digits_arrays(0.1)\n"
        "np.savez(sys.argv[1], **a)\n"
        "print('sklearn' in sys.modules)"
    )
    first = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "first.npz")], env=env, capture_output=True, text=True, timeout=120
    )
    again = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "again.npz")], env=env, capture_output=True, text=True, timeout=120
    )
    assert (first.stdout.strip(), again.stdout.strip()) == ("True", "False"), first.stderr + again.stderr
    images, labels = raw
    train, held = split_digits(0.1)
    with np.load(tmp_path / "first.npz") as one, np.load(tmp_path / "again.npz") as two:
        for name, want in zip(FIELDS, (images.astype(np.uint8), labels, train, held)):
            np.testing.assert_array_equal(one[name], want)
            np.testing.assert_array_equal(two[name], want)
            assert one[name].dtype == two[name].dtype
    assert sorted(p.name for p in (tmp_path / "data" / "digits").iterdir()) == [os.path.basename(cached_path(0.1))]

    monkeypatch.setenv("DEW_DATA_DIR", str(tmp_path / "data"))
    kept = cached_path(0.1)
    with open(kept, "r+b") as f:
        f.truncate(100)  # damaged: built again and kept whole
    np.testing.assert_array_equal(digits_arrays(0.1)["held_out"], held)
    with np.load(kept) as whole:
        np.testing.assert_array_equal(whole["held_out"], held)
    assert len(list((tmp_path / "data" / "digits").iterdir())) == 1  # no temporary file left
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("DEW_DATA_DIR", str(tmp_path / "file"))  # cannot be written: loaded all the same
    np.testing.assert_array_equal(digits_arrays(0.1)["train"], train)
