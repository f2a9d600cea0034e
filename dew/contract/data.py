"""The dataset contract: ``Dataset`` (what the trainer and the objectives use) and the registry of
``DataSpec``, the record each registered dataset subclasses.

A ``Dataset`` is loaded at the run's global batch size and seed. Its iterator hands each process
its own disjoint part of every global batch, as NumPy arrays keyed by field (``image``, ``label``,
``tokens``, ...), and can save and restore its read position where ``resumable`` says so.

A dataset spec is a plain dataclass of the dataset's own fields (the run's ``data`` field holds one,
and each is one option of Hydra's ``data`` group); ``load`` builds the dataset at the trainer's global
batch size and seed, importing its pipeline only then. dew's own specs are in ``dew.data.specs``;
this module imports nothing from dew but the contract package, and no JAX.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

from dew.contract.registry import Registry

if TYPE_CHECKING:
    import numpy as np

Split = Literal["train", "val", "test"]


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """Base of the dataset specs; ``name`` is the name it is registered under
    (``@datasets.register``)."""

    name: ClassVar[str]
    kind: ClassVar[str]
    """What its batches hold, which decides the objectives that train on it: ``image`` (an
    ``image`` field, NHWC in [-1, 1], and a ``label``) or ``tokens`` (a ``tokens`` field)."""

    def load(self, batch_size: int, seed: int) -> Dataset:
        """Build the dataset at global batch ``batch_size``, shuffled from ``seed``."""
        raise NotImplementedError(f"{type(self).__name__} must implement load")


datasets: Registry[type[DataSpec]] = Registry("dataset", builtins=("dew.data.specs",))
"""Dataset name -> spec class."""


Batch = dict[str, "np.ndarray"]
"""One process's part of a batch: NumPy arrays keyed by field (``image``, ``label``, ``tokens``, ...)."""


@runtime_checkable
class BatchIterator(Protocol):
    """The training stream of one process."""

    def next(self, batch_size: int | None = None) -> Batch:
        """This process's part of the next global batch of ``batch_size`` records (the dataset's own
        batch size when None: a batch ramp asks for each stage's size without losing its place)."""
        ...

    def get_state(self) -> Mapping[str, Any]:
        """The read position, as a JSON-safe record (only where the dataset is resumable)."""
        ...

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue from a position ``get_state`` returned."""
        ...


@runtime_checkable
class Dataset(Protocol):
    """A registered dataset, loaded for one run."""

    batch_size: int
    """The global batch it was loaded at."""
    num_records: int | None
    """Training records, or None for a stream (then "epoch" means nothing)."""
    resumable: bool
    """Whether the iterator can report and restore a read position."""
    seed: int
    """The run's seed, which the shuffle is drawn from."""

    def batch_spec(self) -> Mapping[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape (with the global batch first) and dtype of each field of a batch."""
        ...

    def model_fields(self) -> Mapping[str, object]:
        """Model fields that follow from the data (image size, channels, classes, vocabulary...)."""
        ...

    def iterator(self, process_index: int = 0, process_count: int = 1) -> BatchIterator:
        """A fresh training stream at the first record for process ``process_index``."""
        ...

    def eval_batches(self, process_index: int = 0, process_count: int = 1) -> Iterator[Batch]:
        """One pass over the held-out split, in a fixed order. Every batch has the dataset's batch
        size (this process's part of it), so one compiled evaluation step serves them all; each
        carries a float32 ``mask`` field, 1 for a real record and 0 for the padding that fills the
        last batch."""
        ...


@runtime_checkable
class SourcedDataset(Protocol):
    """A dataset whose held-out data comes from named sources (``mixture``'s components), each
    evaluated on its own: the trainer reports ``eval/<source>/loss`` (and each value beside it) for
    every source, besides the values over all of them (``eval_batches``, the sources one after the
    other)."""

    eval_sources: tuple[str, ...]
    """The sources that hold data out, in the order ``eval_batches`` reads them."""

    def source_eval_batches(self, process_index: int = 0, process_count: int = 1) -> Mapping[str, Iterator[Batch]]:
        """Each source's held-out pass by name, as ``eval_batches`` gives it (padded, with ``mask``)."""
        ...


def eval_sources(dataset: object) -> tuple[str, ...]:
    """The named held-out sources of ``dataset`` (none for a dataset of one source)."""
    return tuple(dataset.eval_sources) if isinstance(dataset, SourcedDataset) else ()


def whole(value: object, what: str) -> int:
    """``value`` (one of ``Dataset.model_fields``, say) as an int; a ValueError naming ``what`` when it
    is not a whole number (a numpy integer is one)."""
    if isinstance(value, numbers.Integral):
        return int(value)
    raise ValueError(f"{what}={value!r} is not a whole number")
