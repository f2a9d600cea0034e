"""Dataset specs: the registered records a run's ``data`` field holds, one per dataset.

A spec is a plain dataclass of the dataset's own fields (declared, with their checks, in
``dew.data.fields``: the loaders read them from there); registered here with its ``load``, which
builds the dataset at the trainer's global batch size and seed, importing the loader only then. Each
spec is one option of Hydra's ``data`` group.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from dew.contract.data import DataSpec, datasets
from dew.data.fields import (
    ChatFields,
    DigitsFields,
    HFImagesFields,
    HFTextFields,
    ImageFolderFields,
    OxfordFlowers102Fields,
    TextStreamFields,
    TokenWindowsFields,
)
from dew.data.mixture_fields import MixtureFields

if TYPE_CHECKING:
    from dew.contract.data import Dataset

__all__ = [
    "Chat",
    "DataSpec",
    "Digits",
    "HFImages",
    "HFText",
    "ImageFolder",
    "Mixture",
    "OxfordFlowers102",
    "TextStream",
    "TokenWindows",
    "datasets",
]


@datasets.register("digits")
@dataclasses.dataclass(frozen=True)
class Digits(DigitsFields):
    """The 1,797 8x8 handwritten digits (10 classes) that scikit-learn ships: no network needed.

    Images are scaled to [-1, 1] with shape (8, 8, 1); a fixed, class-stratified held-out part
    evaluates.
    """

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.digits import load_digits  # heavy: grain loads only when the data is loaded

        return load_digits(self, batch_size=batch_size, seed=seed)


@datasets.register("oxford_flowers102")
@dataclasses.dataclass(frozen=True)
class OxfordFlowers102(OxfordFlowers102Fields):
    """Oxford Flowers 102 (Nilsback & Zisserman 2008): 8,189 images of 102 flower classes.

    The official archive and label files are downloaded once into ``cache_dir`` (or read from
    ``root``), verified, centre-cropped and resized to ``resolution`` and cached as uint8 arrays.
    """

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.flowers import load_flowers  # heavy: grain loads only when the data is loaded

        return load_flowers(self, batch_size=batch_size, seed=seed)


@datasets.register("token_windows")
@dataclasses.dataclass(frozen=True)
class TokenWindows(TokenWindowsFields):
    """Fixed-length windows over a file of token ids, memory-mapped and gathered once per batch."""

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.tokens import load_token_windows  # heavy: grain loads only when the data is loaded

        return load_token_windows(self, batch_size=batch_size, seed=seed)


@datasets.register("text_stream")
@dataclasses.dataclass(frozen=True)
class TextStream(TextStreamFields):
    """Text files tokenized and packed into windows on the fly: a stream with no record count.

    The files are read whole, in an order reshuffled from the run's seed on every pass, each
    followed by the end-of-text id, and packed back to back into windows of seq_len + 1 tokens
    (grain's concat-then-split). Having no record count, it has no epoch: the run's length and
    intervals must be given in steps. Its read position is grain's packing state, so it resumes.
    """

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.stream import load_text_stream  # heavy: grain loads only when the data is loaded

        return load_text_stream(self, batch_size=batch_size, seed=seed)


@datasets.register("hf_text")
@dataclasses.dataclass(frozen=True)
class HFText(HFTextFields):
    """Text from a Hugging Face dataset, tokenized and packed into windows of ``seq_len + 1``.

    The source is a directory ``Dataset.save_to_disk`` wrote, a hub name already in the local hub
    cache (read offline), or data files (.jsonl, .json, .parquet, .csv, .txt; globs allowed), read
    through the ``datasets`` library (``pip install 'dew[data]'``). Each record's ``field`` is one
    document, followed by the end-of-text id. ``mode=cache`` tokenizes the source once into the
    token files ``token_windows`` reads (the files ``dew-prepare --hf`` writes), kept under
    ``cache_dir`` by source, split, field and tokenizer; ``mode=stream`` tokenizes records as they
    are read, for data too big to cache (docs/data.md).
    """

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.hf_text import load_hf_text  # heavy: datasets and grain load only when the data is loaded

        return load_hf_text(self, batch_size=batch_size, seed=seed)


@datasets.register("mixture")
@dataclasses.dataclass(frozen=True)
class Mixture(MixtureFields):
    """Several token datasets mixed at given weights: each training sequence comes from one
    component, drawn from the run's seed and the step so that each component's share of the
    sequences follows its weight; weights may change at given steps (``stages``). Every component
    reads windows of one length with one vocabulary; each one's held-out split is evaluated on its
    own (``eval/<name>/loss``) besides the mixture's ``eval/loss`` over all of them (docs/data.md).
    """

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.mixture import load_mixture  # heavy: the components' loaders load only when the data is loaded

        return load_mixture(self, batch_size=batch_size, seed=seed)


@datasets.register("chat")
@dataclasses.dataclass(frozen=True)
class Chat(ChatFields):
    """Conversations for fine-tuning: records of chat turns (rendered by the tokenizer's chat
    template) or of a prompt and a response, each packed whole into windows with a ``loss_mask`` that
    trains the responses alone (``dew.data.chat``; ``pip install 'dew[data]'``)."""

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.chat import load_chat  # heavy: datasets and grain load only when the data is loaded

        return load_chat(self, batch_size=batch_size, seed=seed)


@datasets.register("image_folder")
@dataclasses.dataclass(frozen=True)
class ImageFolder(ImageFolderFields):
    """Images in a folder of class folders: ``root/<class>/*.{png,jpg,jpeg,webp}`` (nested folders
    within a class folder included), or Hugging Face's imagefolder layout, ``root/train/<class>/...``
    beside ``root/validation/<class>/...``. Labels are the sorted class folder names."""

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.image_folder import load_image_folder  # heavy: grain loads only when the data is loaded

        return load_image_folder(self, batch_size=batch_size, seed=seed)


@datasets.register("hf_images")
@dataclasses.dataclass(frozen=True)
class HFImages(HFImagesFields):
    """Images and labels from a Hugging Face dataset (``pip install 'dew[data]'``): a directory
    ``save_to_disk`` wrote (a Dataset or a DatasetDict), or data files (Parquet, Arrow, JSON lines,
    CSV) read by the ``datasets`` library, offline."""

    def load(self, batch_size: int, seed: int) -> Dataset:
        from dew.data.hf_images import load_hf_images  # heavy: datasets and grain load only when the data is loaded

        return load_hf_images(self, batch_size=batch_size, seed=seed)
