"""Stopping a run on a signal, at a step boundary every process agrees on, with nothing lost; and
stopping it because something asked (``StopRequest``: early stopping, a hook).

SIGUSR2 is what submitit sends before a time limit and on preemption, SIGTERM what a scheduler
sends, SIGINT what Ctrl-C sends. Any of them makes the run finish the step in flight, save a
checkpoint of the state after it (every process its own shards, at the same step), write a ``stop``
event to the journal, and raise ``Preempted``; ``dew-train`` then exits the way the launcher
expects (``dew.launching.stop_exit``), and the same command (or submitit's requeue) resumes from that
checkpoint.

Agreement across processes is JAX's, not dew's: after ``jax.distributed.initialize`` JAX's
preemption notifier holds SIGTERM, and ``multihost_utils.reached_preemption_sync_point(step)``
turns true on every process at the same step once any process was notified. JAX listens to SIGTERM
only, so a SIGUSR2 or SIGINT handler here sends the process a SIGTERM and lets JAX's machinery do
the rest. The per-step check is a C++ call that compares two integers (measured 2.6-4 us here),
with no collective and no device sync, so it sits in the loop at every step. A run alone in its
process checks a flag the handler set.

Once the loop has ended no step boundary is left to stop at, and a signal passed on then would be
agreed by nobody: a process whose notifier caught it after another process had left the pool waited
3 minutes at JAX's preemption barrier before it could exit (a Ctrl-C on a 2-task sweep as its run
ended). So every process calls ``StopSignals.settle`` where its loop ends: nothing is passed on
from there, and a notice already in flight is answered by every process before any of them leaves.

A stop request (``StopSignals.request``) is the other way a run stops before its last step: not a
signal but a decision of the run's own (``trainer.early_stopping``, or any hook, which is handed
``request`` in ``Started.request_stop``). It is honoured at the same step boundary, but the run then
ends as a finished one does: its last checkpoint saved, an ``early_stop`` event and the ``end``
event in the journal, and no ``Preempted``; the checkpoint records the request, so the same command
trains nothing more. It is not shared between processes: every process of a pool must ask at the
same step, which a decision computed from values all of them hold (an evaluation's) does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from types import FrameType
from typing import Any

from dew import compat
from dew.launching.pool import barrier

log = logging.getLogger("dew")

REASONS: dict[int, str] = {signal.SIGUSR2: "preempted", signal.SIGTERM: "preempted", signal.SIGINT: "interrupted"}
"""The journal's ``stop`` reason for each signal that stops a run."""

MAX_TIME = "max_time"
"""The journal's ``stop`` reason of a run that ``trainer.max_time`` stopped (``StopSignals.limit``)."""

MAX_TIME_KEY = "dew/stop_max_time"
"""Where, in a process pool's key-value store, a process whose clock passed ``trainer.max_time``
says so before it passes the stop on as a SIGTERM: every process reads it at the agreed step, so
all of them stop for that reason and exit alike."""


class Preempted(Exception):
    """The run stopped at ``step`` on a signal, after saving a checkpoint there."""

    def __init__(self, reason: str, step: int, signum: int | None, path: str, unnamed: str | None = None) -> None:
        """``unnamed``: the name a run started without ``trainer.name`` was given (``run-<moment>``),
        which a command must give to resume it: the same command would start another run."""
        self.reason, self.step, self.signum, self.path = reason, step, signum, path
        if reason == MAX_TIME:
            what = "trainer.max_time reached"
        else:
            what = signal.Signals(signum).name if signum else "a preemption notice from another process"
        resumes = (
            f"the same command with trainer.name set to {unnamed!r} resumes the run"
            if unnamed
            else "the same command resumes the run"
        )
        super().__init__(f"{what}: stopped at step {step} with a checkpoint in {path}; {resumes}")


@dataclasses.dataclass(frozen=True)
class StopRequest:
    """A request to end the run at the next step boundary, from the run itself (not a signal)."""

    reason: str
    """Who asked, in a word (``early_stopping``): the ``reason`` of the journal's ``early_stop``
    event."""
    message: str
    """Why, in one line: logged, written into the event and shown by ``dew-runs``."""
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """JSON values written into the event beside them (the rule's numbers)."""

    def to_json(self) -> dict[str, Any]:
        """The request as the checkpoint records it (and ``from_json`` reads it back)."""
        return {"reason": self.reason, "message": self.message, "details": dict(self.details)}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> StopRequest:
        return cls(str(value["reason"]), str(value["message"]), dict(value.get("details") or {}))


SIGNAL_KEY = "dew/stop_signal"
"""Where, in a process pool's key-value store, the first process a signal reached records which
signal it was: every process reads it at the agreed step, so all of them stop for the same reason
and exit alike (rank 0 requeues a preempted submitit job whichever rank was signalled)."""

ECHO_S = 3.0
"""A second SIGINT this soon after the first is the same Ctrl-C delivered twice (the terminal's to
every process of the group, and the launcher passing it on), not the user pressing it again."""

_early: StopSignals | None = None


def install_early() -> None:
    """Listen from the start of a job process (a submitit task, before its set-up and restore): a
    signal that comes early is recorded instead of reaching submitit's handler (which would requeue
    before anything was saved, or, on a non-zero rank, swallow it), and the run's own
    ``StopSignals`` takes it over at install and stops at its first step boundary."""
    global _early
    if _early is None:
        _early = StopSignals().install(_signals=(signal.SIGUSR2, signal.SIGINT, signal.SIGTERM))
        # The local launcher starts its jobs with SIGINT blocked (compat.submitit_local_controllers):
        # a Ctrl-C that came while this process started is pending, and is the run's from here.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class StopSignals:
    """Signal handlers for the duration of a run (``install`` ... ``restore``), asked at each step
    boundary whether to stop there. Constructing and installing one opens no JAX backend, so it can
    listen before the process joins its pool."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._at = 0.0
        self._passed_on = False
        self._in_pool: bool | None = None
        self._stepped = False
        self._ended = False
        self.requested: StopRequest | None = None
        """The first stop request (``request``), None while nothing asked."""
        self.deadline: float | None = None
        """``time.monotonic()`` past which the run stops at its next step boundary (``limit``)."""
        self.timed_out = False
        """The stop is ``trainer.max_time``'s (on this process's clock or, in a pool, on another's)."""

    def limit(self, seconds: float | None) -> None:
        """Stop the run at the first step boundary ``seconds`` from now (``trainer.max_time``) with a
        checkpoint, as a signal does; None: no limit."""
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def _expired(self) -> None:
        """Once past the deadline, with no signal before it: the stop is ``max_time``'s; in a pool it
        is passed on to every process as a signal is (``_pass_on``), and recorded as max_time's."""
        if self.deadline is None or self.received is not None or time.monotonic() < self.deadline:
            return
        log.warning("trainer.max_time reached: the run saves a checkpoint at the next step boundary and stops")
        self.deadline, self.timed_out = None, True
        self.received, self._at = signal.SIGTERM, time.monotonic()
        if self._pool():
            with contextlib.suppress(Exception):
                compat.jax_distributed_client().key_value_set(MAX_TIME_KEY, "1")
        self._pass_on()

    def request(self, request: StopRequest) -> None:
        """Ask the run to end after the step in flight, as a finished run ends (the first request
        stands). Every process of a pool must ask at the same step: the request is not shared."""
        if self.requested is None:
            self.requested = request

    def _pool(self) -> bool:
        """Whether this process is in a pool of more than one, where JAX's notifier agrees the step
        (known once the pool is joined; False before)."""
        if self._in_pool is None:
            if compat.jax_preemption_sync_manager() is None:
                return False
            import jax

            self._in_pool = jax.process_count() > 1
        return self._in_pool

    def install(self, _signals: tuple[int, ...] | None = None) -> StopSignals:
        global _early
        if threading.current_thread() is not threading.main_thread():
            return self  # Python delivers signals to the main thread only; a run in another cannot listen
        # In a process pool, SIGTERM stays with JAX's preemption notifier. (Asked first: it imports,
        # and a signal then must meet a handler of dew's, the early one's or this one's.)
        pool = self._pool()
        signums = _signals or (signal.SIGUSR2, signal.SIGINT) + (() if pool else (signal.SIGTERM,))
        for signum in signums:
            self._previous[signum] = signal.signal(signum, self._handle)
        if _early is not None and _early is not self:  # take over what listened since the process began
            early, _early = _early, None
            # Handler to handler, never through the one before: a Ctrl-C between the two would meet
            # Python's own and raise KeyboardInterrupt in the middle of the set-up.
            for signum, handler in early._previous.items():
                if signum in self._previous:
                    self._previous[signum] = handler  # what ``restore`` puts back: the one before both
                elif not (signum == signal.SIGTERM and pool):  # JAX's notifier holds it now
                    signal.signal(signum, handler)
            if early.received is not None:  # it came first (no handler of early's is left to be called)
                self.received, self._at, self._passed_on = early.received, early._at, early._passed_on
        return self

    def restore(self) -> None:
        """Put back the handlers ``install`` replaced (submitit's, for one). In a job's task (a
        submitit job) SIGINT is ignored from here on instead: the run has ended, and what is left of
        the process (submitit writing the result, the exit handlers: JAX's clears its backends and
        leaves the pool) must not meet a KeyboardInterrupt from a late Ctrl-C, the terminal's or
        ``watch_launcher``'s passing on of it. The launching process answers that Ctrl-C itself."""
        for signum, handler in self._previous.items():
            in_a_job = signum == signal.SIGINT and os.environ.get("SUBMITIT_EXECUTOR")
            signal.signal(signum, signal.SIG_IGN if in_a_job else handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        again = signum == signal.SIGINT and self.received == signal.SIGINT and time.monotonic() - self._at > ECHO_S
        if again and not os.environ.get("SUBMITIT_EXECUTOR"):
            raise KeyboardInterrupt  # Ctrl-C twice on a run alone: stop now, without the checkpoint
        if again:  # a job's task finishes its save whatever comes: its launcher is waiting for it
            log.warning("SIGINT again: ignored; the checkpoint is being saved and the run stops after it")
        if self.received is not None:
            return
        self.received, self._at = signum, time.monotonic()
        log.warning(
            "%s received: the run saves a checkpoint at the next step boundary and stops%s",
            signal.Signals(signum).name,
            " (Ctrl-C again stops at once)"
            if signum == signal.SIGINT and not os.environ.get("SUBMITIT_EXECUTOR")
            else "",
        )
        self._pass_on()

    def _pass_on(self) -> None:
        """In a pool, tell every process which signal came and hand it to JAX's notifier as a
        SIGTERM, which agrees on the step (before this process's first step boundary: at it)."""
        if self._ended or self._passed_on or self.received is None or not self._stepped or not self._pool():
            return
        self._passed_on = True
        client = compat.jax_distributed_client()
        try:
            client.key_value_set(SIGNAL_KEY, str(int(self.received)))
        except Exception:
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    def _agreed_signal(self) -> None:
        """At the agreed step: the signal the first signalled process recorded, else SIGTERM (JAX's
        notifier was told directly: a scheduler's stop to every process)."""
        client = compat.jax_distributed_client()
        recorded = compat.key_value_or_none(client, SIGNAL_KEY)
        self.received = int(recorded) if recorded else (self.received or signal.SIGTERM)
        self.timed_out = self.timed_out or compat.key_value_or_none(client, MAX_TIME_KEY) is not None

    def stop_at(self, step: int) -> bool:
        """Whether the run stops after ``step`` (on a signal, or ``requested``): called once per
        step, with increasing steps."""
        if self.requested is not None:
            return True
        self._expired()
        if self._pool():
            from jax.experimental import multihost_utils

            reached = multihost_utils.reached_preemption_sync_point(step)
            # JAX agrees on the step after the highest one the processes reported: a signal that came
            # before this process reported one (before the pool, during the compilation) is passed on
            # only now, or the agreed step would be one a resumed run never reaches.
            self._stepped = True
            self._pass_on()
            if reached:
                self._agreed_signal()
                return True
            return False
        return self.received is not None

    def settle(self, step: int, *, timeout_s: float = 60) -> None:
        """Where the loop ended, at ``step`` (its last step, or a stop request's), on every process:
        no signal is passed on to JAX's notifier from here on, and a notice a process passed on (or
        a scheduler's SIGTERM that JAX's notifier caught) after the last agreement is answered by
        every process's preemption sync manager before any process goes on to leave the pool."""
        self._ended = True  # the handler runs in this thread: no pass-on after this line
        if not self._pool():
            return
        import jax

        barrier(f"dew/loop_ended/{step}")  # any pass-on came before: none can come after
        client = compat.jax_distributed_client()
        # set before the SIGTERM that JAX's notifier then catches within a second (_pass_on)
        passed_on = compat.key_value_or_none(client, SIGNAL_KEY) is not None
        deadline = time.monotonic() + timeout_s
        while True:
            noticed, answered = compat.preemption_notice_in_pool(client, jax.process_count())
            if answered or not (noticed or passed_on):
                return
            if time.monotonic() > deadline:
                log.warning(
                    "a stop signal came as the run ended and JAX's preemption notice has not reached every "
                    "process in %.0f s: leaving the pool may wait for JAX's preemption barrier (3 minutes)",
                    timeout_s,
                )
                return
            time.sleep(0.05)  # JAX's notifier looks for its SIGTERM once a second

    @property
    def reason(self) -> str:
        """``stop`` event reason: a process told only by JAX's notifier was preempted (SIGTERM)."""
        if self.timed_out:
            return MAX_TIME
        return REASONS.get(self.received, "preempted") if self.received else "preempted"
