"""The table of runs: the fields that differ between them, filtering, sorting, and the text and
JSON ``dew-runs`` prints."""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

from dew.runs.discover import RunsError
from dew.runs.status import BEST_METRIC, Run, RunSummary

IGNORED_FIELDS = ("trainer.name",)
"""Fields never shown as a difference: the name column already tells runs apart by name."""

COLUMNS = {
    "name": "name",
    "status": "status",
    "step": "step",
    "total_steps": "total_steps",
    "wall": "wall_time",
    "wall_time": "wall_time",
    "examples_per_sec": "examples_per_sec",
    "best_step": "best_step",
    "goodput": "goodput",
}
"""Keys --sort and --where accept besides metrics and config fields, and the summary field each reads."""


def flatten(record: object, prefix: str = "") -> dict[str, Any]:
    """A nested record as dotted paths to leaves (lists stay whole values)."""
    if isinstance(record, dict) and record:
        out: dict[str, Any] = {}
        for key, value in record.items():
            out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: record}


def differing_fields(runs: Sequence[Run]) -> list[str]:
    """The dotted config paths whose values are not the same in every run with a readable record."""
    flat = [flatten(r.record) for r in runs if r.record is not None]
    if len(flat) < 2:
        return []
    keys = sorted({k for f in flat for k in f})
    return [
        k
        for k in keys
        if k not in IGNORED_FIELDS
        and len({json.dumps(f[k], sort_keys=True) if k in f else "<missing>" for f in flat}) > 1
    ]


def fill_fields(runs: Sequence[Run]) -> list[str]:
    """Put each run's differing fields into its summary; returns the field paths."""
    keys = differing_fields(runs)
    for run in runs:
        flat = flatten(run.record) if run.record is not None else {}
        run.summary.fields = {k: flat.get(k) for k in keys}
    return keys


def value(run: Run, key: str) -> Any:
    """What ``key`` means for a run: a column, a metric (eval/loss is its best value, any other metric
    its last) or a config field. None when the run has no such value."""
    s = run.summary
    if key in COLUMNS:
        return getattr(s, COLUMNS[key])
    if key == BEST_METRIC:
        return s.best
    if key in s.final:
        return s.final[key]
    if run.record is not None:
        flat = flatten(run.record)
        if key in flat:
            return flat[key]
    return None


def _known(runs: Sequence[Run], key: str) -> bool:
    return key in COLUMNS or key == BEST_METRIC or any(value(r, key) is not None for r in runs)


OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "!=": operator.ne,
    "==": operator.eq,
    "<": operator.lt,
    ">": operator.gt,
    "=": operator.eq,
}
_WHERE = re.compile(r"^\s*([^<>=!\s]+)\s*(<=|>=|!=|==|<|>|=)\s*(.*?)\s*$")


def _literal(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # a bare word: a string value (status=finished)


def parse_where(expression: str, runs: Sequence[Run]) -> Callable[[Run], bool]:
    """A predicate from ``KEY OP VALUE`` (``optim.learning_rate<1e-3``, ``status=finished``)."""
    match = _WHERE.match(expression)
    if not match:
        raise RunsError(
            f"--where {expression!r}: expected KEY OP VALUE with OP one of "
            f"{', '.join(OPERATORS)} (e.g. optim.learning_rate<1e-3)"
        )
    key, op, text = match.groups()
    if not _known(runs, key):
        raise RunsError(
            f"--where {expression!r}: no run has {key!r}; give a column ({', '.join(sorted(COLUMNS))}), "
            "a metric (eval/loss, train/loss, ...) or a config field (optim.learning_rate, ...)"
        )
    wanted, compare = _literal(text), OPERATORS[op]

    def keep(run: Run) -> bool:
        have = value(run, key)
        if have is None:
            return False
        try:
            return bool(compare(have, wanted))
        except TypeError:  # a number against a word: compare as text
            return bool(compare(str(have), str(wanted)))

    return keep


def sort_runs(runs: Sequence[Run], key: str, *, reverse: bool = False) -> list[Run]:
    """Runs ordered by ``key``; runs without a value for it go last, either way."""
    if not _known(runs, key):
        raise RunsError(
            f"--sort {key!r}: no run has it; give a column ({', '.join(sorted(COLUMNS))}), a metric or a config field"
        )
    have = [r for r in runs if value(r, key) is not None]
    lacking = [r for r in runs if value(r, key) is None]
    try:
        ordered = sorted(have, key=lambda r: value(r, key), reverse=reverse)
    except TypeError:
        ordered = sorted(have, key=lambda r: str(value(r, key)), reverse=reverse)
    return ordered + lacking


# ----------------------------------------------------------------------------------- output


def number(v: object) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return json.dumps(v) if not isinstance(v, str) else v
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def short_names(keys: Sequence[str]) -> dict[str, str]:
    """Column headers for field paths: the last component where that is unambiguous."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def status_text(s: RunSummary) -> str:
    if s.status in ("stopped", "failed") and s.reason:
        short = "no end recorded" if s.reason.startswith("no end recorded") else s.reason.split(":", 1)[0]
        return f"{s.status} ({short})"
    return s.status


def render(runs: Sequence[Run], keys: Sequence[str]) -> str:
    """The table, then one note per run whose status needs explaining."""
    headers = short_names(keys)
    rows = [
        [
            "name",
            "status",
            "step",
            "train/loss",
            f"best {BEST_METRIC}",
            "wall",
            "goodput",
            "ex/s",
            *(headers[k] for k in keys),
        ]
    ]
    for run in runs:
        s = run.summary
        step = "-" if s.step is None else f"{s.step}/{s.total_steps}" if s.total_steps else str(s.step)
        best = "-" if s.best is None else f"{s.best:.4g} @{s.best_step}"
        rows.append(
            [
                s.name,
                status_text(s),
                step,
                number(s.train_loss),
                best,
                duration(s.wall_time),
                "-" if s.goodput is None else f"{100 * s.goodput:.1f}%",  # as dew-runs goodput prints it
                number(s.examples_per_sec),
                *(number(s.fields.get(k)) for k in keys),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    notes = [
        f"  {r.summary.name}: {r.summary.reason}" for r in runs if r.summary.reason and r.summary.status != "finished"
    ]
    return "\n".join(lines + ([""] + notes if notes else []))


def to_json(runs: Sequence[Run]) -> str:
    return json.dumps([r.summary.to_json() for r in runs], indent=1)
