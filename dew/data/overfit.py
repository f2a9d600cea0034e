"""``trainer.overfit_batches``: a dataset whose training stream is its first few batches, served
again and again (``debug=overfit``). Any dataset: the wrapper reads the batches from the dataset's
own stream, so a stream that reads files, tokenizes or shards does so as it always does."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from dew.contract.data import Batch, BatchIterator, Dataset, SourcedDataset, eval_sources


class RepeatedBatches:
    """The first ``count`` batches of ``inner`` (read once, the first time one is asked for), then
    the same batches again in the same order; its state is the position in that cycle."""

    def __init__(self, inner: BatchIterator, count: int) -> None:
        self.inner, self.count = inner, count
        self.batches: list[Batch] = []
        self.position = 0

    def next(self, batch_size: int | None = None) -> Batch:
        while len(self.batches) < self.count:
            self.batches.append(self.inner.next(batch_size))
        batch = self.batches[self.position % self.count]
        self.position += 1
        return dict(batch)

    def get_state(self) -> Mapping[str, Any]:
        return {"overfit_batches": self.count, "position": self.position}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if state.get("overfit_batches") != self.count or not isinstance(state.get("position"), int):
            raise ValueError(
                f"iterator state {dict(state)} is not one of trainer.overfit_batches={self.count}: the "
                "checkpoint was taken over other data"
            )
        self.position = state["position"]


class OverfitBatches:
    """``dataset`` with its training stream replaced by ``RepeatedBatches``; everything else (the
    held-out data, the model fields, the record count) is the dataset's own."""

    def __init__(self, dataset: Dataset, count: int) -> None:
        self.dataset, self.count = dataset, count
        self.batch_size, self.num_records, self.seed = dataset.batch_size, dataset.num_records, dataset.seed
        self.resumable = True  # the position in the cycle is the whole state

    def batch_spec(self) -> Mapping[str, tuple[tuple[int, ...], np.dtype]]:
        return self.dataset.batch_spec()

    def model_fields(self) -> Mapping[str, object]:
        return self.dataset.model_fields()

    def iterator(self, process_index: int = 0, process_count: int = 1) -> RepeatedBatches:
        return RepeatedBatches(self.dataset.iterator(process_index, process_count), self.count)

    def eval_batches(self, process_index: int = 0, process_count: int = 1) -> Iterator[Batch]:
        return self.dataset.eval_batches(process_index, process_count)

    @property
    def eval_sources(self) -> tuple[str, ...]:
        """The dataset's named held-out sources (a mixture's components; none for one of one source),
        so the run reports ``eval/<source>/loss``... as it would without ``debug=overfit``."""
        return eval_sources(self.dataset)

    def source_eval_batches(self, process_index: int = 0, process_count: int = 1) -> Mapping[str, Iterator[Batch]]:
        """Each named source's held-out pass, the dataset's own (``dew.contract.data.SourcedDataset``)."""
        if not isinstance(self.dataset, SourcedDataset):
            raise TypeError(f"{type(self.dataset).__name__} names no held-out sources (eval_sources is empty)")
        return self.dataset.source_eval_batches(process_index, process_count)

    @property
    def num_eval_records(self) -> int | None:
        """The dataset's held-out records (None where it does not count them)."""
        return getattr(self.dataset, "num_eval_records", None)
