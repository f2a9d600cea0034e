"""``trainer.prefetch`` (dew.training.prefetch): the batches read ahead in a thread carry the data
position after each, so a checkpoint saves the position the trained steps consumed; an error in the
data source is raised in the loop at its step, as itself; a stop does not wait for a source that
blocks, and a run stopped while the thread reads ahead resumes bit for bit."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dew.training.prefetch import Feed


class Counting:
    """A source whose batch ``k`` (0-based) holds ``k`` in every row, ``size`` rows; its state is
    the batches read. Batch ``fail_at`` raises; batch ``block_at`` waits for ``release`` first."""

    def __init__(self, fail_at: int | None = None, block_at: int | None = None) -> None:
        self.read, self.fail_at, self.block_at = 0, fail_at, block_at
        self.blocked, self.release = threading.Event(), threading.Event()

    def next(self, batch_size: int | None = None) -> dict[str, np.ndarray]:
        if self.read == self.fail_at:
            raise ValueError(f"record {self.read} is damaged")
        if self.read == self.block_at:
            self.blocked.set()
            self.release.wait(30)
        batch = {"x": np.full(batch_size or 1, self.read)}
        self.read += 1
        return batch

    def get_state(self) -> Mapping[str, Any]:
        return {"read": self.read}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.read = state["read"]


def _sizes(step: int) -> int:
    return 2 if step < 3 else 4  # a batch ramp: each step's batch is its stage's


def _wait(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


@pytest.mark.parametrize("depth", [0, 3])
def test_each_batch_carries_the_position_after_it(depth: int):
    source = Counting()
    feed = Feed(source, _sizes, dict, start=1, end=12, depth=depth, resumable=True)  # steps 1..11
    assert feed.position == {"read": 0}
    seen = []
    for step in range(1, 6):
        fed = feed.next()
        seen.append((int(fed.batch["x"][0]), fed.records, fed.batch["x"].size))
        assert feed.position == fed.position == {"read": step}  # what the steps took, not what was read
    assert seen == [(0, 2, 2), (1, 2, 2), (2, 4, 4), (3, 4, 4), (4, 4, 4)]  # steps 1..5 at their stages
    if depth:
        _wait(lambda: source.read == 5 + depth + 1)  # depth queued, one more waiting for room...
        assert feed.position == {"read": 5}  # ... and the position is still the loop's
    assert [int(feed.next().batch["x"][0]) for _ in range(6)] == [5, 6, 7, 8, 9, 10]
    with pytest.raises(IndexError, match="steps before 12; step 12 was asked for"):
        feed.next()
    assert source.read == 11  # nothing read past the last step
    feed.close()


def test_an_error_in_the_source_is_raised_at_its_step_with_its_traceback():
    feed = Feed(Counting(fail_at=2), _sizes, dict, start=0, end=10, depth=2, resumable=True)
    assert [int(feed.next().batch["x"][0]) for _ in range(2)] == [0, 1]  # the batches before it train first
    with pytest.raises(ValueError) as raised:
        feed.next()
    assert str(raised.value) == "record 2 is damaged"  # the source's own message
    frames = [f.name for f in traceback.extract_tb(raised.value.__traceback__)]
    assert frames[-1] == "next" and "_read_ahead" in frames  # raised where the source raised it
    assert raised.value.__notes__ == ["(raised in dew's prefetch thread, reading the batch of step 3)"]
    assert feed.position == {"read": 2}
    feed.close()


def test_close_does_not_wait_for_a_source_that_blocks():
    source = Counting(block_at=3)
    feed = Feed(source, _sizes, dict, start=0, end=10, depth=2, resumable=True)
    feed.next()
    assert source.blocked.wait(10)
    start = time.perf_counter()
    feed.close()
    assert time.perf_counter() - start < 0.05
    assert feed.thread is not None and feed.thread.is_alive()  # still in the source's call
    source.release.set()
    feed.thread.join(10)
    assert not feed.thread.is_alive() and source.read == 4  # ended after that batch, read no further


def test_a_negative_depth_is_refused():
    from dew.config import TrainerConfig

    with pytest.raises(ValueError, match=r"^trainer.prefetch=-1 must be >= 0"):
        TrainerConfig(prefetch=-1)


class _BlockingIterator:
    """The run's iterator, which sends this process SIGINT when asked for batch ``block_at`` (1-based)
    and then blocks in that call until ``release``: a stop that lands while the thread reads ahead."""

    def __init__(self, inner: Any, block_at: int, release: threading.Event) -> None:
        self.inner, self.block_at, self.release, self.calls = inner, block_at, release, 0
        self.reader: threading.Thread | None = None

    def next(self, batch_size: int | None = None) -> Any:
        self.calls += 1
        self.reader = threading.current_thread()
        if self.calls == self.block_at:
            os.kill(os.getpid(), signal.SIGINT)
            self.release.wait(60)
        return self.inner.next(batch_size)

    def get_state(self) -> Any:
        return self.inner.get_state()

    def set_state(self, state: Any) -> None:
        self.inner.set_state(state)


class _Blocking:
    def __init__(self, inner: Any, block_at: int, release: threading.Event) -> None:
        self.inner, self.block_at, self.release = inner, block_at, release
        self.iterators: list[_BlockingIterator] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def iterator(self, process_index: int = 0, process_count: int = 1) -> _BlockingIterator:
        it = _BlockingIterator(self.inner.iterator(process_index, process_count), self.block_at, self.release)
        self.iterators.append(it)
        return it


@pytest.mark.slow
def test_a_stop_while_the_source_blocks_saves_the_trained_position_and_resumes_bit_for_bit(tmp_path: Path):
    from dew.training.preemption import Preempted
    from tests.training.conftest import load_params, losses, steps_on_disk, train_tiny

    run = ["trainer.steps=12", "trainer.eval_every=null", "trainer.checkpoint_every=null"]
    _, whole, whole_journal = train_tiny(tmp_path, *run, "trainer.prefetch=0", name="whole")  # no thread
    release, data = threading.Event(), None

    def blocking(d: Any) -> _Blocking:
        nonlocal data
        data = _Blocking(d, block_at=7, release=release)
        return data

    start = time.perf_counter()
    with pytest.raises(Preempted) as stopped:
        train_tiny(tmp_path, *run, "trainer.prefetch=2", name="cut", data=blocking)
    took = time.perf_counter() - start
    at = stopped.value.step
    assert at <= 6 and took < 30, (at, took)  # stopped without the blocked batch, long before it came
    assert data is not None and data.iterators[0].calls == 7  # the thread was ahead of the trained steps
    reader = data.iterators[0].reader
    assert reader is not None and reader is not threading.main_thread() and reader.is_alive()  # still blocked
    assert steps_on_disk(tmp_path / "ck" / "cut") == [at]
    meta = json.loads((tmp_path / "ck" / "cut" / str(at) / "meta" / "metadata").read_text())  # orbax's JSON item
    assert meta["data"]["position"] == at * 32  # the records the trained steps took, not those read
    release.set()
    reader.join(10)
    assert not reader.is_alive() and data.iterators[0].calls == 7  # it ended once its read returned, reading no more

    _, cut, cut_journal = train_tiny(tmp_path, *run, name="cut")
    assert losses(cut_journal) == losses(whole_journal)
    a, b = load_params(whole, 12), load_params(cut, 12)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
