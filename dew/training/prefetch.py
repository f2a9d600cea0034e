"""``trainer.prefetch``: the next batches read and placed on the devices in a background thread while
the running step computes, so that no step waits for its data.

The loop takes one ``Fed`` a step from a ``Feed``: the batch, already global arrays on the mesh, the
records it holds, and the data position after it. With ``depth`` > 0 a thread reads the batches of
the steps ahead (``iterator.next`` at each step's stage of the batch ramp), captures the iterator's
position after each (``get_state``, copied), places it (``jax.device_put`` with the batch sharding:
the transfer overlaps the running step too) and queues it, at most ``depth`` ahead of the loop. With
``depth`` 0 the loop reads and places each batch itself, at the top of its step, as before.

What makes it exact and prompt:

- The position a checkpoint saves is ``Feed.position``: the one captured with the last batch handed
  to the loop, never the iterator's own, which has run ahead by the batches in the queue. A resumed
  run reads the batch after the last one trained, whatever was prefetched.
- A stop never waits for the thread: ``close`` tells it to end and empties the queue, and returns.
  The thread ends by itself after the batch it is reading (it places nothing and queues nothing once
  told), so a data source stalled on a slow file delays neither the stop nor the checkpoint.
- An exception in the data source (or in the placement) is queued in the batch's place and raised in
  the loop when it reaches that step, as the same exception with its own traceback and a note naming
  the step: the batches read before it train first, as without prefetch.

Why not grain's ``ThreadPrefetchDatasetIterator`` (grain 0.2.18), which captures each element's
state as this does: its ``close`` joins the thread with no bound, so a stop waits for the batch being
read (measured: 2.8 s into a 3 s batch); its ``__next__`` takes no batch size, which the batch ramp
asks per step; and the placement over a multi-process mesh (``jax.make_array_from_process_local_data``)
would be a second thread stage around it. A dataset's own iterator may still prefetch inside (grain's
``mp_prefetch`` for a costly decode): this thread overlaps what is left with the step.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax

from dew.contract.data import Batch, BatchIterator
from dew.training.ramp import stage_at

if TYPE_CHECKING:
    from dew.contract.config import TrainerConfig


@dataclasses.dataclass(frozen=True)
class Fed:
    """One step's batch as the loop takes it."""

    batch: dict[str, jax.Array]
    """The global batch on the mesh (this process's part of it placed)."""
    records: int
    """Records of the global batch: the step's stage of the batch ramp."""
    position: Mapping[str, Any] | None
    """The iterator's state after this batch (``get_state``, copied when read); None when the
    dataset is not resumable."""


@dataclasses.dataclass(frozen=True)
class _Failed:
    """An exception the thread met reading or placing the batch of ``step``, queued in its place."""

    error: BaseException
    step: int


class Feed:
    """The batches of steps ``start``, ``start + 1``, ..., ``end - 1`` of ``iterator``, step ``s``
    holding ``sizes(s)`` records, each placed by ``place``; read ``depth`` steps ahead in a thread
    (0: in the caller, when it asks). The thread reads nothing past ``end``. Steps count as the
    loop's do: the batch of step ``s`` is the one the step after ``s`` completed steps trains."""

    def __init__(
        self,
        iterator: BatchIterator,
        sizes: Callable[[int], int],
        place: Callable[[Mapping[str, Any]], dict[str, jax.Array]],
        *,
        start: int,
        end: int,
        depth: int,
        resumable: bool,
    ) -> None:
        if depth < 0:
            raise ValueError(f"depth={depth} must be >= 0 (0 reads each batch when it is asked for)")
        self.iterator, self.sizes, self.place, self.resumable = iterator, sizes, place, resumable
        self.step, self.end = start, end
        """The step whose batch ``next`` hands out next, and the step after the last."""
        self.position: Mapping[str, Any] | None = self._state()
        """The data position after the batches handed out: the one a checkpoint saves."""
        self.waited_s = 0.0
        """The time the loop waited in ``next`` for a batch: read and placed there (``depth`` 0), or
        not yet read ahead (the goodput ledger's ``data``)."""
        self._stop = threading.Event()
        self._queue: queue.Queue[Fed | _Failed] | None = None
        self.thread: threading.Thread | None = None
        """The reading thread (None with ``depth`` 0): a daemon, so a process never waits for it."""
        if depth:
            self._queue = queue.Queue(maxsize=depth)
            self.thread = threading.Thread(target=self._read_ahead, name="dew-prefetch", daemon=True)
            self.thread.start()

    def _state(self) -> Mapping[str, Any] | None:
        # A copy: an iterator may hand out its own record and change it as it reads on.
        return copy.deepcopy(self.iterator.get_state()) if self.resumable else None

    def _read(self, step: int) -> tuple[Batch, int, Mapping[str, Any] | None]:
        size = self.sizes(step)
        return self.iterator.next(size), size, self._state()

    def _read_ahead(self) -> None:
        """The thread: read, place and queue the batches in order until told to stop (``close``) or
        the source fails. Once told, it places and queues nothing more: ``close`` emptied the queue,
        so the one ``put`` that may still come finds room and never blocks."""
        assert self._queue is not None
        step = self.step
        try:
            while step < self.end and not self._stop.is_set():
                host, size, position = self._read(step)
                if self._stop.is_set():
                    return
                self._queue.put(Fed(self.place(host), size, position))
                step += 1
        except BaseException as err:  # handed to the loop, which raises it at its step
            if not self._stop.is_set():
                self._queue.put(_Failed(err, step))

    def next(self) -> Fed:
        """The batch of step ``step``, placed; its position becomes ``position``. Raises what the
        data source raised for this step, with its traceback."""
        if self.step >= self.end:
            raise IndexError(f"the feed holds the batches of steps before {self.end}; step {self.step} was asked for")
        began = time.perf_counter()
        if self._queue is None:
            host, size, position = self._read(self.step)
            fed = Fed(self.place(host), size, position)
        else:
            item = self._queue.get()
            self.waited_s += time.perf_counter() - began
            if isinstance(item, _Failed):
                item.error.add_note(f"(raised in dew's prefetch thread, reading the batch of step {item.step + 1})")
                raise item.error
            fed = item
        if self._queue is None:
            self.waited_s += time.perf_counter() - began  # read and placed here: all of it the loop's wait
        self.step += 1
        self.position = fed.position
        return fed

    def close(self) -> None:
        """Tell the thread to end and drop the batches it queued; returns at once (the thread ends
        after the batch it is reading, if any)."""
        self._stop.set()
        if self._queue is not None:
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break


def feed_for(
    t: TrainerConfig, iterator: BatchIterator, place: Callable, *, resumable: bool, start: int, end: int
) -> Feed:
    """The batches of steps ``start`` to ``end``, each at its stage of the batch ramp, read and
    placed ``trainer.prefetch`` steps ahead."""
    sizes = functools.partial(_stage_size, t.stages())
    return Feed(iterator, sizes, place, start=start, end=end, depth=t.prefetch, resumable=resumable)


def _stage_size(stages: Sequence[tuple[int, int]], step: int) -> int:
    """The global batch of the step after ``step`` steps: its stage's of the batch ramp."""
    return stages[stage_at(stages, step)][0]
