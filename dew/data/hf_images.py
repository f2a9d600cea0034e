"""``hf_images``: images and labels from a Hugging Face dataset, decoded a batch at a time.

The data is read by the ``datasets`` library (``pip install 'dew[data]'``), offline:

- a directory ``save_to_disk`` wrote: a ``DatasetDict`` (``data.split`` trains, ``data.eval_split``
  or its ``validation`` split evaluates) or one ``Dataset`` (it trains; ``data.eval_fraction`` holds
  a part out);
- data files (``data.path``, a file or a glob: Parquet, Arrow, JSON lines, CSV, by their suffix),
  loaded with ``load_dataset(<format>, data_files=...)`` (which converts them to Arrow once, into
  ``data.cache_dir``): they are the ``train`` split, ``data.val_path``'s files the ``validation`` split.

The image column (``data.image_field``) is read undecoded: an ``Image`` feature's ``{bytes, path}``,
such a record written by another tool, encoded bytes, or a file path (a relative one from the data
file's folder). The label column (``data.label_field``) is a ``ClassLabel`` (its names name the
classes), strings (the sorted training values name them) or whole numbers (0..max, named by
``data.classes`` or by their digits). Each record's image is fetched from the Arrow table when its
batch is read, and decoded, resized and flipped by ``dew.data.images``; every image is opened and
checked once at load.
"""

from __future__ import annotations

import glob
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from dew.data.images import (
    DecodePool,
    ImageDataset,
    ImageError,
    ImageRecords,
    Source,
    default_threads,
    image_dataset,
)

try:
    import datasets
except ImportError as err:  # the optional extra
    raise ImportError(
        "data=hf_images reads Hugging Face datasets with the datasets library: pip install 'dew[data]'"
    ) from err

if TYPE_CHECKING:
    from dew.data.fields import HFImagesFields

BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json", ".csv": "csv"}
"""The ``datasets`` builder that reads data files of each suffix."""


def data_files(pattern: str, field: str) -> tuple[list[str], str]:
    """The files ``pattern`` names (sorted) and the builder that reads them."""
    files = sorted(glob.glob(os.path.expanduser(pattern)))
    if not files:
        raise FileNotFoundError(f"{field}={pattern!r} names no file (a save_to_disk directory, a data file or a glob)")
    suffixes = {os.path.splitext(f)[1].lower() for f in files}
    unknown = sorted(suffixes - set(BUILDERS))
    if unknown:
        raise ValueError(
            f"{field}={pattern!r}: {unknown[0]!r} files are not data files dew reads ({', '.join(BUILDERS)})"
        )
    builders = {BUILDERS[s] for s in suffixes}
    if len(builders) > 1:
        raise ValueError(f"{field}={pattern!r} mixes formats ({', '.join(sorted(builders))}): name files of one")
    return files, builders.pop()


def read_splits(spec: HFImagesFields) -> tuple[dict[str, Any], str]:
    """The dataset's splits by name, and the folder relative image paths start from."""
    if not spec.path:
        raise ValueError("data.path is unset: name a save_to_disk directory or data files (data.path=...)")
    path = os.path.expanduser(spec.path)
    if os.path.isdir(path):
        if spec.val_path is not None:
            raise ValueError(
                f"data.val_path={spec.val_path!r}: data.path={spec.path!r} is a save_to_disk directory; "
                "its own splits evaluate (data.eval_split)"
            )
        loaded = datasets.load_from_disk(path)
        if isinstance(loaded, datasets.Dataset):
            if spec.eval_split is not None or spec.split != "train":
                raise ValueError(
                    f"data.path={spec.path!r} holds one Dataset, no splits: it trains whole "
                    "(data.eval_fraction holds a part out)"
                )
            return {"train": loaded}, path
        return dict(loaded), path
    files, builder = data_files(spec.path, "data.path")
    named = {"train": files}
    if spec.val_path is not None:
        named["validation"], val_builder = data_files(spec.val_path, "data.val_path")
        if val_builder != builder:
            raise ValueError(f"data.val_path={spec.val_path!r} is {val_builder}, data.path={spec.path!r} {builder}")
    try:
        loaded = datasets.load_dataset(builder, data_files=named, cache_dir=spec.cache_dir)
    except datasets.exceptions.DatasetGenerationError as err:  # an empty or damaged file
        cause = err.__cause__ or err
        raise ValueError(
            f"data.path={spec.path!r}: the datasets library cannot read the files ({type(cause).__name__}: {cause})"
        ) from err
    return dict(loaded), os.path.dirname(os.path.abspath(files[0]))


def chosen_splits(spec: HFImagesFields, splits: dict[str, Any]) -> tuple[Any, str | None]:
    """(the split that trains, the name of the one that evaluates or None)."""
    if spec.split not in splits:
        raise ValueError(f"data.split={spec.split!r}: {spec.path} has the splits {', '.join(splits)}")
    if spec.eval_split is None:
        return splits[spec.split], "validation" if "validation" in splits and spec.split != "validation" else None
    if spec.eval_split not in splits:
        raise ValueError(f"data.eval_split={spec.eval_split!r}: {spec.path} has the splits {', '.join(splits)}")
    return splits[spec.split], spec.eval_split


def columns(spec: HFImagesFields, table: datasets.Dataset, split: str) -> None:
    """Refuse a split without the image or the label column, or an empty one."""
    for field in ("image_field", "label_field"):
        column = getattr(spec, field)
        if column not in table.column_names:
            raise ValueError(
                f"data.{field}={column!r}: {spec.path} split {split} has no such column "
                f"(its columns: {', '.join(table.column_names)})"
            )
    if len(table) == 0:
        raise ValueError(f"{spec.path} split {split} holds no records")


def label_names(spec: HFImagesFields, table: datasets.Dataset) -> tuple[str, ...]:
    """The names of the classes, from the training split's label column (and ``data.classes``)."""
    feature = table.features[spec.label_field]
    if isinstance(feature, datasets.ClassLabel):
        names = tuple(feature.names)
        if spec.classes and tuple(spec.classes) != names:
            raise ValueError(
                f"data.classes={list(spec.classes)}, but {spec.path}'s {spec.label_field} ClassLabel "
                f"names {list(names)}"
            )
        return names
    values = np.asarray(table.with_format("arrow")[spec.label_field])
    if values.dtype.kind in "OUS":  # strings: the class names themselves
        found = sorted({str(v) for v in values})
        if not spec.classes:
            return tuple(found)
        absent = [c for c in spec.classes if c not in found]
        if absent:
            raise ValueError(f"data.classes names {absent[0]!r}, which no {spec.label_field} of {spec.path} holds")
        return spec.classes
    if values.dtype.kind not in "iu":
        raise ValueError(
            f"data.label_field={spec.label_field!r} holds {values.dtype} values: labels are a ClassLabel, "
            "strings or whole numbers"
        )
    top = int(values.max())
    return spec.classes or tuple(str(i) for i in range(top + 1))


def label_ids(spec: HFImagesFields, table: datasets.Dataset, split: str, names: tuple[str, ...]) -> np.ndarray:
    """Each record's label as an index into ``names``; a label outside them raises, naming its row."""
    values = np.asarray(table.with_format("arrow")[spec.label_field])
    if values.dtype.kind in "OUS":
        index = {name: i for i, name in enumerate(names)}
        ids = np.array([index.get(str(v), -1) for v in values], np.int64)
    else:
        ids = values.astype(np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= len(names)))
    if len(bad):
        row = int(bad[0])
        value = values[row].item() if isinstance(values[row], np.generic) else values[row]
        raise ValueError(
            f"{spec.path} split {split} row {row}: {spec.label_field}={value!r} is not one of the "
            f"{len(names)} classes {list(names)[:10]}{' ...' if len(names) > 10 else ''}"
        )
    return ids.astype(np.int32)


def source_of(value: object, base: str, where: str) -> Source:
    """One image cell as a path or encoded bytes."""
    if isinstance(value, dict):
        if value.get("bytes"):
            return bytes(value["bytes"])
        value = value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str) and value:
        return value if os.path.isabs(value) else os.path.join(base, value)
    raise ImageError(f"{where}: holds {type(value).__name__} {str(value)[:60]!r}, not an image (bytes or a path)")


def hf_records(
    spec: HFImagesFields, table: datasets.Dataset, split: str, names: tuple[str, ...], base: str, pool: DecodePool
) -> ImageRecords:
    """One split's records: its labels read whole, its images fetched by index when read."""
    columns(spec, table, split)
    labels = label_ids(spec, table, split, names)
    images = table.select_columns([spec.image_field])
    if isinstance(images.features[spec.image_field], datasets.Image):
        images = images.cast_column(spec.image_field, datasets.Image(decode=False))
    where = f"{spec.path} split {split}"

    def fetch(indices: np.ndarray) -> list[Source]:
        cells = images[indices.tolist()][spec.image_field]
        return [source_of(c, base, f"{where} row {i}") for i, c in zip(indices.tolist(), cells, strict=True)]

    return ImageRecords(
        fetch=fetch,
        name=lambda i: f"{where} row {i}",
        labels=labels,
        image_size=spec.image_size,
        channels=spec.channels,
        pool=pool,
    )


def load_hf_images(spec: HFImagesFields, batch_size: int, seed: int) -> ImageDataset:
    """The images of ``data.path`` at global batch ``batch_size``, shuffled from ``seed``."""
    splits, base = read_splits(spec)
    table, eval_name = chosen_splits(spec, splits)
    if eval_name is not None and spec.eval_fraction:
        raise ValueError(
            f"data.eval_fraction={spec.eval_fraction}: {spec.path} has a {eval_name} split that evaluates; "
            "hold out a fraction only of data without one"
        )
    columns(spec, table, spec.split)
    names = label_names(spec, table)
    pool = DecodePool(spec.decode_threads or default_threads())
    train = hf_records(spec, table, spec.split, names, base, pool)
    held_out = None if eval_name is None else hf_records(spec, splits[eval_name], eval_name, names, base, pool)
    return image_dataset(spec, train, held_out, names, batch_size=batch_size, seed=seed, where=spec.path)
