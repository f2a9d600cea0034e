"""The fields of dew's dataset specs: what each dataset's loader reads, below both.

A spec (``dew.data.specs``) is one of these records registered with its ``load``, which imports the
loader (``dew.data.digits``, ``dew.data.tokens``, ...) and hands it the spec; the loader names the
spec's type from here, so a dataset's spec and its loader depend one way. Plain dataclasses, no
JAX; each field documented where it is declared.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

from dew.contract.data import DataSpec, Split


@dataclasses.dataclass(frozen=True)
class DigitsFields(DataSpec):
    """The fields of ``digits`` (``dew.data.specs.Digits``, which loads them): what its loader
    reads."""

    kind: ClassVar[str] = "image"
    eval_fraction: float = 0.1
    """Fraction of the records held out for evaluation (per class, chosen from the data seed 0)."""

    def __post_init__(self) -> None:
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"data.eval_fraction={self.eval_fraction} must lie in (0, 1)")


@dataclasses.dataclass(frozen=True)
class OxfordFlowers102Fields(DataSpec):
    """The fields of ``oxford_flowers102`` (``dew.data.specs.OxfordFlowers102``, which loads them): what its loader
    reads."""

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


@dataclasses.dataclass(frozen=True)
class TokenWindowsFields(DataSpec):
    """The fields of ``token_windows`` (``dew.data.specs.TokenWindows``, which loads them): what its loader
    reads."""

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
    documents: bool = False
    """Pack whole documents into the windows, split at the tokenizer's end-of-text id, with the
    batch fields ``segment_ids`` and ``positions``, so a causal model's attention stays within a
    document and its rotary positions count from 0 in each (docs/data.md, "Documents"). Off: the
    ids back to back, attention across the boundaries."""

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


@dataclasses.dataclass(frozen=True)
class TextStreamFields(DataSpec):
    """The fields of ``text_stream`` (``dew.data.specs.TextStream``, which loads them): what its loader
    reads."""

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
    documents: bool = False
    """Pack whole documents into the windows, each file one document, with the
    batch fields ``segment_ids`` and ``positions``, so a causal model's attention stays within a
    document and its rotary positions count from 0 in each (docs/data.md, "Documents"). Off: the
    ids back to back, attention across the boundaries."""

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError(f"data.seq_len={self.seq_len} must be >= 1")


@dataclasses.dataclass(frozen=True)
class HFTextFields(DataSpec):
    """The fields of ``hf_text`` (``dew.data.specs.HFText``, which loads them): what its loader
    reads."""

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
    documents: bool = False
    """Pack whole documents into the windows, each record one document, with the
    batch fields ``segment_ids`` and ``positions``, so a causal model's attention stays within a
    document and its rotary positions count from 0 in each (docs/data.md, "Documents"): the token
    cache's records packed once (mode=cache), or each process's records as they are read (mode=stream,
    grain's first-fit packer). Off: the ids back to back, attention across the boundaries."""

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


@dataclasses.dataclass(frozen=True)
class ChatFields(DataSpec):
    """The fields of ``chat`` (``dew.data.specs.Chat``, which loads them): what its loader reads."""

    kind: ClassVar[str] = "tokens"
    path: str = ""
    """The conversations: data files (a path or a glob: .jsonl, .json, .parquet) or a ``save_to_disk``
    directory, read through ``datasets``."""
    val_path: str | None = None
    """Conversations held out for evaluation, in the same form; unset evaluates nothing."""
    split: str = "train"
    """A ``save_to_disk`` DatasetDict's split that trains (data files are one split, ``train``)."""
    format: Literal["auto", "json", "parquet"] = "auto"
    """How data files are read: auto by their suffix (.jsonl and .json as json)."""
    style: Literal["messages", "prompt_response"] = "messages"
    """messages: each record's ``messages_field`` is a list of {role, content} turns rendered by the
    tokenizer's chat template, the assistant turns trained; prompt_response: two text fields, the
    response trained."""
    messages_field: str = "messages"
    """style=messages: the column of turns."""
    prompt_field: str = "prompt"
    """style=prompt_response: the column of prompts (no loss)."""
    response_field: str = "response"
    """style=prompt_response: the column of responses (trained)."""
    tokenizer: str | None = None
    """A Hugging Face model directory or its ``tokenizer.json`` (its ``chat_template``, beside it, renders
    style=messages), or a tokens.json sidecar; unset encodes UTF-8 bytes (prompt_response only)."""
    seq_len: int = 256
    """Tokens per window (each example holds seq_len + 1 tokens for next-token targets)."""

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError(f"data.seq_len={self.seq_len} must be >= 1")
        if self.style not in ("messages", "prompt_response"):
            raise ValueError(f"data.style={self.style!r} must be messages or prompt_response")
        if self.format not in ("auto", "json", "parquet"):
            raise ValueError(f"data.format={self.format!r} must be one of auto, json, parquet")


@dataclasses.dataclass(frozen=True)
class ImageTransforms(DataSpec):
    """The fields ``image_folder`` and ``hf_images`` share: how images are sized, flipped, labelled
    and held out (dew/data/images.py decodes them, a batch at a time, in a pool of threads)."""

    kind: ClassVar[str] = "image"
    image_size: int = 32
    """Side of the square images, in pixels: each is centre-cropped to its shorter side and resized
    (bicubic) to it."""
    channels: int = 3
    """3 reads RGB, 1 grey levels (any other mode is converted; a palette's or RGBA's alpha is dropped)."""
    flip: bool = False
    """Flip training images left to right at random (half of them), drawn from the run's seed and
    the record's stream position, so a resumed run flips as an uninterrupted one."""
    classes: tuple[str, ...] = ()
    """The class names, in label order. Empty: every class the training split holds (sorted folder
    names; a dataset's ClassLabel names, or its sorted label values). The run records the names it
    trained with in run.json, and dew-sample names its rows by them; a class the data holds and this
    does not name, or one named here the data lacks, is an error."""
    split: str = "train"
    """The split that trains: ``root/<split>/`` when the folder has one (Hugging Face's imagefolder
    layout), a split of a Hugging Face DatasetDict."""
    eval_split: str | None = None
    """The split that evaluates. Unset: ``validation`` when the data has one, else none (or
    ``eval_fraction``); named, it must exist."""
    eval_fraction: float = 0.0
    """Fraction of each class's training images held out to evaluate (a fixed choice, drawn from
    seed 0), for data without an evaluation split; 0 holds none out."""
    decode_threads: int = 0
    """Threads that decode a batch's images; 0: one per CPU core the process may use (at most 16)."""

    def __post_init__(self) -> None:
        if self.image_size < 1:
            raise ValueError(f"data.image_size={self.image_size} must be >= 1")
        if self.channels not in (1, 3):
            raise ValueError(f"data.channels={self.channels} must be 1 (grey) or 3 (RGB)")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"data.eval_fraction={self.eval_fraction} must lie in [0, 1)")
        if self.eval_fraction and self.eval_split is not None:
            raise ValueError(
                f"data.eval_fraction={self.eval_fraction} and data.eval_split={self.eval_split!r}: "
                "evaluate on a split or on a held-out fraction, not both"
            )
        if self.decode_threads < 0:
            raise ValueError(f"data.decode_threads={self.decode_threads} must be >= 0 (0: one per core)")
        if len(set(self.classes)) != len(self.classes):
            raise ValueError(f"data.classes={list(self.classes)} names a class twice")


@dataclasses.dataclass(frozen=True)
class ImageFolderFields(ImageTransforms):
    """The fields of ``image_folder`` (``dew.data.specs.ImageFolder``, which loads them): what its loader
    reads."""

    root: str = ""
    """The folder of class folders, or of split folders (``train/``, ``validation/``, ...) that hold them."""


@dataclasses.dataclass(frozen=True)
class HFImagesFields(ImageTransforms):
    """The fields of ``hf_images`` (``dew.data.specs.HFImages``, which loads them): what its loader
    reads."""

    path: str = ""
    """A ``save_to_disk`` directory, or data files: a file or a glob (.parquet, .arrow, .jsonl, .json, .csv)."""
    val_path: str | None = None
    """Data files that evaluate (a file or a glob): the ``validation`` split of ``path``'s files."""
    image_field: str = "image"
    """The column of images: an Image feature, a {bytes, path} record, encoded bytes, or a file path
    (relative to the data file's folder)."""
    label_field: str = "label"
    """The column of labels: a ClassLabel, strings (the class names) or whole numbers."""
    cache_dir: str | None = None
    """Where ``datasets`` keeps the Arrow form of data files; unset: its own ($HF_DATASETS_CACHE)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.val_path is not None and self.eval_split not in (None, "validation"):
            raise ValueError(
                f"data.val_path={self.val_path!r} is the validation split; data.eval_split={self.eval_split!r} "
                "names another"
            )
