"""Documents packed whole into windows (``data.documents=true``): what ``token_windows``, ``hf_text``,
``text_stream`` and ``chat`` hand a causal model so that attention stays within a document.

A window holds ``seq_len + 1`` tokens, as without documents, plus two fields of the same shape
(docs/data.md):

- ``segment_ids`` int32: 1, 2, ... for the documents of the row in order, 0 for padding;
- ``positions`` int32: each token's place in its document, from 0 (padding 0).

A document is framed as its tokenizer frames it: the begin-of-text id where the tokenizer has one,
its ids, the end-of-text id. A tokenizer without a begin-of-text id (UTF-8 bytes, dew-prepare's BPE,
GPT-2's) starts each document with the end-of-text id instead, as the one before it ended and as
``dew-sample`` starts a sample: the first token of a document is then learned from the same start
token the sampler gives. A document longer than a window is cut into pieces of ``seq_len + 1``
tokens that advance by ``seq_len`` (as plain windows do, so each target is trained once), each piece
packed as a document of its own. Padding is the end-of-text id with segment id 0.

Pieces are placed first-fit: each goes into the first of the ``OPEN_WINDOWS`` windows still open that
has room for it, in the order the files hold them; when none has, the fullest is closed. On short
documents that fills 97-99% of a window with real tokens (bench/packing.py, docs/performance.md).

``token_windows`` and ``hf_text`` (``mode=cache``) read windows by index (every window once per
epoch, shuffled, resumed by one position: ``dew.data.pipeline``), so their packing is computed once,
at load, as a table (``PackedTable``): which pieces each window holds. grain's
``FirstFitPackIterDataset`` packs a stream of examples it holds in memory, not a table over
memory-mapped files read by index; ``text_stream`` uses it (``dew.data.stream``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dew.contract.data import Batch

OPEN_WINDOWS = 16
"""Windows that take pieces at once; more fill windows better and cost more per piece."""


SAMPLED_WINDOWS = 64
"""Windows a stream of packed documents reads at load to estimate its ``tokens_per_record``."""


def targets_per_record(records: object, seq_len: int) -> float:
    """A token dataset's ``tokens_per_record``: the targets that carry loss per training window,
    which is what the power schedule's "tokens seen" counts (docs/optimizers.md): ``seq_len`` for
    windows of ids back to back, the mean over the windows of packed documents
    (``DocumentWindows.targets_per_record``), whose padding and first tokens are no targets."""
    return records.targets_per_record if isinstance(records, DocumentWindows) else float(seq_len)


def sampled_targets_per_record(segment_ids: np.ndarray) -> float:
    """The mean targets per window of packed documents (no loss mask), from windows' ``segment_ids``
    ``(n, seq_len + 1)``: a row of ``k`` documents holding ``t`` real tokens holds ``t - k`` targets.
    A stream has no table to count: it estimates its ``tokens_per_record`` from its first
    ``SAMPLED_WINDOWS`` windows this way."""
    segment_ids = np.asarray(segment_ids)
    return float(np.count_nonzero(segment_ids) - segment_ids.max(axis=1).sum()) / max(1, len(segment_ids))


@dataclasses.dataclass(frozen=True)
class Framing:
    """How documents lie in token files: the id that ends each, and whether each begins with an id
    of its own (a begin-of-text id). Without one, each piece that starts a document gets the
    end-of-text id before it (``lead``)."""

    eos_id: int
    has_bos: bool

    @classmethod
    def of(cls, tokenizer: object, what: str) -> Framing:
        """The framing of a tokenizer record (a sidecar's ``tokenizer``: ``eos_id``, ``bos_id``), or
        a ValueError naming ``what`` when there is none to read the end-of-text id from."""
        if not isinstance(tokenizer, dict) or not isinstance(tokenizer.get("eos_id"), int):
            raise ValueError(
                f"data.documents=true splits the tokens into documents at the tokenizer's end-of-text id, "
                f"and {what} names no tokenizer: give data.tokenizer, or a tokens.json sidecar beside the files "
                "(dew-prepare writes one)"
            )
        return cls(int(tokenizer["eos_id"]), isinstance(tokenizer.get("bos_id"), int))


def document_bounds(tokens: np.ndarray, framing: Framing) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` of the documents of ``tokens`` (one file's ids): a document ends at each
    end-of-text id; ids after the last one are a last document."""
    ends = np.flatnonzero(np.asarray(tokens) == framing.eos_id) + 1
    if len(ends) == 0 or ends[-1] != len(tokens):
        ends = np.append(ends, len(tokens))
    return np.concatenate([[0], ends[:-1]]).astype(np.int64), ends.astype(np.int64)


def pieces_of(
    starts: np.ndarray, ends: np.ndarray, lead_doc: bool, seq_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(start, length, lead)`` of each piece of the documents ``[starts, ends)`` of a file: the file
    offset of its first id, how many ids of the file it holds, and whether the end-of-text id goes
    before them (``lead_doc``: every document starts with one). Pieces of fewer than 2 tokens (no
    target) are left out."""
    lead_of = np.full(len(starts), lead_doc)
    n = ends - starts + lead_of  # tokens of each framed document
    count = np.maximum(1, -(-(n - 1) // seq_len))  # pieces of at most seq_len + 1, advancing by seq_len
    doc = np.repeat(np.arange(len(n)), count)
    j = np.arange(len(doc)) - np.repeat(np.cumsum(count) - count, count)
    begin, stop = j * seq_len, np.minimum(j * seq_len + seq_len + 1, n[doc])
    lead = lead_of[doc] & (j == 0)
    start = starts[doc] - lead_of[doc] + begin + lead
    length = stop - begin - lead
    keep = length + lead >= 2
    return start[keep].astype(np.int64), length[keep].astype(np.int64), lead[keep]


def pieces(document: np.ndarray, seq_len: int) -> list[np.ndarray]:
    """One framed document's pieces of at most ``seq_len + 1`` tokens, advancing by ``seq_len``."""
    count = max(1, -(-(len(document) - 1) // seq_len))
    return [document[j * seq_len : j * seq_len + seq_len + 1] for j in range(count)]


def first_fit(sizes: Sequence[int] | np.ndarray, width: int, open_windows: int = OPEN_WINDOWS) -> np.ndarray:
    """The window of each piece of ``sizes`` (each at most ``width``): the first open window with room,
    else a new one (the fullest of ``open_windows`` closed to make room). Windows are numbered in the
    order they open. A plain loop: the choice of each piece depends on every one before it."""
    window = np.empty(len(sizes), np.int64)
    free: list[int] = []
    ids: list[int] = []
    opened = 0
    for i, size in enumerate(np.asarray(sizes).tolist()):
        for b, room in enumerate(free):
            if size <= room:
                window[i] = ids[b]
                if room - size < 2:  # no piece fits any more
                    del free[b], ids[b]
                else:
                    free[b] = room - size
                break
        else:
            if len(free) == open_windows:
                fullest = free.index(min(free))
                del free[fullest], ids[fullest]
            window[i] = opened
            free.append(width - size)
            ids.append(opened)
            opened += 1
    return window


@dataclasses.dataclass(frozen=True)
class PackedTable:
    """The pieces of every document of ``shards`` and the window each is packed into, computed once."""

    shards: Sequence[np.ndarray]
    seq_len: int
    framing: Framing
    bounds: Sequence[tuple[np.ndarray, np.ndarray]] | None = None
    """Each shard's documents ``(starts, ends)``, framed already (no ``lead``); None: split at the
    end-of-text id (``document_bounds``)."""
    loss_masks: Sequence[np.ndarray] | None = None
    """Per shard, beside its ids: 1 where a token is a target that counts (``loss_mask``)."""
    shard: np.ndarray = dataclasses.field(init=False, repr=False)
    start: np.ndarray = dataclasses.field(init=False, repr=False)
    length: np.ndarray = dataclasses.field(init=False, repr=False)
    lead: np.ndarray = dataclasses.field(init=False, repr=False)
    window_start: np.ndarray = dataclasses.field(init=False, repr=False)
    """Pieces ``[window_start[w], window_start[w + 1])`` (in the order below) are window ``w``'s."""

    def __post_init__(self) -> None:
        if self.bounds is not None:
            parts = [pieces_of(*b, False, self.seq_len) for b in self.bounds]
        else:
            lead_doc = not self.framing.has_bos
            parts = [pieces_of(*document_bounds(s, self.framing), lead_doc, self.seq_len) for s in self.shards]
        shard = np.concatenate(
            [np.full(len(p[0]), i, np.int32) for i, p in enumerate(parts)] or [np.zeros(0, np.int32)]
        )
        start, length, lead = (np.concatenate([p[k] for p in parts]) for k in range(3))
        window = first_fit(length + lead, self.seq_len + 1)
        order = np.argsort(window, kind="stable")  # each window's pieces in the order they came
        counts = np.bincount(window, minlength=int(window.max(initial=-1)) + 1)
        for name, value in (
            ("shard", shard[order]),
            ("start", start[order]),
            ("length", length[order]),
            ("lead", lead[order]),
            ("window_start", np.concatenate([[0], np.cumsum(counts)])),
        ):
            object.__setattr__(self, name, value)

    @property
    def num_windows(self) -> int:
        return len(self.window_start) - 1

    def targets_per_window(self) -> np.ndarray:
        """Each window's targets that carry loss (``dew.objectives.tokens.target_weights``): a piece of
        ``n`` tokens holds ``n - 1`` (its first token is no target: the one before it is another
        document's, or padding), those its ``loss_mask`` trains where the shards have one. Float64,
        one per window."""
        size = self.length + self.lead
        if self.loss_masks is None:
            counted = (size - 1).astype(np.float64)
        else:  # the targets are the piece's tokens after its first: of the shard, [start + !lead, start + length)
            counted = np.zeros(len(size), np.float64)
            for s, mask in enumerate(self.loss_masks):
                at = np.flatnonzero(self.shard == s)
                sums = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
                first = self.start[at] + (~self.lead[at]).astype(np.int64)
                counted[at] = sums[self.start[at] + self.length[at]] - sums[first]
        window = np.repeat(np.arange(self.num_windows), np.diff(self.window_start))
        return np.bincount(window, weights=counted, minlength=self.num_windows)

    def real_fraction(self) -> float:
        """Real (not padding) tokens over every window's ``seq_len + 1``."""
        return float((self.length + self.lead).sum()) / max(1, self.num_windows * (self.seq_len + 1))

    def gather(self, windows: np.ndarray) -> Batch:
        """Windows ``windows`` (int64) as ``tokens``, ``segment_ids`` and ``positions``, each
        ``(n, seq_len + 1)``: one vectorised gather per shard, no Python loop over pieces."""
        width, n = self.seq_len + 1, len(windows)
        lo, hi = self.window_start[windows], self.window_start[windows + 1]
        counts = hi - lo
        row = np.repeat(np.arange(n), counts)
        first_of_row = np.cumsum(counts) - counts
        piece = lo[row] + np.arange(len(row)) - first_of_row[row]
        size = self.length[piece] + self.lead[piece]
        begin = np.cumsum(size) - size  # each piece's first token in the flat batch
        offset_in_row = begin - begin[first_of_row][row]
        at = np.arange(int(size.sum())) - np.repeat(begin, size)  # each token's place in its piece
        of = np.repeat(np.arange(len(piece)), size)  # each token's piece
        lead = self.lead[piece][of]
        is_lead = lead & (at == 0)
        source = self.start[piece][of] + at - lead
        dest = row[of] * width + offset_in_row[of] + at
        tokens = np.full(n * width, self.framing.eos_id, np.int32)
        loss_mask = np.zeros(n * width, np.int32) if self.loss_masks is not None else None
        shard_of = self.shard[piece][of]
        for s in np.unique(shard_of):
            take = (shard_of == s) & ~is_lead
            tokens[dest[take]] = self.shards[s][source[take]]
            if loss_mask is not None and self.loss_masks is not None:
                loss_mask[dest[take]] = self.loss_masks[s][source[take]]
        segment_ids, positions = np.zeros(n * width, np.int32), np.zeros(n * width, np.int32)
        segment_ids[dest] = (piece - lo[row] + 1)[of]
        positions[dest] = at
        batch = {"tokens": tokens, "segment_ids": segment_ids, "positions": positions}
        if loss_mask is not None:
            batch["loss_mask"] = loss_mask
        return {k: v.reshape(n, width) for k, v in batch.items()}


@dataclasses.dataclass(frozen=True)
class DocumentWindows:
    """``Records`` (``dew.data.pipeline``) over windows ``[first, first + count)`` of a ``PackedTable``
    (how a held-out tail is cut off: the last windows, which hold the last documents)."""

    table: PackedTable
    first: int = 0
    count: int | None = None

    @property
    def num_records(self) -> int:
        return self.table.num_windows - self.first if self.count is None else self.count

    @property
    def targets_per_record(self) -> float:
        """The mean targets that carry loss per window (``PackedTable.targets_per_window``): the
        dataset's ``tokens_per_record``, exact over an epoch, which reads every window once."""
        counted = self.table.targets_per_window()[self.first : self.first + self.num_records]
        return float(counted.mean()) if len(counted) else 0.0

    def gather(self, indices: np.ndarray) -> Batch:
        return self.table.gather(np.asarray(indices, np.int64) + self.first)
