"""dew's stop handlers from the start of a job process: a signal before the run listens is the run's
(taken over at install, the handler before it put back at the end), and the same Ctrl-C delivered
twice (the terminal's and the launcher's) is one interrupt, not "Ctrl-C again"."""

from __future__ import annotations

import os
import signal

import pytest

from dew.training import preemption
from dew.training.preemption import StopSignals, install_early


@pytest.fixture
def handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGINT, signal.SIGTERM)}
    marker = lambda signum, frame: None  # noqa: E731 - stands for submitit's handler
    for s in saved:
        signal.signal(s, marker)
    yield marker
    preemption._early = None
    for s, h in saved.items():
        signal.signal(s, h)


def test_a_signal_during_set_up_stops_the_run_at_its_first_step(handlers):
    install_early()
    os.kill(os.getpid(), signal.SIGUSR2)  # while the job still sets up: not submitit's handler's
    stop = StopSignals().install()  # the run's own, which takes it over
    assert stop.received == signal.SIGUSR2 and stop.stop_at(1) and stop.reason == "preempted"
    stop.restore()
    assert all(signal.getsignal(s) is handlers for s in (signal.SIGUSR2, signal.SIGINT, signal.SIGTERM))


def test_the_same_ctrl_c_twice_is_one_interrupt(handlers, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(preemption.time, "monotonic", lambda: clock[0])
    stop = StopSignals().install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        clock[0] += preemption.ECHO_S / 2
        os.kill(os.getpid(), signal.SIGINT)  # the launcher passing the terminal's Ctrl-C on
        assert stop.received == signal.SIGINT and stop.reason == "interrupted"
        clock[0] += preemption.ECHO_S
        with pytest.raises(KeyboardInterrupt):  # the user pressing it again: stop at once
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        stop.restore()
