"""``dew-runs diff A B``: how two runs differ, in their records and in their losses."""

from __future__ import annotations

import math

from dew.contract.typed import differences
from dew.runs.discover import RunsError
from dew.runs.status import Run


def first_divergence(a: Run, b: Run, metric: str = "train/loss") -> tuple[int | None, int]:
    """(the first step both journals logged ``metric`` at with different values, or None; the number
    of steps both logged). Values are compared exactly: a resumed run that matches its uninterrupted
    twin matches bit for bit."""
    if a.journal is None or b.journal is None:
        return None, 0
    sa, va = a.journal.series(metric)
    sb, vb = b.journal.series(metric)
    theirs = dict(zip(sb, vb))
    shared = 0
    for step, mine in zip(sa, va):
        if step not in theirs:
            continue
        shared += 1
        other = theirs[step]
        if mine != other and not (math.isnan(mine) and math.isnan(other)):
            return step, shared
    return None, shared


def diff_text(a: Run, b: Run, metric: str = "train/loss") -> str:
    """The fields that differ (dotted paths, A's value -> B's) and where the losses part."""
    for run in (a, b):
        if run.record is None:
            raise RunsError(f"{run.summary.path}: {run.summary.reason}")
    fields = differences(a.record, b.record)
    lines = [f"A: {a.summary.path}", f"B: {b.summary.path}"]
    lines += (
        (["fields that differ (A -> B):"] + [f"  {d}" for d in fields]) if fields else ["the records are identical"]
    )
    step, shared = first_divergence(a, b, metric)
    if a.journal is None or b.journal is None:
        missing = a if a.journal is None else b
        lines.append(f"{metric}: no journal for {missing.summary.path}")
    elif shared == 0:
        lines.append(f"{metric}: no step logged by both")
    elif step is None:
        lines.append(f"{metric}: identical at all {shared} steps both logged")
    else:
        va = dict(zip(*a.journal.series(metric)))[step]
        vb = dict(zip(*b.journal.series(metric)))[step]
        lines.append(f"{metric}: first differs at step {step} ({va:.6g} -> {vb:.6g})")
    return "\n".join(lines)
