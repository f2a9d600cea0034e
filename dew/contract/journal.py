"""The one reader of a run's journal: ``read`` (``parse`` for lines). ``dew-runs`` takes the records
that still count, the run's lifecycle and its metric series from it; the trainer takes the run's
history (``JournalView.history``, ``read_journal``) when it resumes.

The journal is append-only (docs/journal.md). A resumed run restarts from its checkpoint at step
``s`` and writes a ``resume`` event there, so the metric records and evaluation/checkpoint events
with a step past ``s`` that came before it were written by a process whose work was lost: they are
superseded. This reader drops them itself, whether or not the writer already did, so it reads
journals written by every dew version alike. Lifecycle events (start, resume, stop, end,
checkpoint_fallback) are always kept: they are the run's history.

A line that is not a JSON object with an integer ``step`` is skipped only where a killed process
leaves one: as the last line, or right before a ``start`` or ``resume`` event (the writer that comes
next ends the cut-off line with a newline and writes its own first). Anywhere else it is damage no
dew process makes (an edit, a second writer, a broken disk), and reading raises ``JournalError``
naming the line rather than reporting numbers from a journal it cannot trust (docs/journal.md).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

from etils import epath

from dew.contract.rundir import EARLY_STOP, JOURNAL_VERSION, LIFECYCLE


class JournalError(ValueError):
    """A journal that cannot be read; the message says where and why."""


@dataclasses.dataclass
class JournalView:
    """What a journal says about its run, superseded records removed."""

    records: list[dict[str, Any]]
    """Metric records and events, in order, without the superseded ones."""
    events: list[dict[str, Any]]
    """Every event that counts, in order (lifecycle events always)."""
    version: int | None
    """The format version the last start/resume event declares; None for journals written before
    dew versioned them (the same format as version 1)."""
    partial_tail: bool = False
    """The last line was cut off mid-write (a process killed while writing it) and was skipped."""
    written: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Every record as written, in order (cut-off lines left out)."""
    cut_off: list[int] = dataclasses.field(default_factory=list)
    """The numbers (from 1) of the lines cut off mid-write and skipped."""
    terminated: bool = True
    """The text ends with a newline (or is empty): a record appended starts a line of its own."""
    _by_metric: dict[str, dict[int, float]] | None = dataclasses.field(default=None, repr=False, compare=False)

    def series(self, metric: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, in step order, one value per step (the latest)."""
        by_step = self._metrics().get(metric, {})
        steps = sorted(by_step)
        return steps, [by_step[s] for s in steps]

    def metric_names(self) -> list[str]:
        return list(self._metrics())

    def _metrics(self) -> dict[str, dict[int, float]]:
        """Every metric's values by step, gathered in one pass over the records (and kept)."""
        if self._by_metric is None:
            self._by_metric = {}
            for r in self.records:
                if "event" in r:
                    continue
                step = r["step"]
                for key, v in r.items():
                    if key != "step" and key != "time":
                        self._by_metric.setdefault(key, {})[step] = _number(v)
        return self._by_metric

    def history(self) -> list[dict[str, Any]]:
        """The run's history as the trainer resumes it: each step as its latest segment logged it. A
        ``start`` event drops everything before it; a ``resume`` event at step s drops what came
        before it at steps past s, and an earlier ``end``."""
        kept: list[dict[str, Any]] = []
        for record in self.written:
            if record.get("event") == "start":
                kept = []
            elif record.get("event") == "resume":
                s = record["step"]
                kept = [r for r in kept if r.get("step", 0) <= s and r.get("event") != "end"]
            kept.append(record)
        return kept

    def lifecycle(self) -> dict[str, Any] | None:
        """The last start, resume, stop or end event: what the run last said about itself."""
        for event in reversed(self.events):
            if event["event"] in ("start", "resume", "stop", "end"):
                return event
        return None

    def early_stop(self) -> dict[str, Any] | None:
        """The ``early_stop`` event of a run that ended early: the one right before its last ``end``
        (None when the run ran its whole length, or has not ended)."""
        ended = False
        for event in reversed(self.events):
            kind = event["event"]
            if kind == "end" and not ended:
                ended = True
            elif ended and kind == EARLY_STOP:
                return event
            elif ended and kind in ("start", "resume", "stop", "end"):
                return None
        return None

    def last_step(self) -> int:
        return max((int(r.get("step", 0)) for r in self.records), default=0)

    def total_steps(self) -> int | None:
        for event in reversed(self.events):
            if event["event"] in ("start", "resume") and "total_steps" in event:
                return int(event["total_steps"])
        return None

    def wall_time(self) -> float | None:
        """Seconds the run's processes spent, summed over its segments (start or resume to the last
        record with a time in that segment)."""
        total, begin, last = 0.0, None, None
        for r in self.records:
            t = r.get("time")
            if not isinstance(t, (int, float)):
                continue
            if r.get("event") in ("start", "resume"):
                if begin is not None and last is not None:
                    total += last - begin
                begin = last = t
            elif begin is not None:
                last = t
        if begin is not None and last is not None:
            total += last - begin
        return total if begin is not None else None


def _number(value: object) -> float:
    """A metric value; the journal writes non-finite floats as the strings 'nan', 'inf', '-inf'."""
    if type(value) is float:
        return value
    if not isinstance(value, str | int | float):
        return math.nan
    try:
        return float(value)
    except ValueError:
        return math.nan


def _decode(lines: list[str], where: str) -> tuple[list[tuple[int, dict[str, Any]]], list[int]]:
    """The records of ``lines`` with their line numbers, and the numbers of the lines cut off
    mid-write (skipped: the last line, or one right before a ``start``/``resume`` event)."""
    numbers = [n for n, line in enumerate(lines, 1) if line.strip()]
    try:  # one parse of the whole journal: 1,000 json.loads calls cost several times more
        parsed: list[Any] = json.loads("[" + ",".join(lines[n - 1] for n in numbers) + "]")
        if len(numbers) != len(parsed):  # a line held more than one value ("1, 2"): find it below
            raise ValueError
        values: list[Any] = list(parsed)
    except ValueError:  # json.JSONDecodeError is one
        values = []
        for number in numbers:
            try:
                values.append(json.loads(lines[number - 1]))
            except json.JSONDecodeError:
                values.append(_Bad(number))
    out: list[tuple[int, dict[str, Any]]] = []
    cut: list[int] = []
    for i, (number, record) in enumerate(zip(numbers, values)):
        if not isinstance(record, dict) or not isinstance(record.get("step", 0), int):
            following = values[i + 1] if i + 1 < len(values) else None
            if following is None or (isinstance(following, dict) and following.get("event") in ("start", "resume")):
                cut.append(number)  # the last line of a killed process
                continue
            what = "not JSON" if isinstance(record, _Bad) else "not a journal record (an object with an integer step)"
            raise JournalError(
                f"{where}: line {number} is {what}; only a killed process's last line may be cut "
                "off, and this one is followed by more of the same run"
            )
        out.append((number, record))
    return out, cut


class _Bad:
    """A line that is not JSON."""

    def __init__(self, number: int) -> None:
        self.number = number


def parse(lines: list[str], where: str = "journal", *, terminated: bool = True) -> JournalView:
    """Read journal lines (``read`` takes a path). Raises JournalError for a damaged line (one not
    cut off by a killed process) or a version this dew does not know."""
    records: list[dict[str, Any]] = []
    version: int | None = None
    decoded, cut = _decode(lines, where)
    for number, record in decoded:
        kind = record.get("event")
        if kind in ("start", "resume"):
            version = record.get("journal")
            if version is not None and (not isinstance(version, int) or version > JOURNAL_VERSION):
                raise JournalError(
                    f"{where}: line {number} declares journal version {version!r}; this dew "
                    f"reads versions up to {JOURNAL_VERSION}: upgrade dew to read this run"
                )
        if kind == "resume":
            step = record["step"]
            records = [r for r in records if r.get("event") in LIFECYCLE or r.get("step", 0) <= step]
        records.append(record)
    events = [r for r in records if "event" in r]
    return JournalView(
        records=records,
        events=events,
        version=version,
        partial_tail=len(lines) in cut,
        written=[r for _, r in decoded],
        cut_off=cut,
        terminated=terminated,
    )


def read(path: epath.Path) -> JournalView:
    """Read and parse the journal at ``path``: the only place dew reads a journal."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise JournalError(f"{path}: not text") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline every complete record ends with
    return parse(lines, where=str(path), terminated=not text or text.endswith("\n"))


def read_journal(path: str | os.PathLike[str], *, raw: bool = False) -> list[dict[str, Any]]:
    """The run's history at ``path`` (``JournalView.history``); ``raw`` keeps every record as
    written."""
    view = read(epath.Path(path))
    return view.written if raw else view.history()
