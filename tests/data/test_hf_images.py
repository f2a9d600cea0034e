"""hf_images: a save_to_disk DatasetDict, Parquet files written by pyarrow alone and JSON lines
naming image files read to the same batches; resume, sharding, and each bad input at load."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from dew.data.images import ImageError
from dew.data.specs import HFImages
from tests.data.shapes import CLASSES, draw

SIZE = 8
NAMES = sorted(CLASSES)


def encoded(per_class: int, seed: int) -> tuple[list[bytes], list[int]]:
    """PNG bytes of ``per_class`` images of each class, the classes interleaved, and their labels."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for i in range(per_class * len(NAMES)):
        buffer = io.BytesIO()
        draw(NAMES[i % 4], rng).save(buffer, "PNG")
        images.append(buffer.getvalue())
        labels.append(i % 4)
    return images, labels


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """The same records three ways: ``disk`` (save_to_disk: train 8 a class, validation 2 a class,
    Image and ClassLabel features), ``parquet`` (train.parquet and val.parquet written by pyarrow:
    {bytes, path} structs and string labels) and ``jsonl`` (file paths relative to the file, int labels)."""
    import datasets  # here, not at the top: each pytest worker collects every module (0.7-2 CPU-s)

    root = tmp_path_factory.mktemp("hf")
    train, validation = encoded(8, 0), encoded(2, 1)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES)})
    splits = {
        name: datasets.Dataset.from_dict(
            {"image": [{"bytes": b, "path": None} for b in images], "label": labels}, features=features
        )
        for name, (images, labels) in (("train", train), ("validation", validation))
    }
    datasets.DatasetDict(splits).save_to_disk(str(root / "disk"))
    (root / "files" / "images").mkdir(parents=True)
    lines = []
    for file, (images, labels) in (("train", train), ("val", validation)):
        table = pa.table(
            {
                "image": [{"bytes": b, "path": f"{file}-{i}.png"} for i, b in enumerate(images)],
                "label": [NAMES[x] for x in labels],
            }
        )
        pq.write_table(table, root / "files" / f"{file}.parquet")
        if file == "train":
            for i, (b, label) in enumerate(zip(images, labels, strict=True)):
                (root / "files" / "images" / f"{i}.png").write_bytes(b)
                lines.append(json.dumps({"file": f"images/{i}.png", "class": label}))
    (root / "files" / "train.jsonl").write_text("\n".join(lines) + "\n")
    return {"root": root, "disk": root / "disk", "files": root / "files", "cache": root / "cache"}


def load(path: Path, sources: dict[str, Path], batch_size: int = 8, **fields: object):
    from dew.data.hf_images import load_hf_images  # imports datasets: see sources()

    spec = HFImages(path=str(path), image_size=SIZE, cache_dir=str(sources["cache"]), **fields)
    return load_hf_images(spec, batch_size=batch_size, seed=5)


def reference(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = image.size
    side = min(w, h)
    left, top = (w - side) // 2, (h - side) // 2
    image = image.crop((left, top, left + side, top + side)).resize((SIZE, SIZE), Image.Resampling.BICUBIC)
    return np.asarray(image, np.float32) / 127.5 - 1.0


def test_a_save_to_disk_dataset_dict_trains_and_evaluates(sources):
    ds = load(sources["disk"], sources)
    assert ds.class_names == tuple(NAMES) and ds.model_fields() == {
        "input_size": SIZE,
        "in_channels": 3,
        "num_classes": 4,
    }
    assert (ds.num_records, ds.num_eval_records) == (32, 8)
    images, labels = encoded(8, 0)
    batch = ds.iterator().next(batch_size=32)  # one whole epoch
    want = np.stack([reference(b) for b in images])

    def levels(x: np.ndarray) -> list[bytes]:  # each record's pixels, to match records by
        return [np.round((row + 1) * 127.5).astype(np.uint8).tobytes() for row in x]

    order, mine = np.argsort(levels(want)), np.argsort(levels(batch["image"]))
    np.testing.assert_allclose(batch["image"][mine], want[order], atol=1e-6)
    np.testing.assert_array_equal(batch["label"][mine], np.array(labels)[order])
    evaluated = list(ds.eval_batches())
    assert len(evaluated) == 1 and evaluated[0]["mask"].tolist() == [1.0] * 8


def test_parquet_and_json_lines_read_the_same_batches(sources):
    disk = load(sources["disk"], sources, flip=True)
    parquet = load(
        sources["files"] / "train.parquet", sources, flip=True, val_path=str(sources["files"] / "val.parquet")
    )
    assert parquet.class_names == tuple(NAMES) and parquet.num_eval_records == 8
    lines = load(sources["files"] / "train.jsonl", sources, flip=True, image_field="file", label_field="class")
    assert lines.class_names == ("0", "1", "2", "3") and lines.num_eval_records == 0
    named = load(
        sources["files"] / "train.jsonl", sources, image_field="file", label_field="class", classes=tuple(NAMES)
    )
    assert named.class_names == tuple(NAMES)
    its = [ds.iterator() for ds in (disk, parquet, lines)]
    for _ in range(6):
        a, b, c = (it.next() for it in its)
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["image"], c["image"])
        np.testing.assert_array_equal(a["label"], b["label"])
        np.testing.assert_array_equal(a["label"], c["label"])
    for x, y in zip(disk.eval_batches(), parquet.eval_batches(), strict=True):
        np.testing.assert_array_equal(x["image"], y["image"])


def test_resume_and_two_processes(sources):
    ds = load(sources["disk"], sources, flip=True)
    it = ds.iterator()
    whole = [it.next() for _ in range(7)]
    first = ds.iterator()
    for _ in range(3):
        first.next()
    resumed = load(sources["disk"], sources, flip=True).iterator()
    resumed.set_state(first.get_state())
    p0, p1 = ds.iterator(0, 2), ds.iterator(1, 2)
    p0.set_state(first.get_state())
    p1.set_state(first.get_state())
    for batch in whole[3:]:
        np.testing.assert_array_equal(resumed.next()["image"], batch["image"])
        halves = [p.next() for p in (p0, p1)]
        np.testing.assert_array_equal(np.concatenate([h["image"] for h in halves]), batch["image"])
        np.testing.assert_array_equal(np.concatenate([h["label"] for h in halves]), batch["label"])


# --- bad input: one line at load, naming the field, the split or the row ---------------------------


def test_a_missing_field_or_split_is_named(sources):
    with pytest.raises(
        ValueError, match=r"data.image_field='img': .*disk split train has no such column \(its columns: image, label\)"
    ):
        load(sources["disk"], sources, image_field="img")
    with pytest.raises(ValueError, match=r"data.label_field='y': .*train.parquet split train has no such column"):
        load(sources["files"] / "train.parquet", sources, label_field="y")
    with pytest.raises(ValueError, match=r"data.eval_split='test': .*disk has the splits train, validation"):
        load(sources["disk"], sources, eval_split="test")
    with pytest.raises(FileNotFoundError, match=r"data.path=.*nothing\*.parquet' names no file"):
        load(sources["files"] / "nothing*.parquet", sources)


def test_an_empty_split_is_named(sources, tmp_path):
    import datasets

    empty = datasets.Dataset.from_dict(
        {"image": [], "label": []},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES)}),
    )
    datasets.DatasetDict({"train": empty}).save_to_disk(str(tmp_path / "empty"), num_shards={"train": 1})
    with pytest.raises(ValueError, match=r"empty split train holds no records"):
        load(tmp_path / "empty", sources)
    pq.write_table(
        pa.table({"image": pa.array([], pa.binary()), "label": pa.array([], pa.int64())}), tmp_path / "e.parquet"
    )
    with pytest.raises(ValueError, match=r"data.path=.*e.parquet': the datasets library cannot read the files \("):
        load(tmp_path / "e.parquet", sources)


def test_a_label_outside_the_classes_is_named(sources, tmp_path):
    with pytest.raises(
        ValueError, match=r"row 3: label='triangle' is not one of the 3 classes \['bar', 'circle', 'square'\]"
    ):
        load(sources["files"] / "train.parquet", sources, classes=("bar", "circle", "square"))
    with pytest.raises(
        ValueError, match=r"train.jsonl split train row 2: class=2 is not one of the 2 classes \['a', 'b'\]"
    ):
        load(sources["files"] / "train.jsonl", sources, image_field="file", label_field="class", classes=("a", "b"))
    with pytest.raises(ValueError, match=r"data.classes=\['a', 'b', 'c', 'd'\], but .*label ClassLabel names"):
        load(sources["disk"], sources, classes=("a", "b", "c", "d"))


def test_an_undecodable_image_is_named_by_its_row(sources, tmp_path):
    images, labels = encoded(2, 0)
    images[5] = b"\x89PNG\r\n\x1a\n but not really"
    pq.write_table(pa.table({"image": images, "label": labels}), tmp_path / "broken.parquet")
    with pytest.raises(ImageError, match=r"broken.parquet split train row 5: not a readable image"):
        load(tmp_path / "broken.parquet", sources)
