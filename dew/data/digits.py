"""``digits``: scikit-learn's 1,797 8x8 handwritten digits, the embedded default that needs no
network.

The 16 grey levels (0..16) are kept as uint8 and scaled to float32 in [-1, 1] once per batch
(``image = level / 8 - 1``); images are (8, 8, 1) NHWC and labels int32. The held-out split is
class-stratified and fixed (scikit-learn's ``train_test_split`` with ``random_state=0``), so it does
not move with the run's seed; the run's seed shuffles the training records.

The arrays and the split are kept after the first load in ``<cache>/digits/`` (``$DEW_DATA_DIR``, else
``~/.cache/dew/datasets``), one small file per scikit-learn version and ``eval_fraction``: importing
scikit-learn (and the SciPy it pulls in) takes about 0.7 s, more than importing JAX, in every process
that loads digits (every task of a pool, every job of a sweep), for 120 kB of data. The file is
written to a temporary name and renamed into place, so it is complete or absent; one that cannot be
read is built again, and one that cannot be written (a read-only home) is not needed.
"""

from __future__ import annotations

import importlib.metadata
import os
import tempfile
import zipfile
from typing import TYPE_CHECKING

import numpy as np

from dew.contract.data import Batch
from dew.data.pipeline import ArrayRecords, RecordDataset

if TYPE_CHECKING:
    from dew.data.fields import DigitsFields


NUM_CLASSES = 10
SIDE = 8
LEVELS = 16


def _decode(raw: Batch) -> Batch:
    image = raw["image"].astype(np.float32) * (2.0 / LEVELS) - 1.0
    return {"image": image[..., None], "label": raw["label"].astype(np.int32)}


def split_digits(eval_fraction: float, labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Indices (sorted) of the training and the held-out records, stratified by class."""
    import sklearn.datasets
    import sklearn.model_selection

    labels = sklearn.datasets.load_digits().target if labels is None else labels
    train, held_out = sklearn.model_selection.train_test_split(
        np.arange(len(labels)), test_size=eval_fraction, stratify=labels, random_state=0
    )
    return np.sort(train), np.sort(held_out)


FIELDS = ("images", "labels", "train", "held_out")
"""The arrays of the digits file: the images (uint8 levels), the labels, and the split's indices."""


def cached_path(eval_fraction: float) -> str:
    """Where the arrays and the split for ``eval_fraction`` are kept."""
    base = os.path.expanduser(os.environ.get("DEW_DATA_DIR") or "~/.cache/dew/datasets")
    version = importlib.metadata.version("scikit-learn")
    return os.path.join(base, "digits", f"sklearn-{version}-eval{eval_fraction!r}.npz")


def _build(eval_fraction: float) -> dict[str, np.ndarray]:
    import sklearn.datasets

    bunch = sklearn.datasets.load_digits()
    labels = bunch.target.astype(np.int32)
    train, held_out = split_digits(eval_fraction, labels)
    # exact: the levels are integers 0..16
    return {"images": bunch.images.astype(np.uint8), "labels": labels, "train": train, "held_out": held_out}


def digits_arrays(eval_fraction: float) -> dict[str, np.ndarray]:
    """The images, labels and split (``FIELDS``) for ``eval_fraction``: from the cache, else built
    with scikit-learn and kept."""
    path = cached_path(eval_fraction)
    try:
        with np.load(path) as kept:
            return {name: kept[name] for name in FIELDS}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass  # absent, or unreadable: built again below
    arrays = _build(eval_fraction)
    _keep(path, arrays)
    return arrays


def _keep(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Write ``arrays`` to ``path`` whole or not at all; where it cannot be written, nothing is kept."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".digits-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub lets **kwds reach allow_pickle: bool
        os.replace(tmp, path)
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def load_digits(spec: DigitsFields, batch_size: int, seed: int) -> RecordDataset:
    """The digits dataset at global batch ``batch_size``, shuffled from ``seed``."""
    arrays = digits_arrays(spec.eval_fraction)
    images, labels, train, held_out = (arrays[name] for name in FIELDS)

    def records(idx: np.ndarray) -> ArrayRecords:
        return ArrayRecords({"image": images[idx], "label": labels[idx]}, decode=_decode)

    return RecordDataset(
        name=spec.name,
        train=records(train),
        held_out=records(held_out),
        batch_size=batch_size,
        seed=seed,
        fields={"input_size": SIDE, "in_channels": 1, "num_classes": NUM_CLASSES},
    )
