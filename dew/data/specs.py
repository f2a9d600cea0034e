"""Dataset specs: the registered records a run's ``data`` field holds, one per dataset.

A spec is a plain dataclass of the dataset's own fields; ``load`` builds the dataset at the trainer's
global batch size and seed. Each spec is one option of Hydra's ``data`` group.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar, Literal

from dew.contract.data import DataSpec, Split, datasets

if TYPE_CHECKING:
    from dew.contract.data import Dataset


@datasets.register("digits")
@dataclasses.dataclass(frozen=True)
class Digits(DataSpec):
    """The 1,797 8x8 handwritten digits (10 classes) that scikit-learn ships: no network needed.

    Images are scaled to [-1, 1] with shape (8, 8, 1); a fixed, class-stratified held-out part
    evaluates.
    """

    kind: ClassVar[str] = "image"
    eval_fraction: float = 0.1
    """Fraction of the records held out for evaluation (per class, chosen from the data seed 0)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"data.eval_fraction={self.eval_fraction} must lie in (0, 1)")

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.digits import load_digits  # heavy: grain loads only when the data is loaded

        return load_digits(self, batch_size=batch_size, seed=seed)


@datasets.register("oxford_flowers102")
@dataclasses.dataclass(frozen=True)
class OxfordFlowers102(DataSpec):
    """Oxford Flowers 102 (Nilsback & Zisserman 2008): 8,189 images of 102 flower classes.

    The official archive and label files are downloaded once into ``cache_dir`` (or read from
    ``root``), verified, centre-cropped and resized to ``resolution`` and cached as uint8 arrays.
    """

    kind: ClassVar[str] = "image"
    root: str | None = None
    """A directory that already holds 102flowers.tgz, imagelabels.mat and setid.mat: nothing is
    downloaded."""
    cache_dir: str | None = None
    """Where downloads and decoded arrays are kept; unset reads $DEW_DATA_DIR, else
    ~/.cache/dew/datasets."""
    resolution: int = 64
    """Side of the square images after centre-crop and resize, in pixels."""
    train_splits: tuple[Split, ...] = ("train", "val")
    """The setid.mat splits that train."""
    eval_split: Split = "test"
    """The setid.mat split that evaluates."""

    def __post_init__(self) -> None:
        if self.resolution < 8:
            raise ValueError(f"data.resolution={self.resolution} must be >= 8")
        if not self.train_splits:
            raise ValueError("data.train_splits must name at least one of train, val, test")
        for split in (*self.train_splits, self.eval_split):
            if split not in ("train", "val", "test"):
                raise ValueError(f"data split {split!r} must be one of train, val, test")
        if self.eval_split in self.train_splits:
            raise ValueError(
                f"data.eval_split={self.eval_split!r} is also in data.train_splits="
                f"{list(self.train_splits)}: the held-out split would be trained on"
            )

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.flowers import load_flowers  # heavy: grain loads only when the data is loaded

        return load_flowers(self, batch_size=batch_size, seed=seed)


@datasets.register("token_windows")
@dataclasses.dataclass(frozen=True)
class TokenWindows(DataSpec):
    """Fixed-length windows over a file of token ids, memory-mapped and gathered once per batch."""

    kind: ClassVar[str] = "tokens"
    path: str = ""
    """A token file, or a glob over shards (raw uint16/uint32, .npy, or llm.c .bin shards)."""
    seq_len: int = 256
    """Tokens per window (each example reads seq_len + 1 tokens for next-token targets)."""
    vocab_size: int | None = None
    """Vocabulary size (ids lie in [0, vocab_size)); unset reads it from the tokens.json sidecar
    that dew-prepare writes in the files' directory."""
    val_path: str | None = None
    """A separate validation file (or glob); exclusive with ``val_fraction``."""
    val_fraction: float = 0.0
    """Fraction of the windows (the last ones of the sorted files) held out for evaluation."""
    format: Literal["auto", "raw", "npy", "llmc"] = "auto"
    """How the files are read: auto takes .npy by its suffix, an llm.c shard by its magic
    20240520 and anything else as raw ids; the others insist on one format."""
    dtype: Literal["uint16", "uint32"] = "uint16"
    """Element type of a raw file (little-endian); .npy files and llm.c shards carry their own."""
    tokenizer: str | None = None
    """The tokenizer the ids were made with, for the vocabulary and for decoding samples: a
    ``tokenizer.json`` or a Hugging Face model directory holding one, or a tokens.json sidecar;
    unset reads the sidecar beside the files (or nothing, with ``vocab_size`` set)."""

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError(f"data.seq_len={self.seq_len} must be >= 1")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={self.val_fraction} must lie in [0, 1)")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"data.vocab_size={self.vocab_size} must be >= 1")
        if self.format not in ("auto", "raw", "npy", "llmc"):
            raise ValueError(f"data.format={self.format!r} must be one of auto, raw, npy, llmc")
        if self.dtype not in ("uint16", "uint32"):
            raise ValueError(f"data.dtype={self.dtype!r} must be uint16 or uint32")

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.tokens import load_token_windows  # heavy: grain loads only when the data is loaded

        return load_token_windows(self, batch_size=batch_size, seed=seed)


@datasets.register("text_stream")
@dataclasses.dataclass(frozen=True)
class TextStream(DataSpec):
    """Text files tokenized and packed into windows on the fly: a stream with no record count.

    The files are read whole, in an order reshuffled from the run's seed on every pass, each
    followed by the end-of-text id, and packed back to back into windows of seq_len + 1 tokens
    (grain's concat-then-split). Having no record count, it has no epoch: the run's length and
    intervals must be given in steps. Its read position is grain's packing state, so it resumes.
    """

    kind: ClassVar[str] = "tokens"
    path: str = ""
    """UTF-8 text files to train on: a path or a glob."""
    seq_len: int = 256
    """Tokens per window (each example holds seq_len + 1 tokens for next-token targets)."""
    tokenizer: str | None = None
    """What encodes the text: a tokens.json sidecar written by dew-prepare (its tokenizer), a
    ``tokenizer.json`` or a Hugging Face model directory holding one (a pretrained tokenizer); unset
    encodes UTF-8 bytes (vocabulary 257: the 256 byte values and end-of-text 256)."""
    val_path: str | None = None
    """UTF-8 text files (a path or a glob) packed once, in order, for evaluation; unset evaluates
    nothing."""

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError(f"data.seq_len={self.seq_len} must be >= 1")

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.stream import load_text_stream  # heavy: grain loads only when the data is loaded

        return load_text_stream(self, batch_size=batch_size, seed=seed)


@datasets.register("hf_text")
@dataclasses.dataclass(frozen=True)
class HFText(DataSpec):
    """Text from a Hugging Face dataset, tokenized and packed into windows of ``seq_len + 1``.

    The source is a directory ``Dataset.save_to_disk`` wrote, a hub name already in the local hub
    cache (read offline), or data files (.jsonl, .json, .parquet, .csv, .txt; globs allowed), read
    through the ``datasets`` library (``pip install 'dew[data]'``). Each record's ``field`` is one
    document, followed by the end-of-text id. ``mode=cache`` tokenizes the source once into the
    token files ``token_windows`` reads (the files ``dew-prepare --hf`` writes), kept under
    ``cache_dir`` by source, split, field and tokenizer; ``mode=stream`` tokenizes records as they
    are read, for data too big to cache (docs/data.md).
    """

    kind: ClassVar[str] = "tokens"
    path: str = ""
    """A ``save_to_disk`` directory, a hub dataset name (from the local cache: no network), or data
    files (a path or a glob)."""
    field: str = "text"
    """The column holding each record's text."""
    split: str = "train"
    """The split that trains (data files are one split, ``train``)."""
    subset: str | None = None
    """A hub dataset's configuration (``load_dataset(path, subset)``)."""
    val_split: str | None = None
    """A split of the same source held out for evaluation; exclusive with ``val_path``."""
    val_path: str | None = None
    """Data files (a path or a glob) held out for evaluation."""
    val_fraction: float = 0.0
    """mode=cache: the fraction of the windows (the last ones) held out instead."""
    seq_len: int = 256
    """Tokens per window (each example reads seq_len + 1 tokens for next-token targets)."""
    tokenizer: str | None = None
    """A tokens.json sidecar (its tokenizer, a BPE dew-prepare trained), a ``tokenizer.json`` or a
    Hugging Face model directory holding one; unset encodes UTF-8 bytes (vocabulary 257)."""
    mode: Literal["cache", "stream"] = "cache"
    """cache: tokenize once into token files and read windows from them (shuffled, every window once
    per epoch); stream: tokenize while reading, records in their stored order, each process its own
    share of them."""
    cache_dir: str | None = None
    """Where the token cache is kept; unset reads $DEW_DATA_DIR, else ~/.cache/dew/datasets."""
    format: Literal["auto", "json", "parquet", "csv", "text"] = "auto"
    """How data files are read: auto by their suffix (.jsonl and .json as json)."""

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError(f"data.seq_len={self.seq_len} must be >= 1")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction={self.val_fraction} must lie in [0, 1)")
        if self.mode not in ("cache", "stream"):
            raise ValueError(f"data.mode={self.mode!r} must be cache or stream")
        if self.format not in ("auto", "json", "parquet", "csv", "text"):
            raise ValueError(f"data.format={self.format!r} must be one of auto, json, parquet, csv, text")
        if not self.field:
            raise ValueError("data.field is empty: name the column that holds the text")
        chosen = [f for f, v in (("val_split", self.val_split), ("val_path", self.val_path)) if v]
        if self.val_fraction:
            chosen.append("val_fraction")
        if len(chosen) > 1:
            raise ValueError(f"data.{' and data.'.join(chosen)} each choose the held-out text: set one")
        if self.val_fraction and self.mode == "stream":
            raise ValueError(
                "data.val_fraction holds out windows of the cache: with data.mode=stream give data.val_split "
                "or data.val_path"
            )

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.hf_text import load_hf_text  # heavy: datasets and grain load only when the data is loaded

        return load_hf_text(self, batch_size=batch_size, seed=seed)
