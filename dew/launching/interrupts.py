"""Ctrl-C (and SIGTERM) in the process that launches a sweep (``dew-train -m``), at any moment.

Python's own answer to SIGINT is a ``KeyboardInterrupt`` raised wherever the launching process
happens to be: in Hydra's composition, in submitit's submission, in the wait for the jobs, in the
clean-up after a first one. A second Ctrl-C then lands inside the handling of the first, and the
command ends with tracebacks while its jobs are still saving. So a sweep's launching process takes
both signals with one handler of its own, for its whole life (``install_for_sweep``, from the first
lines of ``dew-train``), and never raises:

- the first signal is recorded and answered with one line; what it means depends on where the
  launch is (``phase``): before any job starts, nothing is started (``CheckedLaunch`` asks
  ``stop_before_start``); while local jobs run, the launcher writes ``stop_file``, which every task
  watches (``dew.launching.local_launcher.watch_launcher``: it stops its run at the next step
  boundary with a checkpoint, as Ctrl-C does), and waits for the jobs to end; after they ended,
  the command ends as it would have;
- every later signal is ignored, with one line saying that the jobs are saving. Only SIGKILL
  (``kill -9``) stops the jobs at once; a checkpoint being written then is left as orbax's
  ``<step>.orbax-checkpoint-tmp`` directory, which a resume ignores, and the newest complete
  checkpoint stays.

Launchers that run their jobs in this process (Hydra's basic launcher) or leave them to a queue
(SLURM) take the signals back (``hand_back``) once their jobs start, and answer them as before.

The command ends through ``ends_at_once`` (around ``dew-train``'s ``main``): where this handler is
still installed, the process ends with ``os._exit`` once its threads and exit handlers are done.
Python's own end would first put SIGINT back to its default action (the signal module's clean-up,
before the interpreter tears down hundreds of modules: Hydra, Optuna, JAX), so a second Ctrl-C
landing in those last tenths of a second would kill the command with SIGINT: no status 130, no line
(seen in CI: a Ctrl-C twice, 0.2 s apart, before any job started).

Lines are written with ``os.write``, not ``print``: a handler runs between two bytecodes of
whatever the process was doing, which may be a ``print`` to the same stream (Python then raises
``RuntimeError: reentrant call``).
"""

from __future__ import annotations

import atexit
import functools
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

from dew import compat

SIGNALS = (signal.SIGINT, signal.SIGTERM)

BEFORE, RUNNING, AFTER = "before", "running", "after"
"""The launch's phases: no job started yet; local jobs running; the jobs ended."""


class LaunchInterrupts:
    """The launching process's handler for ``SIGNALS``: the first signal (``received``) and how
    many came (``count``)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.count = 0
        self.phase = BEFORE
        self.stop_file: str | None = None
        """Written at the first signal while local jobs run: their tasks stop when it appears."""
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}

    def install(self) -> LaunchInterrupts:
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def hand_back(self) -> None:
        """Python's own handlers again (a launcher that answers the signals itself)."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        global _current
        if _current is self:
            _current = None

    @property
    def status(self) -> int:
        """The exit status after the signal: 130 for Ctrl-C, 143 for SIGTERM, as a shell reports."""
        return 128 + (self.received or signal.SIGINT)

    def watch(self, stop_file: str) -> None:
        """Local jobs start now: a signal from here on (or one that came already) writes
        ``stop_file``, which their tasks watch. A ``stop_file`` left by an earlier launch that was
        killed is removed first."""
        self.stop_file, self.phase = stop_file, RUNNING
        try:
            os.remove(stop_file)
        except FileNotFoundError:
            pass
        if self.received is not None:
            self._write_stop_file()

    def ended(self) -> None:
        """The jobs ended: a signal from here on only makes the command's status 130."""
        self.phase = AFTER

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        self.count += 1
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if self.received is not None:
            if self.phase == RUNNING:
                _say(
                    f"{name} again: ignored; a save is in progress: every job is writing its checkpoint "
                    "and stops once it is complete (kill -9 stops them at once, without it)"
                )
            else:
                _say(f"{name} again: ignored; the command is already stopping")
            return
        self.received = signum
        if self.phase == RUNNING:
            self._write_stop_file()
            _say(f"{name}: every job saves a checkpoint at its next step and stops; waiting for the saves")
        elif self.phase == BEFORE:
            _say(f"{name}: stopping before any job starts")
        else:
            _say(f"{name}: the jobs have ended")

    def _write_stop_file(self) -> None:
        assert self.stop_file is not None
        with open(self.stop_file, "w") as f:
            f.write(f"{self.received}\n")


def _say(line: str) -> None:
    os.write(sys.stderr.fileno(), f"dew-train: {line}\n".encode())


_current: LaunchInterrupts | None = None


def is_sweep(argv: list[str]) -> bool:
    """Whether a dew-train command line launches a sweep (Hydra's ``-m``/``--multirun``)."""
    return any(arg in ("-m", "--multirun") for arg in argv)


_whole_process: LaunchInterrupts | None = None
"""The handler ``install_for_sweep`` installed: this process is ``dew-train``'s, launching a sweep."""


def install_for_sweep(argv: list[str]) -> None:
    """In ``dew-train``'s process, first thing: the sweep's handler, for a command that launches one."""
    global _current, _whole_process
    if _current is None and is_sweep(argv):
        _current = _whole_process = LaunchInterrupts().install()


def for_launch() -> LaunchInterrupts:
    """The handler of the process launching local jobs: the sweep's (``install_for_sweep``), or one
    installed now (a launch started from Python, not from ``dew-train``)."""
    global _current
    if _current is None:
        _current = LaunchInterrupts().install()
    return _current


def current() -> LaunchInterrupts | None:
    """The launching process's handler, None where none is installed (a single run, a test)."""
    return _current


def stop_before_start(jobs: int | None = None) -> None:
    """End the command (status 130, one line) if a signal came before this launch started its jobs
    (before the first, or between a search's batches)."""
    if _current is not None and _current.received is not None:
        what = f"none of the sweep's {jobs} jobs was started" if jobs else "no job was started"
        _say(f"interrupted before the launch: {what}; the same command starts them")
        sys.exit(_current.status)


def ends_at_once[F: Callable[..., Any]](main: F) -> F:
    """``main`` of a command that may launch a sweep: where the sweep's handler is installed
    (``install_for_sweep``, the ``dew-train`` process's) and still answers the signals when ``main``
    ends (returns or exits), the process ends at once, with ``main``'s status (a signal's,
    130 or 143, for a ``main`` that ended well after one), once its other threads ended and its exit
    handlers ran (``atexit``, which flushes the logs), without the interpreter's own tear-down: a
    signal now still meets this handler (module doc). Elsewhere (a single run, a launcher that took
    the signals back) ``main`` ends as Python ends it."""

    @functools.wraps(main)
    def run(*args: object, **kwargs: object) -> object:
        try:
            status = main(*args, **kwargs)
        except SystemExit as stop:
            status = stop.code
            if _current is None or _current is not _whole_process:
                raise
        if _current is None or _current is not _whole_process:
            return status
        _end_now(status, _current)

    return run  # type: ignore[return-value]


def _end_now(status: object, signals: LaunchInterrupts) -> NoReturn:
    if status is None or status == 0:
        status = 0 if signals.received is None else signals.status
    end_process(status)


def end_process(status: object) -> NoReturn:
    """End this process now, as ``sys.exit(status)`` at the end of its program would, once its other
    threads ended and its exit handlers ran (``atexit``: logging's flush, JAX's pool shutdown, orbax's
    and wandb's among them), without the interpreter's own tear-down: the garbage collection and
    unloading of every module JAX, Hydra and dew imported (0.3 s of CPU and of wall time in a tiny
    ``dew-train``: bench/exit_time.py, docs/performance.md), and, in a sweep's launching process, the window where
    SIGINT is back to its default action (module doc). What needs closing was closed by the code
    that opened it (or by an exit handler), so nothing is left for a finalizer."""
    if status is None:
        status = 0
    elif not isinstance(status, int):
        print(status, file=sys.stderr)  # sys.exit("message"), as Python reports it
        status = 1
    compat.end_threads()  # the threads' exit hooks, then the wait for them, as Python's own end
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone, a closed stream: nothing left to write to
            pass
    os._exit(status)
