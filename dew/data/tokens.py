"""``token_windows``: fixed-length windows over memory-mapped token files.

Record ``i`` of a file is the window ``tokens[i * L : i * L + L + 1]`` (``L = data.seq_len``): the
batch field ``tokens`` is int32 of shape ``(B, L + 1)``, the inputs are ``[:, :-1]`` and the
next-token targets ``[:, 1:]``. Windows advance by ``L``, so consecutive windows share their edge
token (each token is a target once) and a file of ``T`` tokens holds ``(T - 1) // L`` windows.
Windows never cross from one shard into the next. A batch is read with one vectorised gather per
shard it touches (``tokens[idx[:, None] * L + arange(L + 1)]``), never one Python call per window.

With ``data.documents``, windows hold whole documents instead, with ``segment_ids`` and
``positions`` beside the tokens (``dew.data.packing``).

The held-out windows are those of ``data.val_path`` or, with ``data.val_fraction``, the last
``ceil(val_fraction * windows)`` windows of the (sorted) files; the training windows are the rest.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from dew.contract.data import Batch
from dew.data.packing import DocumentWindows, Framing, PackedTable, targets_per_record
from dew.data.pipeline import RecordDataset, Records
from dew.data.token_files import (
    MAKE_TOKENS,
    check_vocabulary,
    expand,
    open_tokens,
    read_sidecar,
    refuse_other_sidecars,
)
from dew.data.tokenizer import absolute_record, load_tokenizer

if TYPE_CHECKING:
    from dew.data.fields import TokenWindowsFields


@dataclasses.dataclass(frozen=True)
class TokenWindowRecords:
    """Windows of ``seq_len + 1`` tokens over shards, indexed shard by shard; ``first`` and
    ``count`` select a contiguous range of the windows (how a held-out tail is cut off)."""

    shards: Sequence[np.ndarray]
    seq_len: int
    first: int = 0
    count: int | None = None
    """Windows selected from ``first`` on; None: all the rest (set by ``__post_init__``)."""
    _starts: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)
    """The index of each shard's first window, then the total."""
    _offsets: np.ndarray = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        per_shard = np.array([max(0, (len(s) - 1) // self.seq_len) for s in self.shards])
        object.__setattr__(self, "_starts", np.concatenate([[0], np.cumsum(per_shard)]))
        object.__setattr__(self, "_offsets", np.arange(self.seq_len + 1, dtype=np.int64))
        if self.count is None:
            object.__setattr__(self, "count", int(self._starts[-1]) - self.first)

    @property
    def total_windows(self) -> int:
        """Windows over all the shards, before ``first``/``count`` select some."""
        return int(self._starts[-1])

    @property
    def num_records(self) -> int:
        assert self.count is not None  # set by __post_init__
        return self.count

    def gather(self, indices: np.ndarray) -> Batch:
        window = np.asarray(indices, np.int64) + self.first
        out = np.empty((len(window), self.seq_len + 1), np.int32)
        if len(self.shards) == 1:
            out[:] = self.shards[0][window[:, None] * self.seq_len + self._offsets]
            return {"tokens": out}
        shard = np.searchsorted(self._starts, window, side="right") - 1
        for s in np.unique(shard):
            rows = np.flatnonzero(shard == s)
            local = window[rows] - self._starts[s]
            out[rows] = self.shards[s][local[:, None] * self.seq_len + self._offsets]
        return {"tokens": out}


@dataclasses.dataclass
class TokenDataset(RecordDataset):
    """A ``RecordDataset`` of token windows, with what a language model and its sampler need."""

    tokens_per_record: float = 0.0
    """Tokens a training record contributes to the loss (its targets that count): ``seq_len``, the mean
    over the windows with ``data.documents`` (``dew.data.packing.targets_per_record``)."""
    tokenizer: Mapping[str, object] | None = None
    """The sidecar's ``tokenizer`` record (``{"kind": "byte", ...}`` or ``{"kind": "bpe", "file":
    <absolute path>}``), for decoding samples; None when the vocabulary came from
    ``data.vocab_size`` alone."""


def _open_all(paths: Sequence[str], spec: TokenWindowsFields) -> list[np.ndarray]:
    return [open_tokens(p, spec.format, spec.dtype) for p in paths]


def split_windows(
    shards: Sequence[np.ndarray],
    val_shards: Sequence[np.ndarray],
    seq_len: int,
    val_fraction: float,
    documents: Framing | None = None,
) -> tuple[Records, Records | None]:
    """(training, held-out) windows of ``seq_len`` + 1 tokens over ``shards``: the held-out ones
    those of ``val_shards`` where there are any, else the last ``val_fraction`` of the training
    windows (rounded up), else none. With ``documents``, the windows hold whole documents
    (``dew.data.packing``) instead of the ids back to back."""
    if documents is not None:
        table = PackedTable(shards, seq_len, documents)
        held = DocumentWindows(PackedTable(val_shards, seq_len, documents)) if val_shards else None
        if held is not None or not val_fraction:
            return DocumentWindows(table), held
        n_val = math.ceil(val_fraction * table.num_windows)
        return DocumentWindows(table, 0, table.num_windows - n_val), DocumentWindows(table, table.num_windows - n_val)
    everything = TokenWindowRecords(shards, seq_len)
    if val_shards:
        return everything, TokenWindowRecords(val_shards, seq_len)
    if not val_fraction:
        return everything, None
    n_val = math.ceil(val_fraction * everything.total_windows)
    train = TokenWindowRecords(shards, seq_len, 0, everything.total_windows - n_val)
    return train, TokenWindowRecords(shards, seq_len, train.num_records, n_val)


def load_token_windows(spec: TokenWindowsFields, batch_size: int, seed: int) -> TokenDataset:
    """Token windows of ``spec.path`` at global batch ``batch_size``, shuffled from ``seed``.

    Every file is scanned once for ids outside the vocabulary, so a bad file fails here, naming
    the file and the token offset, not in the middle of a run.
    """
    paths = expand(spec.path, "data.path", how=MAKE_TOKENS)
    val_paths = expand(spec.val_path, "data.val_path") if spec.val_path else []
    if spec.val_path and spec.val_fraction:
        raise ValueError(
            f"data.val_path={spec.val_path!r} and data.val_fraction="
            f"{spec.val_fraction} both choose the held-out windows: set one"
        )
    tokenizer: Mapping[str, object] | None = None
    if spec.tokenizer is not None:
        named = load_tokenizer(spec.tokenizer, "data.tokenizer")
        tokenizer = absolute_record(named)
        refuse_other_sidecars(paths + val_paths, tokenizer, f"data.tokenizer={spec.tokenizer!r}")
        vocab_size = spec.vocab_size if spec.vocab_size is not None else named.vocab_size
        if vocab_size < named.vocab_size:
            raise ValueError(
                f"data.vocab_size={vocab_size} is smaller than data.tokenizer's vocabulary of {named.vocab_size} ids"
            )
    elif spec.vocab_size is not None:
        vocab_size = spec.vocab_size
    else:
        sidecar = read_sidecar(paths + val_paths)
        vocab_size, tokenizer = sidecar["vocab_size"], sidecar.get("tokenizer")

    shards, val_shards = _open_all(paths, spec), _open_all(val_paths, spec)
    for path, shard in zip(paths + val_paths, shards + val_shards):
        check_vocabulary(path, shard, vocab_size)

    documents = Framing.of(tokenizer, f"data.path={spec.path!r}") if spec.documents else None
    train, held_out = split_windows(shards, val_shards, spec.seq_len, spec.val_fraction, documents)
    if train.num_records < 1:
        lengths = {p: len(s) for p, s in zip(paths, shards)}
        raise ValueError(
            f"data.path={spec.path!r} holds no training window of data.seq_len="
            f"{spec.seq_len} + 1 tokens (tokens per file: {lengths})"
        )
    if held_out is not None and held_out.num_records < 1:
        raise ValueError(
            f"the held-out split ({spec.val_path or spec.val_fraction}) holds no "
            f"window of data.seq_len={spec.seq_len} + 1 tokens"
        )
    return TokenDataset(
        name=spec.name,
        train=train,
        held_out=held_out,
        batch_size=batch_size,
        seed=seed,
        fields={"vocab_size": vocab_size, "seq_len": spec.seq_len},
        tokens_per_record=targets_per_record(train, spec.seq_len),
        tokenizer=tokenizer,
    )
