"""What ``image_folder`` and ``hf_images`` share: images decoded a batch at a time, in a pool of
threads, resized and centre-cropped to the run's size, optionally flipped, on dew's record pipeline.

A source (a file path or an image's bytes) becomes a square uint8 array: the image is decoded
(a JPEG at the smallest DCT scale that still covers twice the output size, which Pillow's ``draft``
picks), converted to RGB (or grey with ``channels=1``), centre-cropped to its shorter side and
resized to ``image_size`` (bicubic). A batch's images are decoded in a ``ThreadPoolExecutor``:
Pillow releases the GIL while it decodes and resizes, so threads decode in parallel without forking
a process that holds JAX's threads (bench/data_pipeline.py measures threads against one thread and
against a pool of processes; docs/performance.md).

Every image is read through once when the dataset loads (``check_sources``, in the same pool): a
PNG by Pillow's ``verify`` (every chunk and its CRC, without inflating the pixels), a JPEG or WebP
by decoding it as a batch would. So a file that is not an image, or one cut short, fails before the
first step, naming the file; the price is one decode of each JPEG and WebP at load
(docs/performance.md).

The random horizontal flip belongs to the stream position: position ``q`` of epoch ``e`` is flipped
when ``default_rng([seed, FLIP_STREAM, e]).random(n)[q % n] < 0.5``. It depends on nothing but the
run's seed and the position, which the checkpoint holds, so a resumed run flips exactly as an
uninterrupted one, on any number of processes.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import io
import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from dew.contract.data import Batch
from dew.data.pipeline import RecordDataset, ShuffledIterator, shard_bounds

if TYPE_CHECKING:
    from dew.data.fields import ImageTransforms  # the fields its loaders share

EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp")
"""The image files a folder is read for (any case)."""
FLIP_STREAM = 0x666C6970
"""A constant that parts the flip's random stream from the epoch order's (``pipeline.epoch_order``)."""
MAX_THREADS = 16

Source = str | bytes
"""An image as a file path or as the bytes of an encoded file."""


class ImageError(ValueError):
    """An image that cannot be read; the message names it."""


def default_threads() -> int:
    """One decode thread per CPU core this process may run on, at most ``MAX_THREADS``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cores))


def to_pixels(source: Source, image_size: int, channels: int) -> np.ndarray:
    """``source`` decoded, centre-cropped to a square and resized: uint8 ``(image_size, image_size,
    channels)``. Raises what Pillow raises for an unreadable image."""
    mode = "RGB" if channels == 3 else "L"
    with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as opened:
        opened.draft(mode, (2 * image_size, 2 * image_size))  # JPEG: decode at the smallest scale that serves
        image = opened.convert("RGBA") if opened.mode == "P" else opened  # a palette's transparency, kept apart
        image = image.convert(mode)
        w, h = image.size
        side = min(w, h)
        left, top = (w - side) // 2, (h - side) // 2
        image = image.crop((left, top, left + side, top + side))
        image = image.resize((image_size, image_size), Image.Resampling.BICUBIC)
        return np.asarray(image, np.uint8).reshape(image_size, image_size, channels)


UNREADABLE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)
"""What Pillow raises for a file that is not an image, or a damaged one (some plugins raise SyntaxError)."""


def check_image(source: Source, image_size: int, channels: int) -> None:
    """Read ``source`` through: a PNG by Pillow's ``verify`` (every chunk and its CRC, to the end
    chunk, without inflating the pixels), any other image by decoding it as a batch would
    (``to_pixels``: a JPEG or WebP cut short fails only there). Raises what Pillow raises."""
    with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
        if image.format == "PNG":
            image.verify()
            return
    to_pixels(source, image_size, channels)


class DecodePool:
    """Decode threads, started at the first batch that needs them (none with ``threads=1``)."""

    def __init__(self, threads: int):
        self.threads = threads
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        if self.threads == 1 or len(items) < 2:
            return [fn(x) for x in items]
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(self.threads, thread_name_prefix="dew-decode")
        return list(self._pool.map(fn, items))


def check_sources(records: ImageRecords) -> None:
    """Read each of ``records``' images through (``check_image``), in chunks, in their pool; the
    first unreadable one raises ``ImageError`` naming it."""

    def check(item: tuple[int, Source]) -> str | None:
        try:
            check_image(item[1], records.image_size, records.channels)
        except UNREADABLE as err:
            return f"{records.name(item[0])}: not a readable image ({type(err).__name__}: {err})"
        return None

    chunk = 1024
    for start in range(0, records.num_records, chunk):
        indices = np.arange(start, min(records.num_records, start + chunk), dtype=np.int64)
        items = list(zip(indices.tolist(), records.fetch(indices), strict=True))
        problems = [p for p in records.pool.map(check, items) if p]
        if problems:
            raise ImageError(problems[0])


@dataclasses.dataclass
class ImageRecords:
    """Records whose images are decoded when a batch reads them: ``fetch`` reads the sources of
    some record indices (file paths, or bytes from a table), ``name`` names a record in an error,
    ``labels`` are int32 class indices."""

    fetch: Callable[[np.ndarray], list[Source]]
    name: Callable[[int], str]
    labels: np.ndarray
    image_size: int
    channels: int
    pool: DecodePool

    @property
    def num_records(self) -> int:
        return len(self.labels)

    def pixels(self, indices: np.ndarray) -> np.ndarray:
        """uint8 ``(len(indices), S, S, C)``: the images of ``indices``, decoded in the pool."""
        out = np.empty((len(indices), self.image_size, self.image_size, self.channels), np.uint8)

        def decode(item: tuple[int, int, Source]) -> None:
            row, index, source = item
            try:
                out[row] = to_pixels(source, self.image_size, self.channels)
            except UNREADABLE as err:
                raise ImageError(f"{self.name(index)}: not a readable image ({type(err).__name__}: {err})") from None

        self.pool.map(decode, list(zip(range(len(indices)), indices.tolist(), self.fetch(indices), strict=True)))
        return out

    def subset(self, indices: np.ndarray) -> ImageRecords:
        """The records at ``indices`` (sorted), as records of their own."""
        return dataclasses.replace(
            self,
            fetch=lambda i: self.fetch(indices[i]),
            name=lambda i: self.name(int(indices[i])),
            labels=self.labels[indices],
        )

    def gather(self, indices: np.ndarray) -> Batch:
        image = self.pixels(indices).astype(np.float32) * (1.0 / 127.5) - 1.0
        return {"image": image, "label": self.labels[indices]}


class FlippingIterator(ShuffledIterator):
    """A ``ShuffledIterator`` that flips each image left to right where its stream position says
    (the module docstring)."""

    def __init__(
        self, records: ImageRecords, *, batch_size: int, seed: int, process_index: int, process_count: int, name: str
    ):
        super().__init__(
            records,
            batch_size=batch_size,
            seed=seed,
            process_index=process_index,
            process_count=process_count,
            name=name,
        )
        self._flip_seed = seed
        self._rank = (process_index, process_count)
        self._flip_masks: dict[int, np.ndarray] = {}
        self._count = records.num_records

    def _flips(self, start: int, stop: int) -> np.ndarray:
        """Whether stream positions [start, stop) are flipped."""
        parts = []
        while start < stop:
            epoch, offset = divmod(start, self._count)
            if epoch not in self._flip_masks:
                self._flip_masks = {e: m for e, m in self._flip_masks.items() if e >= epoch - 1}
                rng = np.random.default_rng([self._flip_seed, FLIP_STREAM, epoch])
                self._flip_masks[epoch] = rng.random(self._count) < 0.5
            take = min(stop - start, self._count - offset)
            parts.append(self._flip_masks[epoch][offset : offset + take])
            start += take
        return np.concatenate(parts) if parts else np.zeros(0, bool)

    def next(self, batch_size: int | None = None) -> Batch:
        lo, hi = shard_bounds(self._batch_size if batch_size is None else batch_size, *self._rank)
        first = self.position + lo
        batch = super().next(batch_size)
        flip_B = self._flips(first, first + hi - lo)
        batch["image"] = np.where(flip_B[:, None, None, None], batch["image"][:, :, ::-1], batch["image"])
        return batch


@dataclasses.dataclass
class ImageDataset(RecordDataset):
    """A ``RecordDataset`` of decoded images with their class names, flipped or not."""

    class_names: tuple[str, ...] = ()
    """The name of each label, in label order."""
    flip: bool = False

    def data_fields(self) -> dict[str, object]:
        """The spec's fields that follow from the data (``dew.build.resolve`` records them in
        run.json): the class names."""
        return {"classes": self.class_names}

    def iterator(self, process_index: int = 0, process_count: int = 1) -> ShuffledIterator:
        if not self.flip:
            return super().iterator(process_index, process_count)
        assert isinstance(self.train, ImageRecords)
        return FlippingIterator(
            self.train,
            batch_size=self.batch_size,
            seed=self.seed,
            process_index=process_index,
            process_count=process_count,
            name=self.name,
        )


def held_out_by_class(labels: np.ndarray, fraction: float, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) record indices, sorted: ``round(fraction * n_c)`` of each class's ``n_c``
    records held out, chosen from seed 0 (fixed: it does not move with the run's seed)."""
    rng = np.random.default_rng(0)
    held = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        take = round(fraction * len(members))
        if take >= len(members):
            raise ValueError(
                f"data.eval_fraction={fraction} holds out all {len(members)} images of {what} class {int(label)}"
            )
        held.append(rng.choice(members, take, replace=False))
    held_out = np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)
    return np.setdiff1d(np.arange(len(labels)), held_out), held_out


def image_dataset(
    spec: ImageTransforms,
    train: ImageRecords,
    held_out: ImageRecords | None,
    names: tuple[str, ...],
    *,
    batch_size: int,
    seed: int,
    where: str,
) -> ImageDataset:
    """The dataset ``image_folder`` and ``hf_images`` both end with: every record's source checked,
    ``spec.eval_fraction`` of each class of ``train`` held out where it asks for it (``held_out``
    must then be None: ``where`` names the data in its error), and the spec's image fields."""
    for records in (train, held_out):
        if records is not None:
            check_sources(records)
    if spec.eval_fraction:
        assert held_out is None, "a split that evaluates and a fraction held out are refused before"
        kept, held = held_out_by_class(train.labels, spec.eval_fraction, where)
        train, held_out = train.subset(kept), train.subset(held)
    return ImageDataset(
        name=spec.name,
        train=train,
        held_out=held_out,
        batch_size=batch_size,
        seed=seed,
        fields={"input_size": spec.image_size, "in_channels": spec.channels, "num_classes": len(names)},
        class_names=names,
        flip=spec.flip,
    )
