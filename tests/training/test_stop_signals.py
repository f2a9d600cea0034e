"""dew's stop handlers from the start of a job process: a signal before the run listens is the run's
(taken over at install, the handler before it put back at the end), and the same Ctrl-C delivered
twice (the terminal's and the launcher's) is one interrupt, not "Ctrl-C again"."""

from __future__ import annotations

import os
import signal
import threading

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


def test_in_a_job_ctrl_c_again_never_abandons_the_save(handlers, monkeypatch):
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    clock = [100.0]
    monkeypatch.setattr(preemption.time, "monotonic", lambda: clock[0])
    stop = StopSignals().install()
    try:
        for _ in range(3):  # the user pressing it again and again, seconds apart: the save goes on
            os.kill(os.getpid(), signal.SIGINT)
            clock[0] += 2 * preemption.ECHO_S
        assert stop.received == signal.SIGINT and stop.stop_at(1)
    finally:
        stop.restore()


def test_in_a_job_a_ctrl_c_after_the_run_ended_meets_no_handler(handlers, monkeypatch):
    """What is left of a job's task after its run (the result, the exit handlers) ignores SIGINT: a
    Ctrl-C then raised KeyboardInterrupt in JAX's exit handler, and the task's pool partner aborted
    when the pool's shutdown failed. Outside a job the handler before comes back."""
    stop = StopSignals().install()
    stop.restore()
    assert signal.getsignal(signal.SIGINT) is handlers
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    stop = StopSignals().install()
    stop.restore()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGUSR2) is handlers and signal.getsignal(signal.SIGTERM) is handlers
    os.kill(os.getpid(), signal.SIGINT)  # would raise here with Python's handler


def test_a_ctrl_c_while_the_task_starts_is_kept_until_the_run_listens(handlers):
    # The local launcher starts its tasks with SIGINT blocked: one that comes then stays pending.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # this thread's: pytest may run others
        assert signal.SIGINT in signal.sigpending()
        install_early()  # listens, then unblocks: the pending Ctrl-C is the run's
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
        stop = StopSignals().install()
        assert stop.received == signal.SIGINT and stop.reason == "interrupted"
        stop.restore()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_a_ctrl_c_while_the_run_takes_over_from_the_early_handler_is_the_runs(handlers, monkeypatch):
    """The take-over passes each signal from the early handler to the run's: a Ctrl-C at any moment
    of it meets one of them, never Python's own (a KeyboardInterrupt in the set-up, a lost stop)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's, as a job process starts
    install_early()
    met = []

    def pool_while_a_ctrl_c_comes(self):  # the pool query imports jax's distributed module: a window
        os.kill(os.getpid(), signal.SIGINT)
        met.append(signal.getsignal(signal.SIGINT))
        return False

    monkeypatch.setattr(StopSignals, "_pool", pool_while_a_ctrl_c_comes)
    stop = StopSignals().install()  # before the fix: KeyboardInterrupt from inside install
    assert met and met[0] is not signal.default_int_handler
    assert stop.received == signal.SIGINT and stop.reason == "interrupted"
    assert all(signal.getsignal(s) == stop._handle for s in (signal.SIGUSR2, signal.SIGINT, signal.SIGTERM))
    stop.restore()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGUSR2) is handlers and signal.getsignal(signal.SIGTERM) is handlers


def test_a_signal_the_early_handler_takes_during_the_swap_is_the_runs(handlers, monkeypatch):
    install_early()
    real = signal.signal
    swapped = []

    def swap_then_ctrl_c(signum, handler):  # a Ctrl-C right after the first swap, still the early one's
        previous = real(signum, handler)
        if not swapped:
            os.kill(os.getpid(), signal.SIGINT)
        swapped.append(signum)
        return previous

    monkeypatch.setattr(preemption.signal, "signal", swap_then_ctrl_c)
    stop = StopSignals().install()
    monkeypatch.undo()
    assert swapped[0] != signal.SIGINT and stop.received == signal.SIGINT and stop.reason == "interrupted"
    stop.restore()
    assert all(signal.getsignal(s) is handlers for s in (signal.SIGUSR2, signal.SIGINT, signal.SIGTERM))
