"""oxford_flowers102 from a small archive in the official format: decode, splits, cache, download
with checksums, and every bad input's error."""

import hashlib
import io
import os
import tarfile

import numpy as np
import pytest
import scipy.io
from PIL import Image

from dew.data import flowers
from dew.data.specs import OxfordFlowers102

N = 10
R = 8


def jpeg(i, w=24, h=16):
    """An image whose left/right thirds are black/white and centre a colour that encodes ``i``:
    the centre crop keeps the colour, so the decoded mean identifies the image."""
    pixels = np.zeros((h, w, 3), np.uint8)
    pixels[:, w // 3 : 2 * w // 3] = (20 * i, 255 - 20 * i, 128)
    pixels[:, 2 * w // 3 :] = 255
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def write_official(root, n=N, extra_members=(), labels=None, setid=None, skip=()):
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(root / flowers.ARCHIVE, "w:gz") as tar:
        for i in range(1, n + 1):
            if i in skip:
                continue
            data = jpeg(i)
            info = tarfile.TarInfo(f"jpg/image_{i:05d}.jpg")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, data in extra_members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    labels = np.array([[1 + (i % 3) for i in range(n)]]) if labels is None else labels
    scipy.io.savemat(root / flowers.LABELS, {"labels": labels})
    setid = setid or {
        "trnid": np.array([[1, 2, 3, 4]]),
        "valid": np.array([[5, 6, 7]]),
        "tstid": np.array([[8, 9, 10]]),
    }
    scipy.io.savemat(root / flowers.SETID, setid)
    return root


@pytest.fixture
def official(tmp_path):
    return write_official(tmp_path / "official")


def spec(tmp_path, root, **kw):
    return OxfordFlowers102(root=str(root), cache_dir=str(tmp_path / "cache"), resolution=R, **kw)


def test_loads_official_format(tmp_path, official):
    ds = spec(tmp_path, official).load(batch_size=2, seed=0)
    assert ds.num_records == 7 and ds.num_eval_records == 3
    assert ds.model_fields() == {"input_size": R, "in_channels": 3, "num_classes": 102}
    assert ds.batch_spec() == {"image": ((2, R, R, 3), np.dtype("float32")), "label": ((2,), np.dtype("int32"))}
    batch = ds.iterator().next(batch_size=7)
    # Reference: the same decode in plain PIL/NumPy, records 1..7 (train + val) in the run's order.
    order = np.random.default_rng([0, 0]).permutation(7)
    for image, label, rec in zip(batch["image"], batch["label"], order):
        i = rec + 1
        ref = (
            np.asarray(
                Image.open(io.BytesIO(jpeg(i)))
                .convert("RGB")
                .crop((4, 0, 20, 16))
                .resize((R, R), Image.Resampling.BICUBIC),
                np.float32,
            )
            / 127.5
            - 1
        )
        np.testing.assert_allclose(image, ref, atol=2 / 127.5 + 1e-6)
        assert label == (i - 1) % 3  # imagelabels.mat's 1..102 become 0..101
    assert batch["image"].min() >= -1 and batch["image"].max() <= 1
    evals = list(ds.eval_batches())
    assert [list(b["label"]) for b in evals] == [[7 % 3, 8 % 3], [9 % 3, 7 % 3]]
    assert [list(b["mask"]) for b in evals] == [[1, 1], [1, 0]]


def test_cache_is_memory_mapped_and_reused(tmp_path, official):
    spec(tmp_path, official).load(batch_size=2, seed=0)
    caches = list(os.listdir(tmp_path / "cache" / "oxford_flowers102"))
    assert len(caches) == 1 and caches[0].startswith("v1-r8-")
    images = np.load(tmp_path / "cache" / "oxford_flowers102" / caches[0] / "images.npy", mmap_mode="r")
    assert images.shape == (N, R, R, 3) and images.dtype == np.uint8
    os.remove(official / flowers.ARCHIVE)  # the cache alone would do, but the files are the key
    with pytest.raises(FileNotFoundError, match=r"data.root=.* lacks .*102flowers.tgz"):
        spec(tmp_path, official).load(batch_size=2, seed=0)


def test_train_splits_choose_records(tmp_path, official):
    ds = spec(tmp_path, official, train_splits=("train",), eval_split="val").load(2, 0)
    assert ds.num_records == 4 and ds.num_eval_records == 3
    assert sorted(ds.iterator().next(batch_size=4)["label"]) == [0, 0, 1, 2]
    with pytest.raises(ValueError, match="data.eval_split='test' is also in data.train_splits"):
        OxfordFlowers102(train_splits=("test",))


def test_env_var_sets_cache_and_download_verifies(tmp_path, monkeypatch):
    server = write_official(tmp_path / "server")
    monkeypatch.setenv("DEW_DATA_DIR", str(tmp_path / "env"))
    monkeypatch.setattr(flowers, "BASE_URL", server.as_uri() + "/")
    sums = {n: hashlib.md5((server / n).read_bytes()).hexdigest() for n in flowers.CHECKSUMS}
    monkeypatch.setattr(flowers, "CHECKSUMS", {**sums, flowers.SETID: "0" * 32})
    with pytest.raises(ValueError, match=r"setid.mat: downloaded file has MD5 .* expected 0{32}"):
        OxfordFlowers102(resolution=R).load(2, 0)
    downloads = tmp_path / "env" / "oxford_flowers102" / "downloads"
    assert sorted(os.listdir(downloads)) == [flowers.ARCHIVE, flowers.LABELS]  # nothing partial
    monkeypatch.setattr(flowers, "CHECKSUMS", sums)
    ds = OxfordFlowers102(resolution=R).load(2, 0)
    assert ds.num_records == 7
    assert sorted(os.listdir(downloads)) == sorted(sums)


def test_no_network_says_what_to_download(tmp_path, monkeypatch):
    monkeypatch.setattr(flowers, "BASE_URL", "http://127.0.0.1:9/")
    with pytest.raises(
        ConnectionError,
        match=r"could not download .*102flowers.tgz.*Without network, "
        r"download 102flowers.tgz, imagelabels.mat and setid",
    ):
        OxfordFlowers102(cache_dir=str(tmp_path), resolution=R).load(2, 0)


def assert_nothing_cached(tmp_path):
    root = tmp_path / "cache" / "oxford_flowers102"
    assert not root.exists() or os.listdir(root) == []


def test_truncated_archive(tmp_path, official):
    data = (official / flowers.ARCHIVE).read_bytes()
    (official / flowers.ARCHIVE).write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"102flowers.tgz: corrupt or truncated archive"):
        spec(tmp_path, official).load(2, 0)
    assert_nothing_cached(tmp_path)


def test_corrupt_jpeg_names_member(tmp_path):
    root = write_official(tmp_path / "o", skip=(3,), extra_members=[("jpg/image_00003.jpg", b"not a jpeg")])
    with pytest.raises(ValueError, match=r"jpg/image_00003.jpg is not a readable JPEG"):
        spec(tmp_path, root).load(2, 0)
    assert_nothing_cached(tmp_path)


def test_unsafe_member_is_refused(tmp_path):
    root = write_official(tmp_path / "o", extra_members=[("../escape.jpg", b"x")])
    with pytest.raises(ValueError, match=r"member '../escape.jpg' would leave the target directory"):
        spec(tmp_path, root).load(2, 0)
    assert not (tmp_path / "escape.jpg").exists()
    assert_nothing_cached(tmp_path)


def test_missing_image_and_bad_mat_files(tmp_path):
    root = write_official(tmp_path / "a", skip=(6,))
    with pytest.raises(ValueError, match=r"lacks jpg/image_00006.jpg"):
        spec(tmp_path, root).load(2, 0)
    root = write_official(tmp_path / "b")
    (root / flowers.LABELS).write_bytes(b"garbage")
    with pytest.raises(ValueError, match=r"imagelabels.mat: not a readable .mat file"):
        spec(tmp_path, root).load(2, 0)
    root = write_official(tmp_path / "c", setid={"trnid": np.array([[1]]), "valid": np.array([[2]])})
    with pytest.raises(ValueError, match=r"setid.mat: has no variable 'tstid'"):
        spec(tmp_path, root).load(2, 0)
    root = write_official(
        tmp_path / "d", setid={"trnid": np.array([[1, 11]]), "valid": np.array([[2]]), "tstid": np.array([[3]])}
    )
    with pytest.raises(ValueError, match=r"trnid names image 11, but .* labels images 1..10"):
        spec(tmp_path, root).load(2, 0)
    assert_nothing_cached(tmp_path)
