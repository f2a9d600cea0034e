"""One run read from its files: its record, its journal, its state and the numbers a table shows.

The state comes from the files alone, in this order:

* running: a live process holds the run directory's lock (``dew.contract.lock.holder``);
* damaged: ``run.json`` is missing or unreadable, or the journal cannot be read;
* finished: the journal's last word is ``end``;
* stopped early: its last word is ``end`` right after an ``early_stop`` event (``trainer.early_stopping``
  ended it, or a hook's stop request), with the event's reason and message; as final as finished;
* stopped / failed: its last word is a ``stop`` event: preempted and interrupted runs stopped on a
  signal, ``nonfinite`` and ``error`` ones failed, with the event's message as the reason;
* stopped (no end recorded): the journal stops after a start or resume, nobody holds the lock, so
  the process is gone without a word: killed (SIGKILL, out of memory, a lost node) or crashed. A
  resume with the same command continues from the latest checkpoint;
* never started: a record, but no journal and no checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from typing import Any

from etils import epath

from dew.contract import journal as journals
from dew.contract.config import NoRunRecord, RunRecord, RunRecordError
from dew.contract.lock import describe, holder
from dew.contract.rundir import BEST_METRIC, FAILURES, RUN_RECORD
from dew.runs.discover import checkpoint_steps, find_journal
from dew.runs.goodput import ledger

STOPPED_EARLY = "stopped early"
"""The state of a run that a stop request ended before its last step (``rundir.EARLY_STOP``)."""

ENDED = ("finished", STOPPED_EARLY)
"""The states of a run that is over: the same command trains nothing more."""


@dataclasses.dataclass
class RunSummary:
    """The row ``dew-runs`` prints for a run, and the object ``--json`` writes."""

    name: str
    path: str
    status: str
    """running, finished, stopped early, stopped, failed, never started, damaged or unknown (no journal
    found)."""
    reason: str | None = None
    """Why it stopped or failed, what is damaged, or who is running it."""
    step: int | None = None
    """The last step the run reported (or, without a journal, its latest checkpoint)."""
    total_steps: int | None = None
    train_loss: float | None = None
    """The last logged train/loss."""
    best: float | None = None
    """The lowest eval/loss (the metric the best checkpoint is kept by)."""
    best_step: int | None = None
    wall_time: float | None = None
    """Seconds, summed over the run's processes (resumes included)."""
    examples_per_sec: float | None = None
    """The median of the logged perf/examples_per_sec."""
    goodput: float | None = None
    """The share of the run's wall time spent training steps that count (``dew-runs goodput``: the
    ``train`` bucket over the wall time); None without a journal."""
    final: dict[str, float] = dataclasses.field(default_factory=dict)
    """Each metric's last logged value."""
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The config fields in which this run differs from the others listed (dotted paths)."""
    checkpoints: list[int] = dataclasses.field(default_factory=list)
    journal: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict: a non-finite number (a diverged loss) becomes null."""

        def safe(v: object) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None
            return {k: safe(x) for k, x in v.items()} if isinstance(v, dict) else v

        return safe(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> RunSummary:
        return cls(**values)


@dataclasses.dataclass
class Run:
    """A run as read from its files: the summary plus the record and journal behind it."""

    summary: RunSummary
    record: dict[str, Any] | None
    journal: journals.JournalView | None
    path: epath.Path


def read_record(path: epath.Path) -> tuple[dict[str, Any] | None, str | None]:
    """(record, problem): the run's ``run.json`` as written (``RunRecord``), or what is wrong with it."""
    try:
        return RunRecord.read(path).values, None
    except NoRunRecord as err:
        return None, f"{err.reason} (the directory holds {_contents(path)})"
    except RunRecordError as err:
        return None, f"{RUN_RECORD} is unreadable: {err.reason}"


def _contents(path: epath.Path) -> str:
    try:
        names = sorted(p.name for p in path.iterdir())
    except OSError:
        return "nothing readable"
    return ", ".join(names[:6]) + (", ..." if len(names) > 6 else "") if names else "nothing"


def read_run(path: epath.Path, name: str, *, tracking: str | None = None) -> Run:
    """Read one run directory; never raises for what is wrong with it (that becomes its status)."""
    summary = RunSummary(name=name, path=os.fspath(path), status="unknown", checkpoints=checkpoint_steps(path))
    record, problem = read_record(path)
    live = holder(path)
    view, journal_problem = None, None
    journal_path = find_journal(path, tracking)
    if journal_path is not None:
        summary.journal = os.fspath(journal_path)
        try:
            view = journals.read(journal_path)
        except (journals.JournalError, OSError) as err:
            journal_problem = str(err)
    if view is not None:
        _fill_numbers(summary, view)
    elif summary.checkpoints:
        summary.step = summary.checkpoints[-1]
    if record is not None and summary.total_steps is None:
        summary.total_steps = record["trainer"].get("steps")

    if live is not None:
        summary.status, summary.reason = "running", describe(live)
    elif problem or journal_problem:
        summary.status, summary.reason = "damaged", problem or journal_problem
    elif view is not None:
        summary.status, summary.reason = _state(view)
    elif summary.checkpoints:
        summary.status, summary.reason = (
            "unknown",
            (
                "checkpoints but no journal found in a tracking/ directory beside any parent of the run "
                "(written elsewhere? give it with --tracking DIR)"
            ),
        )
    else:
        summary.status = "never started"
    return Run(summary=summary, record=record, journal=view, path=path)


def _state(view: journals.JournalView) -> tuple[str, str | None]:
    last = view.lifecycle()
    if last is None:
        return "stopped", "the journal holds no start event"
    kind = last["event"]
    if kind == "end":
        early = view.early_stop()
        if early is not None:
            return STOPPED_EARLY, f"{early.get('reason', 'unknown')}: {early.get('message', '')}".rstrip(": ")
        return "finished", None
    if kind == "stop":
        reason = str(last.get("reason", "unknown"))
        message = last.get("message")
        text = f"{reason}: {message}" if message else reason
        return ("failed" if reason in FAILURES else "stopped"), text
    return "stopped", (
        "no end recorded: the process is gone without a word (killed, e.g. SIGKILL or "
        "out of memory, or crashed); the same command resumes it from its latest checkpoint"
    )


def _fill_numbers(summary: RunSummary, view: journals.JournalView) -> None:
    summary.step = view.last_step()
    summary.total_steps = view.total_steps()
    summary.wall_time = view.wall_time()
    for metric in view.metric_names():
        steps, values = view.series(metric)
        if values:
            summary.final[metric] = values[-1]
        if metric == BEST_METRIC:
            finite = [(v, s) for s, v in zip(steps, values) if math.isfinite(v)]
            if finite:
                summary.best, summary.best_step = min(finite)
    summary.train_loss = summary.final.get("train/loss")
    _, rates = view.series("perf/examples_per_sec")
    if rates:
        summary.examples_per_sec = statistics.median(rates)
    if view.written:
        summary.goodput = ledger(summary.name, view.written).goodput
