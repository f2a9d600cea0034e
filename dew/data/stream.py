"""``text_stream``: text files tokenized and packed into windows as they are read.

A stream has no record count, so a run over it counts in steps (``trainer.epochs`` and
``"epoch"`` intervals raise in ``dew.contract.config``). The pipeline is grain's, end to end::

    MapDataset.source(files).shuffle(seed).repeat()     # a new file order every pass
      .to_iter_dataset().map(encode + end-of-text)      # one document per file
      -> ConcatThenSplitIterDataset(tokens: L + 1)      # packed back to back, split into windows

(with ``data.documents``, each file a document, cut into pieces of at most ``seq_len + 1`` and packed
whole by grain's ``FirstFitPackIterDataset``, ``segment_ids`` and ``positions`` beside the tokens:
``dew.data.packing``), so the read position is grain's own iterator state (the file index and the unread rest of the
packing buffer), JSON-safe, and the stream resumes exactly. Windows do not overlap (each holds
``seq_len + 1`` tokens; inputs ``[:, :-1]``, targets ``[:, 1:]``).

Every process runs the same stream and keeps its rows of each global batch, as the record
datasets do, so a global batch does not depend on the process count; the tokenization is repeated
on every process, which is cheap next to a training step for text of this kind.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import grain
import numpy as np

from dew.contract.data import Batch
from dew.data.packing import (
    OPEN_WINDOWS,
    SAMPLED_WINDOWS,
    DocumentWindows,
    Framing,
    PackedTable,
    pieces,
    sampled_targets_per_record,
)
from dew.data.pipeline import Records, padded_eval_batches, shard_bounds
from dew.data.token_files import expand
from dew.data.tokenizer import Tokenizer, absolute_record, document, load_tokenizer
from dew.data.tokens import TokenWindowRecords

if TYPE_CHECKING:
    from dew.data.fields import TextStreamFields


_STATE_VERSION = 1
# Read files on the calling thread: grain's default 16 prefetch threads cost seconds of start-up on
# a few cores, and reading a file is not what bounds a stream of this size.
_READ = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        try:
            return f.read()
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e})") from e


def _encode_document(tokenizer: Tokenizer, path: str) -> np.ndarray:
    return document(tokenizer, tokenizer.encode(_read(path)))


class _Pieces(grain.experimental.FlatMapTransform):
    """A document's pieces of at most ``seq_len + 1`` tokens (``dew.data.packing.pieces``)."""

    max_fan_out = 1 << 30  # a file is one document, of any length (the iterator does not cap it)

    def __init__(self, seq_len: int):
        self._seq_len = seq_len

    def flat_map(self, element: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        return [{"tokens": p} for p in pieces(element["tokens"], self._seq_len) if len(p) >= 2]


def packed_documents(documents: grain.IterDataset, seq_len: int, tokenizer: Tokenizer) -> grain.IterDataset:
    """``documents`` (``{"tokens": ids}``, each framed by ``dew.data.tokenizer.document``) packed whole into
    windows of ``seq_len + 1`` (``dew.data.packing``): one longer than a window in pieces, then grain's
    first-fit over ``OPEN_WINDOWS`` windows, ``segment_ids`` and ``positions`` beside the tokens. Without
    a begin-of-text id, a document starts with the end-of-text id, as the sampler does. Its state is
    grain's: the source's position where the windows being handed out began, and how many were."""
    start = np.array([] if getattr(tokenizer, "bos_id", None) is not None else [tokenizer.eos_id], np.int32)
    framed = documents.map(lambda d: {"tokens": np.concatenate([start, d["tokens"]])})
    packed = grain.experimental.FirstFitPackIterDataset(
        grain.experimental.FlatMapIterDataset(framed, _Pieces(seq_len)),
        length_struct={"tokens": seq_len + 1},
        num_packing_bins=OPEN_WINDOWS,
        shuffle_bins=False,
        padding_struct={"tokens": tokenizer.eos_id},
    )
    return packed.map(
        lambda w: {"tokens": w["tokens"], "segment_ids": w["tokens_segment_ids"], "positions": w["tokens_positions"]}
    )


class StreamIterator(grain.DatasetIterator):
    """One process's part of the packed stream; its state is grain's packing iterator state."""

    def __init__(
        self, windows: grain.IterDataset, *, name: str, batch_size: int, process_index: int, process_count: int
    ):
        super().__init__()
        self._name = name  # the dataset's registered name, which its state carries
        shard_bounds(batch_size, process_index, process_count)
        self._windows = iter(windows)
        self._batch_size = batch_size
        self._process_index = process_index
        self._process_count = process_count

    def next(self, batch_size: int | None = None) -> Batch:
        """This process's rows of the next global batch of ``batch_size`` windows."""
        size = self._batch_size if batch_size is None else batch_size
        lo, hi = shard_bounds(size, self._process_index, self._process_count)
        rows = [next(self._windows) for _ in range(size)][lo:hi]
        return {k: np.stack([r[k] for r in rows]).astype(np.int32) for k in rows[0]}

    def __next__(self) -> Batch:
        return self.next()

    def get_state(self) -> dict[str, Any]:
        return {"version": _STATE_VERSION, "dataset": self._name, "grain": self._windows.get_state()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if state.get("dataset") != self._name or state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"iterator state {dict(state)} was not written by {self._name}'s iterator (version {_STATE_VERSION})"
            )
        self._windows.set_state(state["grain"])


@dataclasses.dataclass
class StreamDataset:
    """A ``dew.contract.data.Dataset`` over packed text; ``num_records`` is None."""

    spec: TextStreamFields
    files: list[str]
    val_files: list[str]
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
    """The tokenizer record (as in a tokens.json sidecar), for decoding samples."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1")
        self.tokens_per_record = float(self.spec.seq_len)
        self.tokenizer = absolute_record(self.tokenizer_impl)
        if self.spec.documents:
            sample = self.iterator().next(SAMPLED_WINDOWS)["segment_ids"]
            self.tokens_per_record = sampled_targets_per_record(sample)

    def _windows(self) -> grain.IterDataset:
        tok, files, width = self.tokenizer_impl, self.files, self.spec.seq_len + 1
        documents = (
            grain.MapDataset.source(files)
            .shuffle(seed=self.seed % 2**32)
            .repeat()
            .to_iter_dataset(_READ)
            .map(lambda path: {"tokens": _encode_document(tok, path)})
        )
        if not self.spec.documents:
            return grain.experimental.ConcatThenSplitIterDataset(documents, length_struct={"tokens": width})
        return packed_documents(documents, self.spec.seq_len, tok)

    def batch_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        fields = ("tokens", "segment_ids", "positions") if self.spec.documents else ("tokens",)
        return {k: ((self.batch_size, self.spec.seq_len + 1), np.dtype(np.int32)) for k in fields}

    def model_fields(self) -> Mapping[str, object]:
        return {"vocab_size": self.tokenizer_impl.vocab_size, "seq_len": self.spec.seq_len}

    def iterator(self, process_index: int = 0, process_count: int = 1) -> StreamIterator:
        return StreamIterator(
            self._windows(),
            name=self.spec.name,
            batch_size=self.batch_size,
            process_index=process_index,
            process_count=process_count,
        )

    @functools.cached_property
    def _held_out_records(self) -> Records | None:
        if not self.val_files:
            return None
        tokens = np.concatenate([_encode_document(self.tokenizer_impl, p) for p in self.val_files])
        if self.spec.documents:
            framing = Framing(self.tokenizer_impl.eos_id, getattr(self.tokenizer_impl, "bos_id", None) is not None)
            return DocumentWindows(PackedTable([tokens], self.spec.seq_len, framing))
        return TokenWindowRecords([tokens], self.spec.seq_len)

    @property
    def num_eval_records(self) -> int:
        held_out = self._held_out_records
        return 0 if held_out is None else held_out.num_records

    def eval_batches(self, process_index: int = 0, process_count: int = 1) -> Iterator[Batch]:
        """The validation files encoded in sorted order, as windows advancing by ``seq_len`` (as
        ``token_windows``), padded with ``mask``; nothing without ``data.val_path``."""
        held_out = self._held_out_records
        if held_out is None:
            return iter(())
        return padded_eval_batches(
            held_out, batch_size=self.batch_size, process_index=process_index, process_count=process_count
        )


def load_text_stream(spec: TextStreamFields, batch_size: int, seed: int) -> StreamDataset:
    """The packed text stream of ``spec.path`` at global batch ``batch_size``, file order
    shuffled from ``seed``."""
    files = expand(spec.path, "data.path")
    val_files = expand(spec.val_path, "data.val_path") if spec.val_path else []
    tokenizer = load_tokenizer(spec.tokenizer, "data.tokenizer")
    return StreamDataset(spec, files, val_files, tokenizer, batch_size, seed)
