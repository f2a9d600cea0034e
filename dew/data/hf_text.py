"""``hf_text``: text from a Hugging Face dataset, tokenized and packed into windows of ``seq_len + 1``.

Two modes (``data.mode``):

- **cache** (the default): the source is tokenized once into the token files ``token_windows``
  reads (``train.bin``, ``val.bin``, ``tokens.json`` and the tokenizer's files), written by
  ``dew-prepare``'s own code (``dew.data.prepare.write_token_dir``), in
  ``<cache>/hf_text/<key>/``. The key is a digest of the source (its files' paths, sizes and
  modification times, or a hub dataset's fingerprint), the split, the field and the tokenizer (its
  record and the bytes of its files): another run, another process or ``seq_len`` reads the same
  cache. One process builds it while the others wait on the lock beside it
  (``dew.contract.lock.RunLock``); it is written under a temporary name and renamed into place whole,
  and one that does not read back whole (a sidecar missing or from another key, a shard whose size
  disagrees with its header) is built again, never half-read. Then it is ``token_windows``: windows
  advancing by ``seq_len`` over the cached ids, shuffled per epoch, every window once per epoch,
  sharded and resumed by one global position (``dew.data.pipeline``).
- **stream**: records are read through ``datasets`` streaming as the run goes, never converted or
  cached whole. Process ``p`` of ``P`` reads its own share of the records
  (``datasets.distributed.split_dataset_by_node``: whole shards where they divide, else every
  ``P``-th record), so the processes together read each record exactly once per epoch, in the
  stored order every epoch; each packs its records, framed by the tokenizer's begin/end ids, back to
  back into non-overlapping windows of ``seq_len + 1`` and keeps ``B / P`` of them per global batch.
  The read position is, per process, the epoch, ``datasets``' own iterator state and the ids packed
  but not yet in a window; ``get_state`` gathers every process's (a ``jax`` all-gather when there are
  several, at a checkpoint, where every process saves), so a resume on the same process count
  continues exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import grain
import numpy as np

from dew.contract.data import Batch
from dew.contract.lock import RunLock, RunLockedError
from dew.data.hf_sources import Source, resolve, text_of
from dew.data.pipeline import padded_eval_batches, shard_bounds
from dew.data.prepare import source_documents, write_token_dir
from dew.data.token_files import SIDECAR, open_tokens, read_sidecar
from dew.data.tokenizer import ByteTokenizer, Tokenizer, absolute_record, encode_documents, load_tokenizer
from dew.data.tokens import TokenDataset, TokenWindowRecords

if TYPE_CHECKING:
    import datasets

    from dew.data.specs import HFText  # its load() imports this module

log = logging.getLogger("dew")

CACHE_VERSION = 1
"""Part of every cache key: a change of what a cache holds makes new ones."""
_STATE_VERSION = 1
_WAIT_S = 0.1


# ------------------------------------------------------------------------------ the token cache


def cache_root(spec: HFText) -> str:
    """``<cache>/hf_text``: ``data.cache_dir``, else ``$DEW_DATA_DIR``, else ``~/.cache/dew/datasets``."""
    base = spec.cache_dir or os.environ.get("DEW_DATA_DIR") or "~/.cache/dew/datasets"
    return os.path.join(os.path.expanduser(base), "hf_text")


def tokenizer_identity(tokenizer: Tokenizer) -> dict[str, object]:
    """The tokenizer's record and a digest of its files' bytes: a retrained tokenizer keys a new cache."""
    record: dict[str, object] = tokenizer.record()
    if not isinstance(tokenizer, ByteTokenizer):
        with open(tokenizer.file, "rb") as f:
            record["sha256"] = hashlib.sha256(f.read()).hexdigest()
    return record


def cache_key(spec: HFText, tokenizer: Tokenizer, train: Source, val: Source | None) -> str:
    """The digest that names a cache: what it was built from, and how."""
    described = {
        "version": CACHE_VERSION,
        "field": spec.field,
        "train": train.identity(),
        "val": None if val is None else val.identity(),
        "tokenizer": tokenizer_identity(tokenizer),
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:24]


def intact(directory: str, key: str) -> bool:
    """Whether ``directory`` holds a whole cache of ``key``: its sidecar names the key, and every
    shard it lists opens (the header agrees with the size) with the count it lists."""
    try:
        with open(os.path.join(directory, SIDECAR)) as f:
            record = json.load(f)
        if record.get("key") != key:
            return False
        for name, info in record["files"].items():
            if len(open_tokens(os.path.join(directory, name), "llmc")) != info["tokens"]:
                return False
        return True
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def build_cache(directory: str, key: str, tokenizer: Tokenizer, train: Source, val: Source | None) -> None:
    """Tokenize ``train`` (and ``val``) into ``directory``: written under a temporary name, renamed into
    place whole; a damaged cache there is set aside and removed first."""
    tmp = f"{directory}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    parts = {"train.bin": source_documents(train, tokenizer)}
    sources: dict[str, object] = {"train.bin": str(train)}
    if val is not None:
        parts["val.bin"], sources["val.bin"] = source_documents(val, tokenizer), str(val)
    try:
        write_token_dir(tmp, tokenizer, parts, sources, {"key": key})
        if os.path.exists(directory):
            aside = f"{directory}.damaged-{uuid.uuid4().hex[:8]}"
            log.warning("%s: the token cache does not read back whole; building it again", directory)
            os.replace(directory, aside)
            shutil.rmtree(aside, ignore_errors=True)
        os.replace(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cached_tokens(spec: HFText, tokenizer: Tokenizer, train: Source, val: Source | None) -> str:
    """The directory of the token cache of ``spec``'s source: found whole, or built by this process
    under the cache's lock while any other waits for it."""
    key = cache_key(spec, tokenizer, train, val)
    directory = os.path.join(cache_root(spec), key)
    said = False
    while not intact(directory, key):
        try:
            lock = RunLock(f"{directory}.lock").acquire()
        except RunLockedError:
            if not said:
                log.info("%s: another process is building the token cache; waiting for it", directory)
                said = True
            time.sleep(_WAIT_S)
            continue
        try:
            if not intact(directory, key):
                log.info("%s: tokenizing %s into the token cache", directory, train)
                build_cache(directory, key, tokenizer, train, val)
        finally:
            lock.release()
    return directory


# ------------------------------------------------------------------------------ streaming


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


class RecordStream:
    """One process's share of the records, tokenized and packed into windows as they are read."""

    def __init__(
        self,
        make: Callable[[], datasets.IterableDataset],
        source: Source,
        tokenizer: Tokenizer,
        seq_len: int,
        process_index: int,
    ):
        self._make, self._source, self._tokenizer = make, source, tokenizer
        self._width, self._process_index = seq_len + 1, process_index
        self._epoch = 0
        self._read = 0  # records read this epoch
        self._buffer = np.zeros(0, np.int32)
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

    def _pull(self) -> np.ndarray:
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
            return encode_documents(self._tokenizer, [text_of(self._source, record, self._read - 1)])[0]
        raise AssertionError("unreachable: an epoch that ended has records")

    def windows(self, n: int) -> np.ndarray:
        """The next ``n`` windows of ``seq_len + 1`` ids, int32 ``(n, seq_len + 1)``."""
        need = n * self._width
        parts, have = [self._buffer], len(self._buffer)
        while have < need:
            ids = self._pull()
            parts.append(ids)
            have += len(ids)
        ids = np.concatenate(parts)
        self._buffer = ids[need:]
        return ids[:need].reshape(n, self._width)

    def state(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "read": self._read,
            "source": self._restored if self._restored is not None else self._records.state_dict(),
            "buffer": self._buffer.tolist(),
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        self._epoch, self._read = int(state["epoch"]), int(state["read"])
        self._buffer = np.asarray(state["buffer"], np.int32)
        self._start(state["source"])


class StreamIterator(grain.DatasetIterator):
    """One process's part of each global batch of the stream (see the module docstring)."""

    def __init__(self, stream: RecordStream, *, name: str, batch_size: int, process_index: int, process_count: int):
        super().__init__()
        shard_bounds(batch_size, process_index, process_count)  # fail at creation, not at next()
        self._stream, self._name = stream, name
        self._batch_size, self._process_index, self._process_count = batch_size, process_index, process_count

    def next(self, batch_size: int | None = None) -> Batch:
        """This process's rows of the next global batch of ``batch_size`` windows."""
        lo, hi = shard_bounds(
            self._batch_size if batch_size is None else batch_size, self._process_index, self._process_count
        )
        return {"tokens": self._stream.windows(hi - lo)}

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

    spec: HFText
    source: Source
    val: Source | None
    tokenizer_impl: Tokenizer
    batch_size: int
    seed: int
    num_records: int | None = None
    """None: a stream has no record count."""
    resumable: bool = True
    tokens_per_record: int = dataclasses.field(init=False)
    """Tokens a record contributes to the loss: ``seq_len``."""
    tokenizer: Mapping[str, object] = dataclasses.field(init=False)
    """The tokenizer record (as in a tokens.json sidecar, ``file`` absolute), for decoding samples."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1")
        self.tokens_per_record = self.spec.seq_len
        self.tokenizer = absolute_record(self.tokenizer_impl)
        self._base = self.source.stream()  # a missing field fails at load, before any step
        _ = self._held_out_records  # the held-out text is read whole once: its errors too, here

    def batch_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        return {"tokens": ((self.batch_size, self.spec.seq_len + 1), np.dtype(np.int32))}

    def model_fields(self) -> Mapping[str, object]:
        return {"vocab_size": self.tokenizer_impl.vocab_size, "seq_len": self.spec.seq_len}

    def iterator(self, process_index: int = 0, process_count: int = 1) -> StreamIterator:
        from datasets.distributed import split_dataset_by_node  # heavy: the datasets library

        def make() -> datasets.IterableDataset:
            return split_dataset_by_node(self._base, rank=process_index, world_size=process_count)

        stream = RecordStream(make, self.source, self.tokenizer_impl, self.spec.seq_len, process_index)
        return StreamIterator(
            stream,
            name=self.spec.name,
            batch_size=self.batch_size,
            process_index=process_index,
            process_count=process_count,
        )

    @functools.cached_property
    def _held_out_records(self) -> TokenWindowRecords | None:
        if self.val is None:
            return None
        tokens = np.concatenate(list(source_documents(self.val, self.tokenizer_impl)))
        records = TokenWindowRecords([tokens], self.spec.seq_len)
        if records.num_records < 1:
            raise ValueError(f"{self.val}: holds no window of data.seq_len={self.spec.seq_len} + 1 tokens")
        return records

    @property
    def num_eval_records(self) -> int:
        held_out = self._held_out_records
        return 0 if held_out is None else held_out.num_records

    def eval_batches(self, process_index: int = 0, process_count: int = 1) -> Iterator[Batch]:
        """The held-out records encoded in order, as windows advancing by ``seq_len`` (as
        ``token_windows``), padded with ``mask``."""
        held_out = self._held_out_records
        if held_out is None:
            return iter(())
        return padded_eval_batches(
            held_out, batch_size=self.batch_size, process_index=process_index, process_count=process_count
        )


# ------------------------------------------------------------------------------ loading


def sources(spec: HFText) -> tuple[Source, Source | None]:
    """The split that trains and the held-out one (None without ``val_split``/``val_path``)."""
    train = resolve(spec.path, split=spec.split, field=spec.field, subset=spec.subset, fmt=spec.format)
    val = None
    if spec.val_split:
        val = resolve(spec.path, split=spec.val_split, field=spec.field, subset=spec.subset, fmt=spec.format)
    elif spec.val_path:
        val = resolve(spec.val_path, field=spec.field, fmt=spec.format, what="data.val_path")
    return train, val


def cached_windows(spec: HFText, directory: str, batch_size: int, seed: int) -> TokenDataset:
    """``token_windows`` over the cache in ``directory``: the held-out windows those of ``val.bin``, or
    the last ``val_fraction`` of ``train.bin``'s."""
    sidecar = read_sidecar([os.path.join(directory, "train.bin")])
    train_ids = open_tokens(os.path.join(directory, "train.bin"), "llmc")
    everything = TokenWindowRecords([train_ids], spec.seq_len)
    train, held_out = everything, None
    if "val.bin" in sidecar["files"]:
        held_out = TokenWindowRecords([open_tokens(os.path.join(directory, "val.bin"), "llmc")], spec.seq_len)
    elif spec.val_fraction:
        n_val = math.ceil(spec.val_fraction * everything.total_windows)
        train = TokenWindowRecords([train_ids], spec.seq_len, 0, everything.total_windows - n_val)
        held_out = TokenWindowRecords([train_ids], spec.seq_len, train.num_records, n_val)
    for split, records in (("training", train), ("held-out", held_out)):
        if records is not None and records.num_records < 1:
            raise ValueError(
                f"data.path={spec.path!r}: the {split} text holds no window of data.seq_len={spec.seq_len} + 1 tokens "
                f"({len(train_ids)} tokens in all)"
            )
    return TokenDataset(
        name=spec.name,
        train=train,
        held_out=held_out,
        batch_size=batch_size,
        seed=seed,
        fields={"vocab_size": sidecar["vocab_size"], "seq_len": spec.seq_len},
        tokens_per_record=spec.seq_len,
        tokenizer=sidecar["tokenizer"],
    )


def load_hf_text(spec: HFText, batch_size: int, seed: int) -> TokenDataset | StreamedText:
    """``spec``'s text at global batch ``batch_size``: windows over its token cache, or the stream."""
    tokenizer = load_tokenizer(spec.tokenizer, "data.tokenizer")
    train, val = sources(spec)
    if spec.mode == "stream":
        return StreamedText(spec, train, val, tokenizer, batch_size, seed)
    return cached_windows(spec, cached_tokens(spec, tokenizer, train, val), batch_size, seed)
