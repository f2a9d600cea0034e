"""CSV (``trainer.trackers.csv``): ``metrics.csv`` beside the journal, a row per metric record of
the journal's history. No library beyond Python's."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dew.contract.config import CSV
from dew.contract.rundir import METRICS_CSV
from dew.contract.trackers import trackers
from dew.training.reporting.trackers import Sink, TrackedRun

if TYPE_CHECKING:
    from etils import epath


@trackers.register("csv")
class CsvSink(Sink):
    """``metrics.csv``: one row per metric record of the journal's history (a step logged twice, the
    report and an evaluation, is two rows, as in the journal), a column per metric in the order
    they first appear. A new metric rewrites the file with its column; a resume rewrites it from the
    journal's history as the reader keeps it (steps past the resumed one dropped), then appends."""

    Options = CSV
    takes_samples = False

    def __init__(self, options: CSV, run: TrackedRun) -> None:
        self.path = run.directory / METRICS_CSV
        # This segment's start event drops every earlier record; its resume event at s drops those past s.
        self.rows = [
            dict(r)
            for r in run.history
            if "event" not in r and run.resume_step is not None and r["step"] <= run.resume_step
        ]
        self.columns: list[str] = ["step", "time"]
        for row in self.rows:
            self._grow(row)
        self._file: Any = None
        self._rewrite()

    @classmethod
    def destination(cls, options: CSV, name: str, tracking: epath.Path) -> str:
        return f"CSV in {tracking / METRICS_CSV}"

    def _grow(self, row: Mapping[str, Any]) -> bool:
        new = [k for k in row if k not in self.columns]
        self.columns += new
        return bool(new)

    def _rewrite(self) -> None:
        """The whole file again (a new column, or the history at a resume), written beside it and
        renamed over it, so a reader never sees half of it."""
        if self._file is not None:
            self._file.close()
        text = io.StringIO()
        writer = csv.DictWriter(text, self.columns, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.parent / f".{self.path.name}.tmp"
        tmp.write_text(text.getvalue())
        tmp.replace(self.path)
        self._file = self.path.open("a", encoding="utf-8")

    def metrics(self, record: Mapping[str, Any]) -> None:
        row = dict(record)
        self.rows.append(row)
        if self._grow(row):
            self._rewrite()
            return
        writer = csv.DictWriter(self._file, self.columns, restval="", lineterminator="\n")
        writer.writerow(row)
        self._file.flush()

    def close(self, ended: str) -> None:
        self._file.close()


def read_csv(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """The rows of a ``metrics.csv`` as numbers (``step`` an int), a metric a row lacks left out."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = []
        for row in csv.DictReader(f):
            rows.append({k: (int(v) if k == "step" else float(v)) for k, v in row.items() if v != ""})
        return rows
