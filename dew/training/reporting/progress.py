"""What the console shows while a run trains: a line at the first steps and then every
``trainer.log_every`` steps, each with the time spent and the time left; on a terminal, a live line
under them that moves while a step runs.

The first steps: 1, 2, 5, 10, 20, 50, ... steps after the step the run started (or resumed) at, a
1-2-5 ladder, while it is below ``log_every``; from there on a line every ``log_every`` steps and at
the last, with the journal's records (the journal keeps its cadence: the ladder is for the person
watching). A line reads ``step 5/1000  loss 2.31  grad_norm 0.52  lr 0.0001  1.03 s/step  elapsed
36.1 s  eta 17.1 min``: the rate is that of the steps since the first one (the compiling step left
out; evaluations and checkpoints since then kept in, as they recur), and the ETA the steps left at
that rate. ``trainer.epochs`` is a number of steps by the time the run starts (``Setup.total_steps``),
so the ETA is to the end of the last epoch. The lines are log records of the ``dew.progress`` logger:
plain text on the console, in ``train.log``, wherever logging goes.

A line's metrics are fetched as the journal's are (a late hook, ``dew.training.hooks``): one step
late while steps are short, at the step's end once they are long (``Pace.long``: the loop then
waits for every step anyway, so the fetch waits for nothing). A line thus comes at most one short
step after its step, or at its end.

On a terminal (standard error a TTY, ``TERM`` not ``dumb``), outside a Hydra multirun and a SLURM or
submitit job, a live line (rich) under the log says which step runs, for how long, and the ETA,
redrawn every second; the log's lines print above it, and it is gone when the run ends. The console
handler at WARNING (``+hydra.job_logging.handlers.console.level=WARNING``) leaves the console to
warnings, the live line off, and ``train.log`` as it was; the ``dew.progress`` logger at WARNING turns
the lines off everywhere.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TextIO

from dew.training.hooks import At, Hook, Started

if TYPE_CHECKING:
    from dew.training.step import TrainState

log = logging.getLogger("dew.progress")

SHOWN = ("train/loss", "train/grad_norm", "train/lr")
"""The metrics a progress line shows."""

REFRESH_PER_SECOND = 1.0
"""How often the live line is redrawn."""


def ladder(below: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ...: the steps into a run that get a line, below ``below``."""
    out: list[int] = []
    decade = 1
    while True:
        for m in (1, 2, 5):
            if m * decade >= below:
                return out
            out.append(m * decade)
        decade *= 10


def duration(seconds: float) -> str:
    return (
        f"{seconds:.1f} s"
        if seconds < 120
        else f"{seconds / 60:.1f} min"
        if seconds < 7200
        else f"{seconds / 3600:.1f} h"
    )


def pace(steps_per_second: float) -> str:
    """Steps/s, or s/step where a step takes longer than a second."""
    if steps_per_second >= 1:
        return f"{steps_per_second:.3g} steps/s"
    return f"{1 / steps_per_second:.3g} s/step"


class Progress(Hook):
    """The progress lines (the ladder, then ``every`` steps) and, on a terminal, the live line."""

    late = True

    def __init__(self, every: int, total_steps: int) -> None:
        super().__init__(every)
        self.total = total_steps
        self.early: frozenset[int] = frozenset()
        """The ladder's steps (absolute), set at the start."""
        self.t0 = time.perf_counter()
        self.first: tuple[int, float] | None = None
        """The first step reported and when: where the rate is measured from."""
        self.rate: float | None = None
        """Steps/s since the first step reported, as of the last line."""
        self.done = (0, self.t0)
        """The steps done and when the last one was (the loop's view, before each dispatch)."""
        self.shown = ""
        """The last line's metrics."""
        self.live: LiveLine | None = None

    def start(self, started: Started) -> None:
        self.t0 = time.perf_counter()
        self.done = (started.step, self.t0)
        self.early = frozenset(started.step + n for n in ladder(self.every or 1))
        if on_a_terminal(sys.stderr):
            self.live = LiveLine(self.status, sys.stderr)

    def due(self, step: int, last: bool) -> bool:
        return super().due(step, last) or step in self.early

    def before(self, step: int) -> None:
        self.done = (step, time.perf_counter())

    def on_step(self, at: At) -> None:
        now = time.perf_counter()
        if at.last:  # no dispatch follows the last step: the live line learns of its end here
            self.done = (at.step, now)
        if self.first is None:
            self.first = (at.step, now)
        elif at.step > self.first[0] and now > self.first[1]:
            self.rate = (at.step - self.first[0]) / (now - self.first[1])
        self.shown = "  ".join(f"{k.split('/', 1)[-1]} {at.metrics[k]:.4g}" for k in SHOWN if k in at.metrics)
        timing = [f"elapsed {duration(now - self.t0)}"]
        if self.rate is not None:
            timing = [pace(self.rate), *timing, f"eta {duration((self.total - at.step) / self.rate)}"]
        log.info("step %d/%d  %s  %s", at.step, self.total, self.shown, "  ".join(timing))

    def on_eval(self, step: int, values: Mapping[str, float], state: TrainState) -> None:
        if values:  # a run with no held-out split evaluates nothing: no line
            log.info("step %d/%d  %s", step, self.total, "  ".join(f"{k} {v:.4g}" for k, v in values.items()))

    def status(self) -> str:
        """The live line: the step running, for how long, the time spent and left, the last metrics."""
        now = time.perf_counter()
        step, since = self.done
        if step >= self.total:
            running = f"step {step}/{self.total} done; evaluating, saving"
        else:
            compiling = " (compiling)" if self.first is None else ""
            running = f"step {step + 1}/{self.total}{compiling} running {duration(now - since)}"
        parts = [running, f"elapsed {duration(now - self.t0)}"]
        if self.rate is not None and step < self.total:
            left = max((self.total - step) / self.rate - (now - since), 0.0)
            parts += [pace(self.rate), f"eta {duration(left)}"]
        return "  ".join([*parts, self.shown] if self.shown else parts)

    def close(self) -> None:
        if self.live is not None:
            self.live.close()
            self.live = None


def on_a_terminal(stream: TextIO) -> bool:
    """Whether the live line goes on ``stream``: a terminal that moves its cursor, in a run of its
        own (not a Hydra multirun's job, a SLURM or submitit job, whose output is a log read later),
        with the progress lines wanted (the ``dew.progress`` logger at INFO, and a handler that writes to
    ``stream`` at INFO: ``+hydra.job_logging.handlers.console.level=WARNING`` quiets both)."""
    if not _is_tty(stream):
        return False
    if os.environ.get("TERM", "") in ("dumb", "unknown"):
        return False
    if any(k in os.environ for k in ("SLURM_JOB_ID", "SUBMITIT_EXECUTOR")):
        return False
    hydra = sys.modules.get("hydra.core.hydra_config")  # loaded by dew-train; a notebook has no Hydra job
    if hydra is not None and hydra.HydraConfig.initialized():
        from hydra.types import RunMode

        if hydra.HydraConfig.get().mode == RunMode.MULTIRUN:
            return False
    writers = _writing_to(stream)
    return log.isEnabledFor(logging.INFO) and (not writers or any(h.level <= logging.INFO for h in writers))


class LiveLine:
    """A status line at the bottom of a terminal, redrawn every second (rich's ``Live``). While it
    shows, logging's handlers that write to that terminal write through rich, so each log line
    prints above the status line instead of over it; they get their stream back at ``close``."""

    def __init__(self, status: Callable[[], str], stream: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        self.stream = stream
        self.live = Live(
            get_renderable=lambda: Text(status(), no_wrap=True, overflow="ellipsis"),
            console=Console(file=stream, soft_wrap=True),  # a log line stays one line, however long
            refresh_per_second=REFRESH_PER_SECOND,
            transient=True,
            redirect_stdout=_is_tty(sys.stdout),  # stdout to a file stays there
            redirect_stderr=True,
        )
        self.live.start()
        self.moved = _writing_to(stream)
        for handler in self.moved:
            handler.setStream(sys.stderr)  # rich's proxy of the terminal, while the live line shows

    def close(self) -> None:
        self.live.stop()
        for handler in self.moved:
            handler.setStream(self.stream)


def _writing_to(stream: TextIO) -> list[logging.StreamHandler]:
    """logging's handlers that write to ``stream`` (Hydra's console handler, on the root logger)."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return [
        h
        for logger in loggers
        if isinstance(logger, logging.Logger)
        for h in logger.handlers
        if isinstance(h, logging.StreamHandler) and h.stream is stream
    ]


def _is_tty(stream: TextIO | None) -> bool:
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # not a file, or a closed one
        return False
