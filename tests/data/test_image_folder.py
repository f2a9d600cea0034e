"""image_folder on the shared pipeline: batches against a Pillow reference, the two layouts, the
flip, resume, two-process sharding, and each bad input failing at load with one line naming it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dew.data.image_folder import load_image_folder
from dew.data.images import ImageError
from dew.data.pipeline import epoch_order
from dew.data.specs import ImageFolder, datasets
from tests.data.shapes import CLASSES, write_shapes

SIZE = 8
SEED = 3


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    """Twelve images of each of the four classes, flat."""
    return write_shapes(tmp_path_factory.mktemp("shapes"), 12)


@pytest.fixture(scope="module")
def split_shapes(tmp_path_factory) -> Path:
    """Hugging Face's imagefolder layout: train/ (10 a class) beside validation/ (3 a class)."""
    root = tmp_path_factory.mktemp("split")
    write_shapes(root, 10, split="train")
    return write_shapes(root, 3, split="validation", seed=1)


def reference(path: Path) -> np.ndarray:
    """``path`` decoded as the docs say: RGB, centre crop to the shorter side, bicubic resize, in [-1, 1]."""
    image = Image.open(path).convert("RGB")
    w, h = image.size
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    image = image.crop((left, top, left + side, top + side)).resize((SIZE, SIZE), Image.Resampling.BICUBIC)
    return np.asarray(image, np.float32) / 127.5 - 1.0


def files_and_labels(root: Path) -> tuple[list[Path], np.ndarray]:
    """The training records in the order the dataset numbers them: sorted classes, sorted files."""
    files = [p for name in sorted(CLASSES) for p in sorted((root / name).iterdir())]
    return files, np.array([sorted(CLASSES).index(p.parent.name) for p in files])


def test_registered_fields_and_batches_equal_a_pillow_reference(shapes):
    assert datasets["image_folder"] is ImageFolder
    ds = ImageFolder(root=str(shapes), image_size=SIZE).load(batch_size=16, seed=SEED)
    assert ds.model_fields() == {"input_size": SIZE, "in_channels": 3, "num_classes": 4}
    assert ds.class_names == tuple(sorted(CLASSES)) and ds.data_fields() == {"classes": tuple(sorted(CLASSES))}
    assert (ds.num_records, ds.num_eval_records) == (48, 0) and list(ds.eval_batches()) == []
    assert ds.batch_spec() == {"image": ((16, SIZE, SIZE, 3), np.float32), "label": ((16,), np.int32)}
    files, labels = files_and_labels(shapes)
    it = ds.iterator()
    stream = np.concatenate([epoch_order(48, SEED, 0), epoch_order(48, SEED, 1)])
    for b in range(4):  # the fourth batch is the next epoch's
        batch = it.next()
        rows = stream[16 * b : 16 * (b + 1)]
        np.testing.assert_array_equal(batch["label"], labels[rows])
        want = np.stack([reference(files[i]) for i in rows])
        np.testing.assert_allclose(batch["image"], want, atol=1e-6)


def test_grey_channel_and_a_fixed_held_out_fraction(shapes):
    ds = ImageFolder(root=str(shapes), image_size=SIZE, channels=1, eval_fraction=0.25).load(batch_size=8, seed=0)
    assert ds.model_fields()["in_channels"] == 1 and ds.batch_spec()["image"][0] == (8, SIZE, SIZE, 1)
    assert (ds.num_records, ds.num_eval_records) == (36, 12)
    held = np.concatenate([b["label"][b["mask"] > 0] for b in ds.eval_batches()])
    assert np.bincount(held).tolist() == [3, 3, 3, 3]  # a quarter of each class
    again = ImageFolder(root=str(shapes), image_size=SIZE, eval_fraction=0.25).load(batch_size=8, seed=9)
    for a, b in zip(ds.eval_batches(), again.eval_batches(), strict=True):
        np.testing.assert_array_equal(a["label"], b["label"])  # the held-out part does not move with the seed


def test_split_layout_trains_on_train_and_evaluates_on_validation(split_shapes):
    ds = ImageFolder(root=str(split_shapes), image_size=SIZE).load(batch_size=8, seed=0)
    assert (ds.num_records, ds.num_eval_records) == (40, 12)
    batches = list(ds.eval_batches())
    assert len(batches) == 2 and batches[-1]["mask"].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    files, labels = files_and_labels(split_shapes / "validation")
    got = np.concatenate([b["image"][b["mask"] > 0] for b in batches])
    np.testing.assert_allclose(got, np.stack([reference(f) for f in files]), atol=1e-6)
    assert np.concatenate([b["label"][b["mask"] > 0] for b in batches]).tolist() == labels.tolist()
    named = ImageFolder(root=str(split_shapes), image_size=SIZE, eval_split="train").load(batch_size=8, seed=0)
    assert named.num_eval_records == 40


def test_flip_resumes_exactly_and_mirrors_the_image(shapes):
    spec = ImageFolder(root=str(shapes), image_size=SIZE, flip=True)
    ds = spec.load(batch_size=12, seed=SEED)
    plain = ImageFolder(root=str(shapes), image_size=SIZE).load(batch_size=12, seed=SEED).iterator()
    it = ds.iterator()
    whole = [it.next() for _ in range(9)]  # 108 records: into the third epoch
    flipped = 0
    for batch in whole:
        same = plain.next()
        np.testing.assert_array_equal(batch["label"], same["label"])
        mirrored = np.all(batch["image"] == same["image"][:, :, ::-1], axis=(1, 2, 3))
        unchanged = np.all(batch["image"] == same["image"], axis=(1, 2, 3))
        assert np.all(mirrored | unchanged)
        flipped += int(np.sum(mirrored & ~unchanged))
    assert 30 < flipped < 78, flipped  # about half of 108
    first = ds.iterator()
    for _ in range(4):
        first.next()
    resumed = spec.load(batch_size=12, seed=SEED).iterator()
    resumed.set_state(first.get_state())
    for batch in whole[4:]:
        again = resumed.next()
        np.testing.assert_array_equal(again["image"], batch["image"])
        np.testing.assert_array_equal(again["label"], batch["label"])


def test_two_processes_read_disjoint_halves_of_each_global_batch(shapes):
    ds = ImageFolder(root=str(shapes), image_size=SIZE, flip=True).load(batch_size=16, seed=SEED)
    one, p0, p1 = ds.iterator(), ds.iterator(0, 2), ds.iterator(1, 2)
    for _ in range(3):  # one epoch: every record once
        whole, a, b = one.next(), p0.next(), p1.next()
        assert len(a["label"]) == len(b["label"]) == 8
        np.testing.assert_array_equal(np.concatenate([a["image"], b["image"]]), whole["image"])
        np.testing.assert_array_equal(np.concatenate([a["label"], b["label"]]), whole["label"])
    assert p0.get_state() == p1.get_state() == one.get_state()


def test_class_names_given_keep_their_order(shapes):
    order = ("triangle", "bar", "square", "circle")
    ds = ImageFolder(root=str(shapes), image_size=SIZE, classes=order).load(batch_size=48, seed=0)
    batch = ds.iterator().next(batch_size=48)
    by_name = ImageFolder(root=str(shapes), image_size=SIZE).load(batch_size=48, seed=0).iterator().next(batch_size=48)
    np.testing.assert_array_equal(np.array(order)[batch["label"]], np.array(sorted(CLASSES))[by_name["label"]])


# --- bad input: one line at load, naming the file or the field -------------------------------------


def bad_copy(shapes: Path, tmp_path: Path) -> Path:
    root = tmp_path / "bad"
    shutil.copytree(shapes, root)
    return root


def load(root: Path, **fields: object):
    return load_image_folder(ImageFolder(root=str(root), image_size=SIZE, **fields), batch_size=8, seed=0)


def test_an_undecodable_or_truncated_image_is_named(shapes, tmp_path):
    root = bad_copy(shapes, tmp_path)
    (root / "circle" / "zz-text.png").write_text("not a picture")
    with pytest.raises(ImageError, match=r"circle/zz-text\.png: not a readable image") as err:
        load(root)
    assert "\n" not in str(err.value)
    (root / "circle" / "zz-text.png").unlink()
    whole = (root / "square" / "0000.png").read_bytes()
    (root / "square" / "0000.png").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ImageError, match=r"square/0000\.png: not a readable image"):
        load(root)
    (root / "square" / "0000.png").write_bytes(whole)
    jpeg = (root / "bar" / "0001.jpg").read_bytes()
    (root / "bar" / "0001.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    with pytest.raises(ImageError, match=r"bar/0001\.jpg: not a readable image"):
        load(root)


def test_an_empty_class_or_split_folder_is_named(shapes, tmp_path):
    root = bad_copy(shapes, tmp_path)
    (root / "empty").mkdir()
    (root / "empty" / "notes.txt").write_text("no images here")
    with pytest.raises(ValueError, match=r"bad/empty holds no image \(\.png, \.jpg, \.jpeg, \.webp\)"):
        load(root)
    (tmp_path / "none" / "train").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"none/train holds no class folder"):
        load(tmp_path / "none")
    with pytest.raises(FileNotFoundError, match=r"data.root=.*nowhere' is not a folder"):
        load(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"data.root is unset"):
        load_image_folder(ImageFolder(), batch_size=8, seed=0)


def test_a_class_outside_the_classes_is_named(shapes, split_shapes, tmp_path):
    with pytest.raises(ValueError, match=r"class 'triangle' is not one of data.classes=\['bar', 'circle', 'square'\]"):
        load(shapes, classes=("bar", "circle", "square"))
    with pytest.raises(ValueError, match=r"data.classes names 'hexagon', which has no folder"):
        load(shapes, classes=(*sorted(CLASSES), "hexagon"))
    root = bad_copy(split_shapes, tmp_path)
    (root / "validation" / "circle").rename(root / "validation" / "oval")
    with pytest.raises(ValueError, match=r"validation/oval: class 'oval' is not one of the training classes"):
        load(root)


def test_a_missing_split_is_named(shapes, split_shapes):
    with pytest.raises(
        ValueError, match=r"data.eval_split='test': data.root=.* has no test/ folder \(its folders: train, validation\)"
    ):
        load(split_shapes, eval_split="test")
    with pytest.raises(ValueError, match=r"data.eval_split='validation': data.root=.* has no train/ folder"):
        load(shapes, eval_split="validation")
    with pytest.raises(ValueError, match=r"data.eval_fraction=0.2: data.root=.* has a validation/ split"):
        load(split_shapes, eval_fraction=0.2)
    with pytest.raises(ValueError, match=r"evaluate on a split or on a held-out fraction, not both"):
        ImageFolder(root="x", eval_fraction=0.1, eval_split="validation")
