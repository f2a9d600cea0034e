"""The stall watchdog (``trainer.stall_timeout``, dew.training.watchdog): what it times and what it
does not (a first compilation, a first evaluation or save), the heartbeats it writes, the peers it
finds not running, and a real run whose first compilation takes longer than the timeout (not
stopped). The 2-process run with one process stopped: tests/cli/test_stall.py."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import types
from pathlib import Path

import pytest
from etils import epath

from dew.contract.journal import read_journal
from dew.training.watchdog import STALE_TICKS, STALL_RECORD, WATCHDOG_DIR, Stall, Watchdog, heartbeat_name
from tests.conftest import dew
from tests.training.conftest import TINY

TIMEOUT_S = 0.4


def watchdog(
    run_dir: Path, *, process: int = 0, count: int = 1, timeout_s: float = TIMEOUT_S
) -> tuple[Watchdog, list[Stall]]:
    """A watchdog on ``run_dir`` whose stalls are recorded, not acted on (the thread stops watching
    after the first)."""
    found: list[Stall] = []
    dog = Watchdog(timeout_s, epath.Path(run_dir), process=process, count=count, stalled=found.append)
    return dog, found


def started(step: int = 0) -> types.SimpleNamespace:
    return types.SimpleNamespace(tracker=None, step=step)


def wait_past_the_timeout(timeout_s: float = TIMEOUT_S) -> None:
    time.sleep(timeout_s * 2.5)


def test_the_first_step_is_not_timed_the_next_are(tmp_path: Path):
    dog, found = watchdog(tmp_path)
    dog.start(started(step=7))  # a resumed run: its first step is 8
    try:
        dog.before(7)
        wait_past_the_timeout()  # step 8 compiling: untimed
        assert found == []
        dog.before(8)  # step 8 ended: from here on, timed
        time.sleep(TIMEOUT_S / 2)
        dog.before(9)
        time.sleep(TIMEOUT_S / 2)
        assert found == []  # a step within the timeout
        wait_past_the_timeout()
        assert found, "no stall found"
        stall = found[0]
        assert (stall.step, stall.doing, stall.process, stall.count) == (9, "step 10", 0, 1)
        assert stall.idle_s > TIMEOUT_S
        assert stall.requeue and stall.previous_stall is None
        assert "Thread MainThread" in stall.stacks and "wait_past_the_timeout" in stall.stacks  # where it is
        assert stall.headline().startswith("stalled: process 0 of 1 made no progress for ")
        assert "after step 9, in step 10; the run is stuck" in stall.headline()
    finally:
        dog.close()
    assert not (tmp_path / WATCHDOG_DIR).exists()  # its heartbeat removed, the empty directory too


def test_a_first_evaluation_and_save_are_not_timed_later_ones_are(tmp_path: Path):
    dog, found = watchdog(tmp_path)
    dog.start(started())
    try:
        dog.before(0)
        dog.before(1)  # armed
        for kind in ("eval", "checkpoint"):
            with dog.around(kind):
                wait_past_the_timeout()  # its first: compiling the evaluation, opening the checkpointer
            assert found == []
            dog.before(2)
        with dog.around("eval"):
            wait_past_the_timeout()
        assert found and found[0].doing == "eval after step 2"
    finally:
        dog.close()


class SlowLanding:
    """A checkpointer whose saves land ``land_s`` after they begin, as orbax writes them in the
    background: ``save`` returns at once, the wait after it takes the rest."""

    def __init__(self, land_s: float) -> None:
        self.land_s = land_s
        self.began: float | None = None
        self.steps: list[int] = []

    def save(self, step: int, state: object, meta: object, metrics: object) -> None:
        self.began = time.monotonic()
        self.steps.append(step)

    def wait(self) -> None:
        if self.began is not None:
            time.sleep(max(0.0, self.began + self.land_s - time.monotonic()))
        self.began = None

    def latest_step(self) -> int | None:
        return self.steps[-1] if self.steps else None


def test_the_wait_for_a_first_save_to_land_is_not_timed_a_later_one_is(tmp_path: Path):
    """The first save's writing (in the background) lands in the wait after it: the last step's
    save, waited for by the run's end, outlasted a 0.5 s timeout on a slow machine (CI, 2026-12-07)."""
    from dew.training.checkpointing.saving import Saver

    dog, found = watchdog(tmp_path)
    tracker = types.SimpleNamespace(event=lambda *a, **k: None, wandb_id=None, mlflow_id=None, resume_ids={})
    checkpoints = SlowLanding(land_s=TIMEOUT_S * 2.5)
    saver = Saver(
        checkpoints,
        tracker,
        data_state=lambda: None,
        stages=[(8, 0)],
        total_steps=4,
        last_saved=None,
    )
    saver.untimed = dog.untimed
    dog.start(started())
    try:
        dog.before(0)
        dog.before(1)  # armed
        with dog.around("checkpoint"):  # the first save (the last step's, as the loop saves it)
            saver.save(1, 1, state=None, metrics=None)
        with dog.around("checkpoint"):  # the run's end: waits for it to land, past the timeout
            saver.last(1, 1, state=None, metrics={})
        assert found == [] and checkpoints.steps == [1]
        dog.before(2)
        with dog.around("checkpoint"):
            saver.save(2, 2, state=None, metrics=None)
            saver.wait()  # a later save's landing: timed
        assert found, "no stall found in a later save's wait"
        assert found[0].doing == "checkpoint after step 2"
        assert "in wait" in found[0].stacks  # where the process waited
    finally:
        dog.close()


def test_the_heartbeat_says_the_process_its_step_and_what_it_does(tmp_path: Path):
    dog, _ = watchdog(tmp_path, process=1, count=2)
    dog.start(started())
    try:
        dog.before(0)
        dog.before(1)
        dog.before(2)
        time.sleep(dog.tick_s * 1.5)
        record = json.loads((tmp_path / WATCHDOG_DIR / heartbeat_name(1)).read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        assert (record["process"], record["step"], record["doing"]) == (1, 2, "step 3")
        assert time.time() - record["time"] < dog.tick_s * 1.5
    finally:
        dog.close()


def test_a_peer_whose_heartbeat_stopped_is_named_as_not_running(tmp_path: Path):
    # A 2 s timeout (ticks of 0.5 s): the running peer's writer thread must not look stale for missing
    # 3 ticks, which at 0.4 s (ticks of 0.1 s) a loaded suite's scheduling once made it (2026-12-06).
    dog, found = watchdog(tmp_path, process=0, count=3, timeout_s=2.0)
    beats = tmp_path / WATCHDOG_DIR
    beats.mkdir()
    stale = time.time() - STALE_TICKS * dog.tick_s - 5
    (beats / heartbeat_name(1)).write_text(
        json.dumps(
            {
                "process": 1,
                "pid": 4242,
                "host": "node7",
                "step": 37,
                "progress": stale,
                "doing": "step 38",
                "time": stale,
            }
        )
    )
    (beats / STALL_RECORD).write_text(json.dumps({"step": 40}))  # it stalled before, further on
    alive = threading.Event()

    def peer_two() -> None:  # a running peer: its heartbeat written every tick, no progress
        while not alive.wait(dog.tick_s / 2):
            now = time.time()
            record = {"process": 2, "pid": 99, "host": "node8", "step": 38, "progress": now - 3, "doing": "step 39"}
            # Written whole, then renamed, as a watchdog writes it: write_text truncates first, and a
            # read between the two found an empty file, a peer without a heartbeat (CI, 2026-12-07).
            (beats / "peer2.tmp").write_text(json.dumps(record | {"time": now}))
            os.replace(beats / "peer2.tmp", beats / heartbeat_name(2))

    writer = threading.Thread(target=peer_two)
    writer.start()
    dog.start(started())
    try:
        dog.before(0)
        dog.before(38)
        wait_past_the_timeout(2.0)
    finally:
        alive.set()
        writer.join()
        dog.close()
    stall = found[0]
    assert [(p.process, p.running, p.here) for p in stall.peers] == [(1, False, False), (2, True, False)], [
        (p.process, p.age_s, p.record) for p in stall.peers
    ]
    assert [p.process for p in stall.stuck] == [1]
    assert stall.headline().endswith("; process 1 is not running")
    lines = stall.text().splitlines()
    assert re.fullmatch(
        r"  process 1 \(pid 4242 on node7\): not running \(stopped, frozen or gone\): its heartbeat stopped "
        r"\d+ s ago, at step 37, then step 38",
        lines[1],
    ), lines[1]
    assert re.fullmatch(
        r"  process 2 \(pid 99 on node8\): running, no progress for \d s: step 38, then step 39", lines[2]
    )
    assert lines[3].startswith(f"  the threads of process 0 (pid {os.getpid()} on ")
    assert stall.previous_stall == 40 and not stall.requeue  # it never got past its last stall: no requeue


@pytest.mark.parametrize("value", ["0", "-5", "soon", "12:00"])
def test_a_bad_stall_timeout_is_refused_naming_the_field(value: str):
    from dew.contract.config import TrainerConfig

    with pytest.raises(ValueError, match=rf"^trainer\.stall_timeout='{re.escape(value)}' is not a positive duration"):
        TrainerConfig(stall_timeout=value)
    assert TrainerConfig(stall_timeout="10m").stall_timeout_seconds() == 600.0
    assert TrainerConfig(stall_timeout=90).stall_timeout == "90"


def test_a_run_whose_first_compilation_outlasts_the_timeout_is_not_stopped(workdir: Path):
    """A run with a half-second timeout and a compilation of its own (no cache), a first evaluation
    and a first save (its last step's): all untimed, and its later steps take milliseconds."""
    args = [a for a in TINY if not a.startswith("trainer.compilation_cache_dir")]
    result = dew(
        *args,
        "trainer.steps=4",
        "trainer.eval_every=4",
        "trainer.checkpoint_every=null",
        "trainer.checkpoint_dir=ck",
        "trainer.compilation_cache_dir=null",
        "trainer.stall_timeout=0.5",
        "trainer.name=slow-start",
        cwd=workdir,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    compiled = re.search(r"compiled the train step and ran step 1 in ([\d.]+) s", result.stderr)
    assert compiled and float(compiled.group(1)) > 0.5, result.stderr[-3000:]  # longer than the timeout
    assert "stalled" not in result.stderr
    journal = read_journal(workdir / "tracking" / "slow-start" / "journal.jsonl")
    assert [(r["event"], r["step"]) for r in journal if r.get("event") in ("start", "stop", "end")] == [
        ("start", 0),
        ("end", 4),
    ]
    assert not (workdir / "ck" / "slow-start" / WATCHDOG_DIR).exists()
