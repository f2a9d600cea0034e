"""A signal stops a run at a step boundary with a checkpoint there; the same run started again
resumes from it and ends on the parameters an uninterrupted run ends on, bit for bit."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dew.training.preemption import Preempted
from tests.training import wrappers
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
            time.sleep(0.005)  # a step of the run takes longer; the thread shares its GIL

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


class Slow(wrappers.Objective):
    """The objective with a few ms of extra device work per step (a chain of matmuls its loss adds
    nothing of), so the host can dispatch steps far faster than they run, as on an accelerator."""

    def loss(self, model: Any, batch: Any, key: Any, **kwargs: Any) -> Any:
        import jax
        import jax.numpy as jnp

        out = self.inner.loss(model, batch, key, **kwargs)
        # 256 wide: tens of ms a step, so the host gets ahead on a busy machine too (128 was a few
        # ms, and CI once saw the host dispatch no faster than the devices ran)
        x = jnp.ones((256, 256)) * batch["image"].reshape(-1)[0]  # data-dependent: not folded at compile time
        x = jax.lax.fori_loop(0, 8, lambda i, x: jnp.tanh(x @ x), x)
        return out._replace(total=out.total + 0.0 * x.sum())


def _in_flight_at_each_dispatch(tmp_path: Path, monkeypatch, name: str) -> list[int]:
    """Before each dispatch, the steps dispatched whose metrics are not ready. Metrics are fetched
    every 100 steps only: nothing but the pace holds the host back."""
    import jax

    from dew.training import assembly

    compile_real, dispatched, in_flight = assembly.compile_train_step, [], []

    def counted(*args: Any, **kwargs: Any) -> Any:
        step = compile_real(*args, **kwargs)

        def run(state: Any, batch: Any, **options: Any) -> Any:  # options: the step's own (dynamics=...)
            in_flight.append(sum(not all(x.is_ready() for x in jax.tree.leaves(m)) for m in dispatched))
            out = step(state, batch, **options)
            dispatched.append(out[1])
            return out

        return run

    monkeypatch.setattr(assembly, "compile_train_step", counted)
    train_tiny(
        tmp_path,
        "trainer.steps=10",
        "trainer.eval_every=null",
        "trainer.checkpoint_every=null",
        "trainer.log_every=100",
        name=name,
        objective=Slow,
    )
    return in_flight


def test_the_host_runs_at_most_one_step_ahead_of_the_devices(tmp_path: Path, monkeypatch):
    """Short steps: at most the one the devices run and the one queued behind it are in flight at a
    dispatch, so a signal lands within two steps, and the devices never wait for the host."""
    in_flight = _in_flight_at_each_dispatch(tmp_path, monkeypatch, "paced")
    assert len(in_flight) == 10 and max(in_flight) <= 1 and sum(in_flight) >= 5, in_flight


def test_once_steps_are_long_the_host_does_not_run_ahead(tmp_path: Path, monkeypatch):
    """Long steps (here: every step counts as long): each step is waited for before the next is
    dispatched, so none is in flight at a dispatch and a signal lands within the running step."""
    from dew.training import pace

    monkeypatch.setattr(pace, "LONG_STEP_S", 0.0)
    in_flight = _in_flight_at_each_dispatch(tmp_path, monkeypatch, "long")
    assert in_flight == [0] * 10, in_flight


def test_a_signal_during_the_restore_stops_the_run_at_its_first_step(tmp_path: Path, monkeypatch):
    """The stop handlers are installed before the set-up and the restore: a signal that comes while
    the checkpoint restores is honoured at the first step boundary after it, with a checkpoint."""
    from dew.training.checkpointing.checkpoints import Checkpoints
    from tests.training.wrappers import Crash, Data

    args = ("trainer.steps=24", "trainer.eval_every=null", "trainer.checkpoint_every=2", "trainer.keep=4")
    with pytest.raises(Crash):  # the fourth batch never comes: a checkpoint at step 2 stays
        train_tiny(tmp_path, *args, name="r", data=lambda d: Data(d, crash_at=4))
    restore = Checkpoints.restore_intact

    def slowed(self: Checkpoints, *a: Any, **k: Any) -> Any:
        os.kill(os.getpid(), signal.SIGINT)  # while the restore is in progress
        time.sleep(0.1)
        return restore(self, *a, **k)

    monkeypatch.setattr(Checkpoints, "restore_intact", slowed)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Preempted) as stopped:
        train_tiny(tmp_path, *args, name="r")
    assert signal.getsignal(signal.SIGINT) is before
    assert stopped.value.step == 3 and stopped.value.reason == "interrupted"
    assert steps_on_disk(tmp_path / "ck" / "r") == [2, 3]
    events = [r for r in journal(tmp_path, "r") if "event" in r]
    assert [e["event"] for e in events[-3:]] == ["resume", "checkpoint", "stop"] and events[-1]["step"] == 3
