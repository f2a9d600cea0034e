"""A run's journal as ``dew-runs`` reads it: the records that still count, the run's lifecycle and
its metric series.

The journal is append-only (docs/journal.md). A resumed run restarts from its checkpoint at step
``s`` and writes a ``resume`` event there, so the metric records and evaluation/checkpoint events
with a step past ``s`` that came before it were written by a process whose work was lost: they are
superseded. This reader drops them itself, whether or not the writer already did, so it reads
journals written by every dew version alike. Lifecycle events (start, resume, stop, end,
checkpoint_fallback) are always kept: they are the run's history.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from etils import epath

from dew.contract.rundir import JOURNAL_VERSION, LIFECYCLE


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

    def lifecycle(self) -> dict[str, Any] | None:
        """The last start, resume, stop or end event: what the run last said about itself."""
        for event in reversed(self.events):
            if event["event"] in ("start", "resume", "stop", "end"):
                return event
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


def _number(value: Any) -> float:
    """A metric value; the journal writes non-finite floats as the strings 'nan', 'inf', '-inf'."""
    if type(value) is float:
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def parse(lines: list[str], where: str = "journal") -> JournalView:
    """Read journal lines (``read`` takes a path). Raises JournalError for a damaged line or a
    version this dew does not know."""
    records: list[dict[str, Any]] = []
    partial = False
    version: int | None = None
    numbers = [n for n, line in enumerate(lines, 1) if line.strip()]
    try:  # one parse of the whole journal: 1,000 json.loads calls cost several times more
        parsed: list[Any] = json.loads("[" + ",".join(lines[n - 1] for n in numbers) + "]")
    except json.JSONDecodeError:
        parsed, numbers = [], []
        for number, line in enumerate(lines, 1):  # find the bad line, or a cut-off tail
            if not line.strip():
                continue
            try:
                parsed.append(json.loads(line))
                numbers.append(number)
            except json.JSONDecodeError as err:
                if number == len(lines):  # the tail of a process killed mid-write
                    partial = True
                    continue
                raise JournalError(f"{where}: line {number} is not JSON ({err.msg})") from None
    if len(numbers) != len(parsed):  # a line held more than one value ("1, 2"): none is a record
        raise JournalError(f"{where}: a line holds more than one JSON value")
    for number, record in zip(numbers, parsed):
        if not isinstance(record, dict) or not isinstance(record.get("step", 0), int):
            raise JournalError(f"{where}: line {number} is not a journal record (an object with an integer step)")
        kind = record.get("event")
        if kind in ("start", "resume"):
            version = record.get("journal")
            if version is not None and (not isinstance(version, int) or version > JOURNAL_VERSION):
                raise JournalError(f"{where}: line {number} declares journal version {version!r}; this dew "
                                   f"reads versions up to {JOURNAL_VERSION}: upgrade dew to read this run")
        if kind == "resume":
            step = record["step"]
            records = [r for r in records if r.get("event") in LIFECYCLE or r.get("step", 0) <= step]
        records.append(record)
    events = [r for r in records if "event" in r]
    return JournalView(records=records, events=events, version=version, partial_tail=partial)


def read(path: epath.Path) -> JournalView:
    """Read and parse the journal at ``path``."""
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise JournalError(f"{path}: not text") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline every complete record ends with
    return parse(lines, where=str(path))
