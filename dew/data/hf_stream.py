"""``hf_text``'s stream mode: records read through ``datasets`` streaming as the run goes, never
converted or cached whole.

Process ``p`` of ``P`` reads its own share of the records
(``datasets.distributed.split_dataset_by_node``: whole shards where their count divides by ``P``,
else every ``P``-th record), so the processes together read each record exactly once per epoch, in
the stored order every epoch; each packs its records, framed by the tokenizer's begin/end ids, back
to back into non-overlapping windows of ``seq_len + 1`` and keeps ``B / P`` of them per global
batch. The read position is, per process, the epoch, ``datasets``' own iterator state and the ids
packed but not yet in a window. With ``data.documents``, each record is packed whole instead
(``dew.data.stream.packed_documents``: grain's first-fit over the records as they are read,
``segment_ids`` and ``positions`` beside), and the position is grain's packing state: the records'
position where the windows being handed out were packed from, and how many of them were handed out.
``get_state`` gathers every process's (a ``jax`` all-gather when
there are several, at a checkpoint, where every process saves), so a resume on the same process
count continues exactly.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import grain
import numpy as np

from dew.contract.data import Batch
from dew.data.hf_sources import Source, text_of
from dew.data.packing import SAMPLED_WINDOWS, DocumentWindows, Framing, PackedTable, sampled_targets_per_record
from dew.data.pipeline import Records, padded_eval_batches, shard_bounds
from dew.data.prepare import source_documents
from dew.data.stream import packed_documents
from dew.data.tokenizer import Tokenizer, absolute_record, encode_documents
from dew.data.tokens import TokenWindowRecords

if TYPE_CHECKING:
    import datasets

    from dew.data.fields import HFTextFields

_STATE_VERSION = 1


def _gather(local: dict[str, Any], process_count: int) -> list[dict[str, Any]]:
    """Every process's ``local`` state, in process order (a collective: every process calls it)."""
    if process_count == 1:
        return [local]
    from jax.experimental import multihost_utils  # heavy: JAX only where several processes share a stream

    data = np.frombuffer(json.dumps(local).encode(), np.uint8)
    lengths = np.asarray(multihost_utils.process_allgather(np.array([len(data)], np.int64))).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)
    padded[: len(data)] = data
    every = np.asarray(multihost_utils.process_allgather(padded)).reshape(process_count, -1)
    return [json.loads(bytes(row[:n]).decode()) for row, n in zip(every, lengths)]


class RecordReader(grain.DatasetIterator):
    """One process's share of the records, each read, tokenized and framed as a document
    (``{"tokens": ids}``), epoch after epoch; grain's iterator protocol, so that grain's packer reads it
    and saves its place (``data.documents``)."""

    def __init__(
        self,
        make: Callable[[], datasets.IterableDataset],
        source: Source,
        tokenizer: Tokenizer,
        process_index: int,
    ):
        super().__init__()
        self._make, self._source, self._tokenizer = make, source, tokenizer
        self._process_index = process_index
        self._epoch = 0
        self._read = 0  # records read this epoch
        self._start(None)

    def _start(self, source_state: Mapping[str, Any] | None) -> None:
        previous = getattr(self, "_iterator", None)
        if previous is not None and hasattr(previous, "close"):
            previous.close()  # the library's readers of the last epoch (an open Parquet file, ...)
        self._records = self._make()
        if source_state is not None:
            self._records.load_state_dict(dict(source_state))
        # datasets reports a restored position only once a record is read past it: keep it till then
        self._restored = None if source_state is None else dict(source_state)
        self._iterator = iter(self._records)

    def __next__(self) -> dict[str, np.ndarray]:
        """The next record's ids, framed as a document; the next epoch begins after the last record."""
        for _ in range(2):
            try:
                record = next(self._iterator)
            except StopIteration:
                if self._read == 0:
                    raise ValueError(
                        f"{self._source}: process {self._process_index}'s share of the records is empty"
                    ) from None
                self._epoch, self._read = self._epoch + 1, 0
                self._start(None)
                continue
            self._read += 1
            self._restored = None
            return {"tokens": encode_documents(self._tokenizer, [text_of(self._source, record, self._read - 1)])[0]}
        raise AssertionError("unreachable: an epoch that ended has records")

    def get_state(self) -> dict[str, Any]:
        source = self._restored if self._restored is not None else self._records.state_dict()
        return {"epoch": self._epoch, "read": self._read, "source": copy.deepcopy(source)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._epoch, self._read = int(state["epoch"]), int(state["read"])
        self._start(state["source"])


class RecordStream:
    """The records packed back to back into non-overlapping windows of ``seq_len + 1`` ids."""

    def __init__(self, reader: RecordReader, seq_len: int):
        self._reader, self._width = reader, seq_len + 1
        self._buffer = np.zeros(0, np.int32)

    def windows(self, n: int) -> Batch:
        """The next ``n`` windows: ``tokens`` int32 ``(n, seq_len + 1)``."""
        need = n * self._width
        parts, have = [self._buffer], len(self._buffer)
        while have < need:
            ids = next(self._reader)["tokens"]
            parts.append(ids)
            have += len(ids)
        ids = np.concatenate(parts)
        self._buffer = ids[need:]
        return {"tokens": ids[:need].reshape(n, self._width)}

    def state(self) -> dict[str, Any]:
        return {**self._reader.get_state(), "buffer": self._buffer.tolist()}

    def restore(self, state: Mapping[str, Any]) -> None:
        self._reader.set_state(state)
        self._buffer = np.asarray(state["buffer"], np.int32)


class _Reading(grain.IterDataset):
    """A ``RecordReader`` as the source of a grain pipeline (iterated once)."""

    def __init__(self, reader: RecordReader):
        super().__init__()
        self._reader = reader

    def __iter__(self) -> RecordReader:
        return self._reader


class DocumentStream:
    """The records packed whole into windows (``data.documents``: ``dew.data.stream.packed_documents``,
    grain's first-fit), ``segment_ids`` and ``positions`` beside the tokens; the position is grain's
    packing state over the reader's."""

    def __init__(self, reader: RecordReader, seq_len: int, tokenizer: Tokenizer):
        self._windows = iter(packed_documents(_Reading(reader), seq_len, tokenizer))

    def windows(self, n: int) -> Batch:
        rows = [next(self._windows) for _ in range(n)]
        return {k: np.stack([r[k] for r in rows]).astype(np.int32) for k in ("tokens", "segment_ids", "positions")}

    def state(self) -> dict[str, Any]:
        return copy.deepcopy(self._windows.get_state())

    def restore(self, state: Mapping[str, Any]) -> None:
        self._windows.set_state(copy.deepcopy(dict(state)))


class StreamIterator(grain.DatasetIterator):
    """One process's part of each global batch of the stream (see the module docstring)."""

    def __init__(
        self,
        stream: RecordStream | DocumentStream,
        *,
        name: str,
        batch_size: int,
        process_index: int,
        process_count: int,
    ):
        super().__init__()
        shard_bounds(batch_size, process_index, process_count)  # fail at creation, not at next()
        self._stream, self._name = stream, name
        self._batch_size, self._process_index, self._process_count = batch_size, process_index, process_count

    def next(self, batch_size: int | None = None) -> Batch:
        """This process's rows of the next global batch of ``batch_size`` windows."""
        lo, hi = shard_bounds(
            self._batch_size if batch_size is None else batch_size, self._process_index, self._process_count
        )
        return self._stream.windows(hi - lo)

    def __next__(self) -> Batch:
        return self.next()

    def local_state(self) -> dict[str, Any]:
        """This process's read position alone."""
        return self._stream.state()

    def get_state(self) -> dict[str, Any]:
        """Every process's read position (gathered: a collective when there are several)."""
        return {
            "version": _STATE_VERSION,
            "dataset": self._name,
            "processes": _gather(self.local_state(), self._process_count),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        if state.get("dataset") != self._name or state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"iterator state {dict(state)} was not written by {self._name}'s stream iterator "
                f"(version {_STATE_VERSION})"
            )
        processes = state.get("processes")
        if not isinstance(processes, list) or len(processes) != self._process_count:
            count = len(processes) if isinstance(processes, list) else processes
            raise ValueError(
                f"the stream's position was saved by {count} processes and this run has {self._process_count}: "
                "data.mode=stream resumes on the same process count (data.mode=cache on any)"
            )
        self._stream.restore(processes[self._process_index])


@dataclasses.dataclass
class StreamedText:
    """A ``dew.contract.data.Dataset`` over the records of a source as they are read; ``num_records`` is None."""

    spec: HFTextFields
    source: Source
    val: Source | None
    tokenizer_impl: Tokenizer
    batch_size: int
    seed: int
    num_records: int | None = None
    """None: a stream has no record count."""
    resumable: bool = True
    tokens_per_record: float = dataclasses.field(init=False)
    """Tokens a record contributes to the loss (its targets that count): ``seq_len``; with
    ``data.documents``, the mean over the stream's first ``SAMPLED_WINDOWS`` windows (an estimate:
    a stream has no table to count)."""
    tokenizer: Mapping[str, object] = dataclasses.field(init=False)
    """The tokenizer record (as in a tokens.json sidecar, ``file`` absolute), for decoding samples."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1")
        self.tokens_per_record = float(self.spec.seq_len)
        self.tokenizer = absolute_record(self.tokenizer_impl)
        self._base = self.source.stream()  # a missing field fails at load, before any step
        if self.spec.documents:
            sample = self.iterator().next(SAMPLED_WINDOWS)["segment_ids"]
            self.tokens_per_record = sampled_targets_per_record(sample)
        _ = self._held_out_records  # the held-out text is read whole once: its errors too, here

    def batch_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        fields = ("tokens", "segment_ids", "positions") if self.spec.documents else ("tokens",)
        return {k: ((self.batch_size, self.spec.seq_len + 1), np.dtype(np.int32)) for k in fields}

    def model_fields(self) -> Mapping[str, object]:
        return {"vocab_size": self.tokenizer_impl.vocab_size, "seq_len": self.spec.seq_len}

    def iterator(self, process_index: int = 0, process_count: int = 1) -> StreamIterator:
        from datasets.distributed import split_dataset_by_node  # heavy: the datasets library

        def make() -> datasets.IterableDataset:
            return split_dataset_by_node(self._base, rank=process_index, world_size=process_count)

        reader = RecordReader(make, self.source, self.tokenizer_impl, process_index)
        stream: RecordStream | DocumentStream = (
            DocumentStream(reader, self.spec.seq_len, self.tokenizer_impl)
            if self.spec.documents
            else RecordStream(reader, self.spec.seq_len)
        )
        return StreamIterator(
            stream,
            name=self.spec.name,
            batch_size=self.batch_size,
            process_index=process_index,
            process_count=process_count,
        )

    @functools.cached_property
    def _held_out_records(self) -> Records | None:
        if self.val is None:
            return None
        tokens = np.concatenate(list(source_documents(self.val, self.tokenizer_impl)))
        records: Records = TokenWindowRecords([tokens], self.spec.seq_len)
        if self.spec.documents:  # each record a document packed whole, as mode=cache packs them
            framing = Framing(self.tokenizer_impl.eos_id, getattr(self.tokenizer_impl, "bos_id", None) is not None)
            records = DocumentWindows(PackedTable([tokens], self.spec.seq_len, framing))
        if records.num_records < 1:
            raise ValueError(f"{self.val}: holds no window of data.seq_len={self.spec.seq_len} + 1 tokens")
        return records

    @property
    def num_eval_records(self) -> int:
        held_out = self._held_out_records
        return 0 if held_out is None else held_out.num_records

    def eval_batches(self, process_index: int = 0, process_count: int = 1) -> Iterator[Batch]:
        """The held-out records encoded in order, as windows advancing by ``seq_len`` (as
        ``token_windows``; with ``data.documents``, packed whole as mode=cache packs them), padded
        with ``mask``."""
        held_out = self._held_out_records
        if held_out is None:
            return iter(())
        return padded_eval_batches(
            held_out, batch_size=self.batch_size, process_index=process_index, process_count=process_count
        )
