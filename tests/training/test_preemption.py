"""A signal stops a run at a step boundary with a checkpoint there; the same run started again
resumes from it and ends on the parameters an uninterrupted run ends on, bit for bit."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dew.training.preemption import Preempted
from tests.training.conftest import journal, load_params, losses, steps_on_disk, train_tiny

pytestmark = pytest.mark.slow

RUN = ["trainer.steps=24", "trainer.eval_every=null", "trainer.checkpoint_every=null"]


def signal_when_logged(tmp: Path, name: str, step: int, signum: int) -> threading.Thread:
    """Send this process ``signum`` once the journal of ``name`` has logged ``step``."""
    path = tmp / "tracking" / name / "journal.jsonl"

    def watch() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if path.exists() and f'"step": {step},' in path.read_text():
                os.kill(os.getpid(), signum)
                return
            time.sleep(0.001)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_ctrl_c_saves_stops_and_the_run_resumes_bit_for_bit(tmp_path: Path):
    _, whole, whole_journal = train_tiny(tmp_path, *RUN, name="whole")
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under a shell's `&`
    watcher = signal_when_logged(tmp_path, "cut", 3, signal.SIGINT)
    with pytest.raises(Preempted) as stopped:
        train_tiny(tmp_path, *RUN, name="cut")
    watcher.join()
    assert signal.getsignal(signal.SIGINT) is before  # the trainer's handler is gone, the old one back
    at = stopped.value.step
    assert stopped.value.reason == "interrupted" and 3 <= at < 24
    events = [r for r in journal(tmp_path, "cut") if "event" in r]
    assert events[-1]["event"] == "stop" and events[-1]["reason"] == "interrupted" and events[-1]["step"] == at
    assert steps_on_disk(tmp_path / "ck" / "cut") == [at]  # the checkpoint at the signal's step

    _, cut, cut_journal = train_tiny(tmp_path, *RUN, name="cut")
    kinds = [r["event"] for r in cut_journal if r.get("event") in ("start", "stop", "resume", "end")]
    assert kinds == ["start", "stop", "resume", "end"]
    assert losses(cut_journal) == losses(whole_journal)
    a, b = load_params(whole, 24), load_params(cut, 24)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
