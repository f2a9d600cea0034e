"""A stall watchdog (``trainer.stall_timeout``): every process notices when it has made no progress
for that long, says which process is stuck and where, and ends the job so that it is requeued.

A rank that hangs (a dead NFS mount under a data read or a save, a collective one peer never joins)
holds every other rank, and the allocation, until the job's time limit: JAX's coordination service
declares a process dead only once it stops sending heartbeats (``DEW_HEARTBEAT_TIMEOUT_S``), and a
process that is alive but stuck, or stopped (SIGSTOP, a frozen node), is never declared. The
watchdog is a thread in each process:

- **Progress** is a step ending (the loop's ``before`` the next one), and the start and end of an
  evaluation or a checkpoint save (the run's timed phases). The first step of each start of the run
  (its compilation, or its load from the compilation cache) and the first evaluation and first save
  (the evaluation's compilation) are not timed: a first compilation longer than the timeout does not
  stop the run. Everything else is: a step, a data read, an evaluation or a save that takes longer
  than ``stall_timeout`` is a stall, so set it above the longest of them.
- **Heartbeats.** Every ``tick`` (a quarter of the timeout, at most 10 s) the thread writes its
  process's file under ``<run>/.watchdog/``: its pid and host, its last step and when it made it, and
  the time of writing. A process whose file has not been written for three ticks is not running at
  all (stopped, frozen, its host gone): its thread would have written it.
- **A stall.** When its own process has made no progress for ``stall_timeout``, the thread logs (to
  the console and ``train.log``) which processes are stuck, each process's last step, and the Python
  stacks of every thread of its own process (where a live process is stuck: a read, a collective,
  a lock); process 0 writes a ``stop`` event (reason ``stalled``) to the journal. A process that is
  not running cannot say where it is: it is named, and the live processes' stacks show what they
  wait for. Peers on the same host that are not running are killed (SIGKILL ends a stopped
  process too), so that the job's every process ends.
- **Requeue.** In a submitit job the process then requeues it as a preemption does (the local
  executor: exit status 144, on which its controller starts the tasks again; SLURM: ``scontrol
  requeue``, which ends every task of the job and queues it again), and the run resumes from its last
  checkpoint. A run that stalls again without getting past the step of its previous stall is not
  requeued again (``<run>/.watchdog/stalled.json`` keeps that step). Outside a submitit job, or not
  requeued, the process exits with ``EXIT_STALLED`` (75, ``EX_TEMPFAIL``: a temporary failure, to be
  retried).

Nothing here runs in a step: a beat is an attribute assignment, and the files are written by the
thread. Off by default (``trainer.stall_timeout`` unset).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NoReturn

from etils import epath

from dew.training.hooks import Hook, Started

if TYPE_CHECKING:
    from dew.training.reporting.tracker import Tracker

log = logging.getLogger("dew")

STALLED = "stalled"
"""The journal's ``stop`` reason of a run its watchdog ended."""

WATCHDOG_DIR = ".watchdog"
"""In the run directory: each process's heartbeat file, and the step of the last stall."""

STALL_RECORD = "stalled.json"
"""In ``WATCHDOG_DIR``: the step the run had reached when it last stalled."""

STALE_TICKS = 3
"""A heartbeat file older than this many ticks belongs to a process that is not running."""

MAX_TICK_S = 10.0
"""The longest time between two heartbeats (and between two looks at the clock)."""


def heartbeat_name(process: int) -> str:
    return f"process-{process}.json"


class Watchdog(Hook):
    """``trainer.stall_timeout`` in one process: a hook that beats at each step and around each
    timed phase, and a thread that writes the heartbeat and acts on a stall (``stalled``)."""

    def __init__(
        self,
        timeout_s: float,
        run_dir: epath.Path,
        *,
        process: int,
        count: int,
        stalled: Callable[[Stall], object] | None = None,
    ) -> None:
        super().__init__(every=None)
        self.timeout_s = timeout_s
        self.tick_s = min(timeout_s / 4, MAX_TICK_S)
        self.dir = run_dir / WATCHDOG_DIR
        self.process, self.count = process, count
        self.stalled = stalled or end_stalled
        self.tracker: Tracker | None = None
        self.step = 0
        """The steps this process has completed."""
        self.progress = time.monotonic()
        """When this process last made progress (``time.monotonic``)."""
        self.progress_wall = time.time()
        self.doing = "starting"
        """What the process is doing since its last progress: for the report."""
        self.armed = False
        """False until the first step of this start has run (its compilation is not timed)."""
        self.suspended = 0
        """Open untimed phases (a first evaluation, a first save)."""
        self.seen: set[str] = set()
        """The phases that ran once in this start."""
        self.previous_stall: int | None = None
        """The step of the run's previous stall (``STALL_RECORD``), if it had one."""
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the loop's side (beats)

    def beat(self, doing: str) -> None:
        self.progress, self.progress_wall, self.doing = time.monotonic(), time.time(), doing

    def start(self, started: Started) -> None:
        self.tracker, self.step = started.tracker, started.step
        self.dir.mkdir(parents=True, exist_ok=True)
        record = self.dir / STALL_RECORD
        if record.exists():
            with contextlib.suppress(ValueError, OSError):
                self.previous_stall = int(json.loads(record.read_text())["step"])
        self.beat(f"step {self.step + 1} (its first: compiling, untimed)")
        self._thread = threading.Thread(target=self._watch, name="dew-watchdog", daemon=True)
        self._thread.start()

    def before(self, step: int) -> None:
        """Step ``step`` ended (or the loop starts at it): progress; the first step's end arms the
        watchdog."""
        self.armed = self.armed or step > self.step
        self.step = step
        self.beat(f"step {step + 1}")

    @contextlib.contextmanager
    def around(self, kind: str) -> Iterator[None]:
        """Around an evaluation or a save: progress at its start and end; its first run in this start
        (a compilation) untimed."""
        first = kind not in self.seen
        self.seen.add(kind)
        with self._stretch(
            f"{kind} after step {self.step}" + (" (its first: untimed)" if first else ""), f"the {kind}", first
        ):
            yield

    def untimed(self, doing: str) -> AbstractContextManager[None]:
        """An untimed stretch of the loop that is not a phase of its own (the wait for a start's first
        save to land: ``Saver.wait``): progress at its start and end."""
        return self._stretch(f"{doing} after step {self.step} (untimed)", doing, True)

    @contextlib.contextmanager
    def _stretch(self, doing: str, what: str, untimed: bool) -> Iterator[None]:
        """Progress as ``doing`` starts and after ``what`` ends; untimed in between if ``untimed``."""
        self.beat(doing)
        self.suspended += untimed
        try:
            yield
        finally:
            self.suspended -= untimed
            self.beat(f"after {what} at step {self.step}")

    def timed(
        self, phase: Callable[[str], AbstractContextManager[object]]
    ) -> Callable[[str], AbstractContextManager[object]]:
        """``phase`` (the run report's timed phases) with this watchdog's around it."""

        @contextlib.contextmanager
        def both(kind: str) -> Iterator[None]:
            with phase(kind), self.around(kind):
                yield

        return both

    def close(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=self.tick_s + 5)
        with contextlib.suppress(OSError, ValueError):  # epath: ValueError for a directory not empty
            (self.dir / heartbeat_name(self.process)).unlink()
            self.dir.rmdir()  # where it is empty: no process left, and no stall on record

    # ------------------------------------------------------------------ the thread's side

    def _watch(self) -> None:
        while not self._done.wait(self.tick_s):
            self._write_heartbeat()
            if self.armed and not self.suspended and time.monotonic() - self.progress > self.timeout_s:
                self.stalled(self.report())  # ends the process (a test's may return: watching ends)
                return

    def _write_heartbeat(self) -> None:
        record = {
            "process": self.process,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "step": self.step,
            "progress": self.progress_wall,
            "doing": self.doing,
            "time": time.time(),
        }
        path = self.dir / heartbeat_name(self.process)
        try:
            if os.path.isabs(os.fspath(path)):  # a local or mounted filesystem: written whole, then renamed
                tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    json.dump(record, f)
                os.replace(tmp, os.fspath(path))
            else:  # an object store writes an object whole
                path.write_text(json.dumps(record))
        except OSError as err:  # a filesystem gone: the stall, if it holds the loop too, says so
            log.debug("the watchdog could not write its heartbeat %s: %s", path, err)

    def peers(self) -> list[Peer]:
        """What the other processes' heartbeat files say, now."""
        now, found = time.time(), []
        for process in range(self.count):
            if process == self.process:
                continue
            try:
                record = json.loads((self.dir / heartbeat_name(process)).read_text())
            except (OSError, ValueError):
                found.append(Peer(process, None, None, self.tick_s))
                continue
            found.append(Peer(process, record, now - float(record["time"]), self.tick_s))
        return found

    def report(self) -> Stall:
        """The stall, as the thread sees it: this process, its peers, its threads' stacks."""
        return Stall(
            timeout_s=self.timeout_s,
            process=self.process,
            count=self.count,
            step=self.step,
            idle_s=time.monotonic() - self.progress,
            doing=self.doing,
            peers=self.peers(),
            stacks=thread_stacks(),
            previous_stall=self.previous_stall,
            record=self.dir / STALL_RECORD,
            tracker=self.tracker,
        )


@dataclasses.dataclass
class Peer:
    """Another process of the run, as its heartbeat file shows it (``record``: None where it has
    none) ``age_s`` seconds after it was written."""

    process: int
    record: dict[str, Any] | None
    age_s: float | None
    tick_s: float

    @property
    def running(self) -> bool:
        """Its heartbeat is fresh: its watchdog's thread runs."""
        return self.age_s is not None and self.age_s <= STALE_TICKS * self.tick_s

    @property
    def here(self) -> bool:
        """Its process runs on this host."""
        return self.record is not None and self.record.get("host") == socket.gethostname()

    def describe(self) -> str:
        if self.record is None:
            return f"process {self.process}: no heartbeat file (its loop never started, or it cannot write)"
        where = f"process {self.process} (pid {self.record['pid']} on {self.record['host']})"
        last = f"step {self.record['step']}, then {self.record['doing']}"
        if not self.running:
            age = f"{self.age_s:.0f} s ago"
            return f"{where}: not running (stopped, frozen or gone): its heartbeat stopped {age}, at {last}"
        idle = time.time() - float(self.record["progress"])
        return f"{where}: running, no progress for {idle:.0f} s: {last}"


@dataclasses.dataclass
class Stall:
    """What a process's watchdog found when its timeout passed."""

    timeout_s: float
    process: int
    count: int
    step: int
    """The steps this process had completed."""
    idle_s: float
    doing: str
    peers: list[Peer]
    stacks: str
    """This process's threads' Python stacks."""
    previous_stall: int | None
    record: epath.Path
    """Where the step of this stall is kept (``STALL_RECORD``)."""
    tracker: Tracker | None

    @property
    def stuck(self) -> list[Peer]:
        """The peers that are not running."""
        return [p for p in self.peers if not p.running]

    @property
    def requeue(self) -> bool:
        """Whether a requeue could help: the run got past its previous stall (or had none)."""
        return self.previous_stall is None or self.step > self.previous_stall

    def headline(self) -> str:
        who = "; ".join(f"process {p.process} is not running" for p in self.stuck) or (
            f"process {self.process} of {self.count} is stuck" if self.count > 1 else "the run is stuck"
        )
        return (
            f"stalled: process {self.process} of {self.count} made no progress for {self.idle_s:.0f} s "
            f"(trainer.stall_timeout={self.timeout_s:g} s), after step {self.step}, in {self.doing}; {who}"
        )

    def text(self) -> str:
        lines = [self.headline(), *(f"  {p.describe()}" for p in self.peers)]
        lines.append(f"  the threads of process {self.process} (pid {os.getpid()} on {socket.gethostname()}):")
        lines.append(self.stacks.rstrip())
        return "\n".join(lines)


def thread_stacks() -> str:
    """The Python stack of every thread of this process, innermost call last (as a traceback)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        if names.get(ident) == "dew-watchdog":
            continue
        out.append(f"  Thread {names.get(ident, ident)}:\n")
        out += [f"  {line}" for line in traceback.format_stack(frame)]
    return "".join(out)


def end_stalled(stall: Stall) -> NoReturn:
    """Report ``stall`` (the log, the journal), end the stopped peers on this host, and end this
    process: requeued in a submitit job (unless it stalled at the same step before), else with
    ``EXIT_STALLED``."""
    from dew.launching.stop_exit import EXIT_STALLED, requeue_after_stall

    requeue = stall.requeue
    log.error("%s", stall.text())
    if not requeue:
        log.error(
            "stalled again at step %d, where it stalled before, without getting past it: not requeued", stall.step
        )
    _journal(stall, requeue)
    with contextlib.suppress(OSError):
        stall.record.write_text(json.dumps({"step": stall.step, "time": time.time()}))
    for peer in stall.stuck:
        if peer.here and peer.record is not None:
            pid = int(peer.record["pid"])
            log.error("ending process %d (pid %d): it is not running", peer.process, pid)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    status = requeue_after_stall() if requeue else None
    os._exit(EXIT_STALLED if status is None else status)


def _journal(stall: Stall, requeue: bool) -> None:
    """The ``stop`` event (process 0's journal), written by a thread of its own that is given a few
    seconds: the loop may be stuck holding the journal's file."""
    tracker = stall.tracker
    if tracker is None:
        return
    stuck = [p.process for p in stall.stuck]

    def write() -> None:
        tracker.event("stop", step=stall.step, reason=STALLED, message=stall.headline(), stuck=stuck, requeued=requeue)

    writer = threading.Thread(target=write, name="dew-watchdog-journal", daemon=True)
    writer.start()
    writer.join(timeout=5.0)
