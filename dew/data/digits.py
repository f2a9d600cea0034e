"""``digits``: scikit-learn's 1,797 8x8 handwritten digits, the embedded default that needs no
network.

The 16 grey levels (0..16) are kept as uint8 and scaled to float32 in [-1, 1] once per batch
(``image = level / 8 - 1``); images are (8, 8, 1) NHWC and labels int32. The held-out split is
class-stratified and fixed (scikit-learn's ``train_test_split`` with ``random_state=0``), so it does
not move with the run's seed; the run's seed shuffles the training records.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sklearn.datasets
import sklearn.model_selection

from dew.contract.data import Batch
from dew.data.pipeline import ArrayRecords, RecordDataset

Spec = Any
"""The ``digits`` spec (``dew.data.specs.Digits``), read by attribute: its ``load`` calls this
module, which does not import it back."""

NUM_CLASSES = 10
SIDE = 8
LEVELS = 16


def _decode(raw: Batch) -> Batch:
    image = raw["image"].astype(np.float32) * (2.0 / LEVELS) - 1.0
    return {"image": image[..., None], "label": raw["label"].astype(np.int32)}


def split_digits(eval_fraction: float, labels: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Indices (sorted) of the training and the held-out records, stratified by class."""
    labels = sklearn.datasets.load_digits().target if labels is None else labels
    train, held_out = sklearn.model_selection.train_test_split(
        np.arange(len(labels)), test_size=eval_fraction, stratify=labels, random_state=0)
    return np.sort(train), np.sort(held_out)


def load_digits(spec: Spec, batch_size: int, seed: int) -> RecordDataset:
    """The digits dataset at global batch ``batch_size``, shuffled from ``seed``."""
    bunch = sklearn.datasets.load_digits()
    images = bunch.images.astype(np.uint8)  # exact: the levels are integers 0..16
    labels = bunch.target.astype(np.int32)
    train, held_out = split_digits(spec.eval_fraction, labels)

    def records(idx: np.ndarray) -> ArrayRecords:
        return ArrayRecords({"image": images[idx], "label": labels[idx]}, decode=_decode)

    return RecordDataset(
        name=spec.name, train=records(train), held_out=records(held_out),
        batch_size=batch_size, seed=seed,
        fields={"input_size": SIDE, "in_channels": 1, "num_classes": NUM_CLASSES})
