"""Where a run's hours went: the goodput ledger (``dew-runs goodput``), read from its journal alone.

A run is one or more *starts* (a start and each resume: one process, or one process pool, from its
launch to its stop or end). Each start's ``start``/``resume`` event names when it was launched
(``began``: its process's start for a dew command or a job a dew launcher submitted, its set-up's
for a run trained from Python), and its ``stop`` or ``end`` event where that start's wall time went (``spent``,
``dew.training.reporting.summary.RunReport.ledger``): ``startup`` (the interpreter, composing, the
data, the model, the restore), ``compile`` (the first step), ``data`` (the loop waiting for
batches), ``eval``, ``checkpoint`` (saves blocking the loop) and ``train`` (the steps, and the host's
work between them). The ledger adds the starts up and adds two buckets of its own:

- ``lost``: steps trained and then trained again. A start that stopped, crashed or was killed past
  the checkpoint the next start resumed from trained those steps for nothing: their number times
  that start's median step time (from its journal's consecutive training records) moves from its
  ``train`` to ``lost``.
- ``between``: the time from one start's last record to the next start's process start (a queue's
  wait, a requeue, a run resumed by hand later).

A start that was killed (SIGKILL, a node lost) wrote no ``spent``: its time from its process start
to its ``start`` event is ``startup``, from there to its last record ``unrecorded`` (less what is
``lost``). The buckets add up to the run's wall time, from its first process start to its last
record; ``goodput`` is ``train`` over that wall time. A journal written before dew recorded these
(no ``began``) counts each start from its ``start`` event.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

BUCKETS = ("between", "startup", "compile", "data", "train", "eval", "checkpoint", "unrecorded", "lost")
"""The ledger's buckets, in the order a run meets them."""
SPENT = ("startup", "compile", "data", "train", "eval", "checkpoint")
"""The buckets a start's ``stop``/``end`` event records (``spent``)."""


@dataclasses.dataclass
class Start:
    """One start of a run, as its journal shows it."""

    began: float
    """Its process's start (or its ``start`` event's time, in an older journal)."""
    first_step: int
    """The step it started from."""
    records: list[dict[str, Any]]
    """Its records in order, its start or resume event first."""

    @property
    def last_time(self) -> float:
        return max(float(r.get("time", self.began)) for r in self.records)

    @property
    def last_step(self) -> int:
        return max([self.first_step, *(int(r["step"]) for r in self.records if "step" in r)])

    @property
    def spent(self) -> Mapping[str, float] | None:
        """What its stop or end event recorded (None for a start killed before it wrote one)."""
        ends = [r for r in self.records if r.get("event") in ("stop", "end") and "spent" in r]
        return ends[-1]["spent"] if ends else None

    def step_seconds(self) -> float | None:
        """The median time of its steps, from consecutive training records (a step's time, the
        host's work around it included); None with fewer than two."""
        trained = [(int(r["step"]), float(r["time"])) for r in self.records if "train/loss" in r]
        per = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in itertools.pairwise(trained) if s1 > s0]
        return statistics.median(per) if per else None


@dataclasses.dataclass
class Ledger:
    """One run's wall time by bucket (seconds), and what it trained."""

    name: str
    seconds: dict[str, float]
    wall: float
    """From its first process start to its last record."""
    starts: int
    lost_steps: int
    final_step: int

    @property
    def goodput(self) -> float:
        return self.seconds["train"] / self.wall if self.wall > 0 else 0.0


def starts_of(written: Sequence[Mapping[str, Any]]) -> list[Start]:
    """A journal's records (as written, none left out), cut into its starts."""
    starts: list[Start] = []
    for record in written:
        if record.get("event") in ("start", "resume"):
            began = float(record.get("began", record.get("time", 0.0)))
            starts.append(Start(began, int(record.get("step", 0)), [dict(record)]))
        elif starts:
            starts[-1].records.append(dict(record))
    return starts


def ledger(name: str, written: Sequence[Mapping[str, Any]]) -> Ledger:
    """The goodput ledger of one run from its journal's records as written."""
    starts = starts_of(written)
    seconds = dict.fromkeys(BUCKETS, 0.0)
    if not starts:
        return Ledger(name, seconds, 0.0, 0, 0, 0)
    lost_steps = 0
    for i, start in enumerate(starts):
        if i:
            seconds["between"] += max(start.began - starts[i - 1].last_time, 0.0)
        spent = start.spent
        if spent is not None:
            own = {bucket: float(spent.get(bucket, 0.0)) for bucket in SPENT}
            where = "train"
        else:  # killed before it could say: its start-up, and the rest as a whole
            opened = float(start.records[0].get("time", start.began))
            own = {"startup": max(opened - start.began, 0.0), "unrecorded": max(start.last_time - opened, 0.0)}
            where = "unrecorded"
        if i + 1 < len(starts):  # the steps past the next start's resume point were trained again
            redone = max(start.last_step - starts[i + 1].first_step, 0)
            moved = min(redone * (start.step_seconds() or 0.0), own[where])
            own[where] -= moved
            own["lost"] = moved
            lost_steps += redone
        for bucket, value in own.items():
            seconds[bucket] += value
    wall = starts[-1].last_time - starts[0].began
    return Ledger(name, seconds, wall, len(starts), lost_steps, starts[-1].last_step)


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def ledger_text(ledgers: Sequence[Ledger]) -> str:
    """The ledgers as a table, a row per run and a total row where there are several: each bucket's
    time and share of the wall time, and the goodput (``train`` over the wall)."""
    used = [b for b in BUCKETS if any(led.seconds[b] > 0 for led in ledgers)]
    header = ["run", "wall", *used, "goodput"]
    rows = [header]
    shown = list(ledgers)
    if len(ledgers) > 1:
        total = dict.fromkeys(BUCKETS, 0.0)
        for led in ledgers:
            for b in BUCKETS:
                total[b] += led.seconds[b]
        wall = sum(led.wall for led in ledgers)
        shown.append(Ledger("all runs", total, wall, sum(led.starts for led in ledgers), 0, 0))
    for led in shown:
        shares = [f"{_seconds(led.seconds[b])} {_share(led.seconds[b], led.wall)}" for b in used]
        rows.append([led.name, _seconds(led.wall), *shares, f"{100 * led.goodput:.1f}%"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    notes = [
        f"{led.name}: {led.starts} starts, {led.lost_steps} steps trained again after a stop"
        for led in ledgers
        if led.lost_steps
    ]
    return "\n".join([*lines, *notes])


def draw_ledgers(ledgers: Sequence[Ledger], output: str) -> tuple[int, int]:
    """A horizontal bar per run, its wall time split into the buckets (seconds), written to
    ``output`` (.png or .svg): (width, height) in pixels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    palette = plt.get_cmap("tab10")
    colours = {bucket: palette(i) for i, bucket in enumerate(BUCKETS)}
    fig, ax = plt.subplots(figsize=(10, max(3.0, 1.6 + 0.4 * len(ledgers))), dpi=100)
    names = [led.name for led in ledgers][::-1]
    left = [0.0] * len(ledgers)
    for bucket in BUCKETS:
        widths = [led.seconds[bucket] for led in ledgers][::-1]
        if not any(widths):
            continue
        ax.barh(names, widths, left=left, color=colours[bucket], label=bucket)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set_xlabel("seconds")
    ax.set_title("where the wall time went (goodput: train over the wall time)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False, fontsize="small")
    fig.tight_layout()
    fig.savefig(output)
    width, height = fig.get_size_inches() * fig.dpi
    plt.close(fig)
    return int(width), int(height)
