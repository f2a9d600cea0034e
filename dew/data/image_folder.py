"""``image_folder``: images in a folder of class folders, decoded a batch at a time.

Two layouts, told apart by a folder named ``data.split`` (``train``) in the root:

- ``root/<class>/**/*.{png,jpg,jpeg,webp}``: every image trains (``data.eval_fraction`` holds a
  fixed part of each class out to evaluate);
- Hugging Face's imagefolder layout, ``root/train/<class>/...`` beside ``root/validation/<class>/...``
  (or the folder ``data.eval_split`` names): the split folders train and evaluate.

A class is a folder (its images may sit in nested folders); labels are the sorted class names (or
``data.classes``, in its order). Files of other kinds and hidden files and folders (``.DS_Store``,
``.ipynb_checkpoints``) are passed over. Every image is opened and checked at load
(``dew.data.images.check_sources``); batches are decoded, resized and flipped by ``dew.data.images``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from dew.data.images import (
    EXTENSIONS,
    DecodePool,
    ImageDataset,
    ImageRecords,
    default_threads,
    image_dataset,
)

if TYPE_CHECKING:
    from dew.data.fields import ImageFolderFields


def split_folders(spec: ImageFolderFields) -> tuple[str, str | None]:
    """(the folder of class folders that trains, the one that evaluates or None)."""
    if not spec.root:
        raise ValueError("data.root is unset: name the folder of class folders (data.root=...)")
    root = os.path.expanduser(spec.root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"data.root={spec.root!r} is not a folder")
    train = os.path.join(root, spec.split)
    if not os.path.isdir(train):
        if spec.split != "train" or spec.eval_split is not None:
            what = f"data.split={spec.split!r}" if spec.split != "train" else f"data.eval_split={spec.eval_split!r}"
            raise ValueError(
                f"{what}: data.root={spec.root!r} has no {spec.split}/ folder (its folders: {_folders(root)}); "
                "a root of class folders has no splits"
            )
        return root, None
    if spec.eval_split is None:
        validation = os.path.join(root, "validation")
        return train, validation if os.path.isdir(validation) else None
    held_out = os.path.join(root, spec.eval_split)
    if not os.path.isdir(held_out):
        raise ValueError(
            f"data.eval_split={spec.eval_split!r}: data.root={spec.root!r} has no {spec.eval_split}/ folder "
            f"(its folders: {_folders(root)})"
        )
    return train, held_out


def _folders(directory: str) -> str:
    return (
        ", ".join(sorted(e.name for e in os.scandir(directory) if e.is_dir() and not e.name.startswith("."))) or "none"
    )


def class_files(directory: str) -> dict[str, list[str]]:
    """Each class folder of ``directory`` (sorted) and its image files (sorted paths); an empty
    split or class folder raises."""
    classes = sorted(e.name for e in os.scandir(directory) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise ValueError(f"{directory} holds no class folder: images go in {directory}/<class>/")
    found = {}
    for name in classes:
        files = []
        for folder, subfolders, names in os.walk(os.path.join(directory, name)):
            subfolders[:] = [s for s in subfolders if not s.startswith(".")]
            files += [
                os.path.join(folder, n) for n in names if not n.startswith(".") and n.lower().endswith(EXTENSIONS)
            ]
        if not files:
            raise ValueError(f"{os.path.join(directory, name)} holds no image ({', '.join(EXTENSIONS)})")
        found[name] = sorted(files)
    return found


def class_names(spec: ImageFolderFields, found: dict[str, list[str]], directory: str) -> tuple[str, ...]:
    """The labels' names: ``data.classes`` when given (and the folders agree with it), else the
    sorted class folders."""
    if not spec.classes:
        return tuple(found)
    unnamed = sorted(set(found) - set(spec.classes))
    if unnamed:
        raise ValueError(
            f"{os.path.join(directory, unnamed[0])}: class {unnamed[0]!r} is not one of "
            f"data.classes={list(spec.classes)}"
        )
    absent = [c for c in spec.classes if c not in found]
    if absent:
        raise ValueError(f"data.classes names {absent[0]!r}, which has no folder in {directory}")
    return spec.classes


def folder_records(
    found: dict[str, list[str]], names: tuple[str, ...], directory: str, spec: ImageFolderFields, pool: DecodePool
) -> ImageRecords:
    """The images of ``found`` as records, labelled by their class's place in ``names``."""
    label = {name: i for i, name in enumerate(names)}
    outside = sorted(set(found) - set(label))
    if outside:
        raise ValueError(
            f"{os.path.join(directory, outside[0])}: class {outside[0]!r} is not one of the training "
            f"classes {list(names)}"
        )
    paths = [p for name in found for p in found[name]]
    labels = np.array([label[name] for name in found for _ in found[name]], np.int32)
    return ImageRecords(
        fetch=lambda idx: [paths[i] for i in idx.tolist()],
        name=lambda i: paths[i],
        labels=labels,
        image_size=spec.image_size,
        channels=spec.channels,
        pool=pool,
    )


def load_image_folder(spec: ImageFolderFields, batch_size: int, seed: int) -> ImageDataset:
    """The images under ``data.root`` at global batch ``batch_size``, shuffled from ``seed``."""
    train_dir, eval_dir = split_folders(spec)
    found = class_files(train_dir)
    names = class_names(spec, found, train_dir)
    pool = DecodePool(spec.decode_threads or default_threads())
    train = folder_records(found, names, train_dir, spec, pool)
    held_out = None if eval_dir is None else folder_records(class_files(eval_dir), names, eval_dir, spec, pool)
    if held_out is not None and spec.eval_fraction:
        raise ValueError(
            f"data.eval_fraction={spec.eval_fraction}: data.root={spec.root!r} has a "
            f"{os.path.basename(eval_dir or '')}/ split that evaluates; hold out a fraction only of data without one"
        )
    return image_dataset(spec, train, held_out, names, batch_size=batch_size, seed=seed, where=spec.root)
