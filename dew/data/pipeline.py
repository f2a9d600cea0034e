"""The shuffled, sharded, resumable read path every record dataset shares.

A dataset here is a set of ``Records``: ``num_records`` of them, addressed by index, and a
``gather`` that turns an int64 index array into a batch in one vectorised read (an array fancy-index
for images, ``tokens[idx[:, None] * L + arange(L + 1)]`` for token windows). The read path is
the recipe in docs/architecture.md ("data order"): shuffle the indices, batch the indices, gather once
per batch.

The training stream is a sequence of *positions* 0, 1, 2, ...; position ``q`` reads record
``order(epoch)[q % n]`` with ``epoch = q // n``, where ``order(epoch)`` is a fresh permutation of the
``n`` records drawn from ``(seed, epoch)``. A global batch of ``B`` records is the next ``B``
positions; process ``p`` of ``P`` reads positions ``[p * B/P, (p + 1) * B/P)`` of it, so the
processes' parts are disjoint and together make the global batch. The whole read position is one
integer, which makes three things exact:

- resume: ``get_state()`` is ``{"position": q, ...}``; a fresh iterator given it reads the same
  records next;
- a batch ramp: ``next(batch_size=b)`` takes the next ``b`` positions, whatever ``b`` was before;
- a different process count after a restart: the position is global, so the run continues with
  the same records in the same order, split another way.

Why not grain's own ``MapDataset.range(n).shuffle(seed).repeat().batch(B)``: its shuffle maps one
index per Python call (``index_shuffle``, measured 4-8 us per record here against about 2 us to
gather a 1,025-token window), which alone held the token pipeline near 0.5x raw NumPy indexing,
and its ``batch`` fixes the batch size, which a ramp changes. So the epoch order is one vectorised
NumPy permutation per epoch (``n`` int64 in memory: 80 MB for 10M windows), and the iterator is
a ``grain.DatasetIterator``, so grain's orbax checkpoint handlers (``grain.checkpoint.
CheckpointSave``/``CheckpointRestore``) save and restore it as they do grain's own iterators.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import grain
import numpy as np

from dew.contract.data import Batch

_STATE_VERSION = 1


class Records(Protocol):
    """Records addressed by index, read a batch at a time."""

    @property
    def num_records(self) -> int:
        """How many records there are."""
        ...

    def gather(self, indices: np.ndarray) -> Batch:
        """The records at ``indices`` (int64, any length including 0) as one batch."""
        ...


def epoch_order(num_records: int, seed: int, epoch: int) -> np.ndarray:
    """The order the records are read in during ``epoch``: a permutation drawn from (seed, epoch).

    ``np.random.default_rng([seed, epoch])`` seeds a PCG64 stream from both numbers through a
    SeedSequence, so every epoch has its own order and a run's orders depend only on its seed.
    """
    return np.random.default_rng([seed, epoch]).permutation(num_records)


def shard_bounds(batch_size: int, process_index: int, process_count: int) -> tuple[int, int]:
    """The [start, stop) rows of a global batch that process ``process_index`` reads."""
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} must lie in [0, process_count={process_count})")
    if batch_size < 1 or batch_size % process_count:
        raise ValueError(
            f"batch_size={batch_size} does not divide over {process_count} processes "
            "(every process reads an equal part of each global batch)"
        )
    per_process = batch_size // process_count
    return process_index * per_process, (process_index + 1) * per_process


class ShuffledIterator(grain.DatasetIterator):
    """One process's training stream over ``records`` (see the module docstring)."""

    def __init__(
        self, records: Records, *, batch_size: int, seed: int, process_index: int, process_count: int, name: str
    ):
        super().__init__()
        shard_bounds(batch_size, process_index, process_count)  # fail at creation, not at next()
        self._records = records
        self._batch_size = batch_size
        self._seed = seed
        self._process_index = process_index
        self._process_count = process_count
        self._name = name
        self._position = 0
        self._orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            # A batch spans at most two epochs when B <= n; keep only the ones still in use.
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = epoch_order(self._records.num_records, self._seed, epoch)
        return self._orders[epoch]

    def _indices(self, start: int, stop: int) -> np.ndarray:
        """Record indices of stream positions [start, stop), vectorised per epoch touched."""
        n = self._records.num_records
        parts = []
        while start < stop:
            epoch, offset = divmod(start, n)
            take = min(stop - start, n - offset)
            parts.append(self._order(epoch)[offset : offset + take])
            start += take
        return np.concatenate(parts) if len(parts) != 1 else parts[0]

    def next(self, batch_size: int | None = None) -> Batch:
        """This process's part of the next global batch of ``batch_size`` records (the dataset's
        own batch size when None)."""
        size = self._batch_size if batch_size is None else batch_size
        lo, hi = shard_bounds(size, self._process_index, self._process_count)
        indices = self._indices(self._position + lo, self._position + hi)
        self._position += size
        return self._records.gather(indices)

    def __next__(self) -> Batch:
        return self.next()

    @property
    def position(self) -> int:
        """Records of the global stream read so far, over every process."""
        return self._position

    def get_state(self) -> dict[str, Any]:
        """The read position as a JSON-safe record. It is global (the same on every process)."""
        return {
            "version": _STATE_VERSION,
            "dataset": self._name,
            "position": self._position,
            "num_records": self._records.num_records,
            "seed": self._seed,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue from a position ``get_state`` returned, refusing one from other data."""
        expected = {
            "version": _STATE_VERSION,
            "dataset": self._name,
            "num_records": self._records.num_records,
            "seed": self._seed,
        }
        for key, value in expected.items():
            if key not in state:
                raise ValueError(
                    f"iterator state {dict(state)} lacks {key!r}; expected a record that {self._name}'s get_state wrote"
                )
            if state[key] != value:
                raise ValueError(
                    f"iterator state has {key}={state[key]!r} but this dataset has "
                    f"{key}={value!r}: the checkpoint was taken over other data"
                )
        position = state.get("position")
        if not isinstance(position, int) or position < 0:
            raise ValueError(f"iterator state position={position!r} must be an int >= 0")
        self._position = position


def padded_eval_batches(
    records: Records, *, batch_size: int, process_index: int, process_count: int
) -> Iterator[Batch]:
    """One pass over ``records`` in index order, as full global batches of ``batch_size``.

    The last global batch is filled by repeating record 0 with ``mask`` 0, so every batch has one
    shape and one compiled evaluation step serves them all.
    """
    lo, hi = shard_bounds(batch_size, process_index, process_count)
    n = records.num_records
    for start in range(0, n, batch_size):
        positions = np.arange(start + lo, start + hi, dtype=np.int64)
        real = positions < n
        batch = records.gather(np.where(real, positions, 0))
        batch["mask"] = real.astype(np.float32)
        yield batch


@dataclasses.dataclass
class RecordDataset:
    """A ``dew.contract.data.Dataset`` over ``Records``: the training and held-out records, with the
    fields of the model that follow from them.

    ``name`` is the registered dataset name (it goes into the iterator state, so a checkpoint of one
    dataset does not silently resume another).
    """

    name: str
    train: Records
    held_out: Records | None
    batch_size: int
    seed: int
    fields: Mapping[str, object]
    """What ``model_fields`` returns."""
    resumable: bool = dataclasses.field(default=True, init=False)
    num_records: int | None = dataclasses.field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1")
        if self.train.num_records < 1:
            raise ValueError(f"{self.name}: the training split holds no records")
        self.num_records = self.train.num_records

    @property
    def num_eval_records(self) -> int:
        """Records in the held-out split (0 when there is none: then eval_batches yields none)."""
        return 0 if self.held_out is None else self.held_out.num_records

    def batch_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape (global batch first) and dtype of each field of a training batch."""
        empty = self.train.gather(np.zeros(0, np.int64))
        return {k: ((self.batch_size, *v.shape[1:]), v.dtype) for k, v in empty.items()}

    def model_fields(self) -> Mapping[str, object]:
        """Model fields that follow from the data."""
        return dict(self.fields)

    def iterator(self, process_index: int = 0, process_count: int = 1) -> ShuffledIterator:
        """A fresh training stream at the first record for process ``process_index``."""
        return ShuffledIterator(
            self.train,
            batch_size=self.batch_size,
            seed=self.seed,
            process_index=process_index,
            process_count=process_count,
            name=self.name,
        )

    def eval_batches(self, process_index: int = 0, process_count: int = 1) -> Iterator[Batch]:
        """One pass over the held-out split in a fixed order, padded with ``mask`` (see
        ``padded_eval_batches``); nothing when the dataset holds none out."""
        if self.held_out is None:
            return iter(())
        return padded_eval_batches(
            self.held_out, batch_size=self.batch_size, process_index=process_index, process_count=process_count
        )


@dataclasses.dataclass(frozen=True)
class ArrayRecords:
    """Records stored as arrays (in memory or memory-mapped) that share their first axis.

    ``subset`` (sorted row numbers) makes a split of the arrays without copying them: record ``i``
    is row ``subset[i]``, so a memory-mapped cache stays on disk. ``decode`` turns the gathered raw
    arrays into the batch the model sees (uint8 pixels to float32 in [-1, 1], say), so a cache
    stays compact and the conversion runs once per batch.
    """

    arrays: Mapping[str, np.ndarray]
    decode: Callable[[Batch], Batch] = dict
    subset: np.ndarray | None = None

    def __post_init__(self) -> None:
        lengths = {k: len(v) for k, v in self.arrays.items()}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"record arrays disagree on their record count: {lengths}")

    @property
    def num_records(self) -> int:
        if self.subset is not None:
            return len(self.subset)
        return len(next(iter(self.arrays.values())))

    def gather(self, indices: np.ndarray) -> Batch:
        rows = indices if self.subset is None else self.subset[indices]
        return self.decode({k: np.asarray(v[rows]) for k, v in self.arrays.items()})
