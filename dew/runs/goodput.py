"""Where a run's hours went: the goodput ledger (``dew-runs goodput``), read from its journal alone.

A run is one or more *starts* (a start and each resume: one process, or one process pool, from its
launch to its stop or end). Each start's ``start``/``resume`` event names when it was launched
(``began``: its process's start for a dew command or a job a dew launcher submitted, its set-up's
for a run trained from Python), and its ``stop`` or ``end`` event where that start's wall time went (``spent``,
``dew.training.reporting.summary.RunReport.ledger``): ``startup`` (the interpreter, composing, the
data, the model, the restore), ``compile`` (the first step), ``data`` (the loop waiting for
batches), ``eval``, ``samples`` (the samples drawn at evaluations, out of ``eval``), ``checkpoint``
(saves blocking the loop) and ``train`` (the steps, and the host's work between them). Under SLURM
the start event also names when the scheduler took the job in (``queued``: its submission, or its
requeue, SLURM's ``SubmitTime``) and when it gave the job its nodes (``allocated``: ``StartTime``;
``dew.launching.slurm.queue_times``). The ledger adds the starts up and adds buckets of its own:

- ``queue``: from ``queued`` to ``allocated``, the job waiting in the scheduler's queue; the time
  from ``allocated`` to the process's start (the batch script, ``srun``) is ``startup``. A run's
  wall time starts at its first start's ``queued`` where it is known. Not under SLURM: 0.
- ``lost``: steps trained and then trained again. A start that stopped, crashed or was killed past
  the checkpoint the next start resumed from trained those steps for nothing: their number times
  that start's median step time (from its journal's consecutive training records) moves from its
  ``train`` to ``lost``.
- ``between``: the time from one start's last record to the next start's process start (a requeue
  being made, a run resumed by hand later), less that start's ``queue`` where it is known.

A start that was killed (SIGKILL, a node lost) wrote no ``spent``: its time from its process start
to its ``start`` event is ``startup``, from there to its last record ``unrecorded`` (less what is
``lost``). The buckets add up to the run's wall time, from its first process start to its last
record (its first ``queued`` where known); ``goodput`` is ``train`` over that wall time. A journal
written before dew recorded these (no ``began``) counts each start from its ``start`` event, one
without ``samples`` has them in ``eval``.

A sweep (``sweep_total``: a Hydra multirun directory, its jobs' runs below it) adds ``idle``, its
slots standing empty: the sweep's slots (``sweep_slots``: how many of its jobs its launcher runs at
once, from the sweep's recorded Hydra config, and never fewer than the journals show running at
once) times its span (from its first job's first start to its last record), less the time its runs
held a slot (each start's allocation, or its process start, to its last record: not a start's
``queue`` nor the ``between`` before it). The sweep's row then adds up to slots x
span. It counts from the journals alone, so it holds for every launcher; a job that never reached
its ``start`` event (refused by its checks, killed while it started) wrote no journal, and its time
in a slot counts as ``idle``.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

BUCKETS = (
    "queue",
    "between",
    "startup",
    "compile",
    "data",
    "train",
    "eval",
    "samples",
    "checkpoint",
    "unrecorded",
    "lost",
    "idle",
)
"""The ledger's buckets, in the order a run meets them (``idle``: a sweep's empty slots, its total
row's alone)."""
SPENT = ("startup", "compile", "data", "train", "eval", "samples", "checkpoint")
"""The buckets a start's ``stop``/``end`` event records (``spent``)."""
OUTSIDE_SLOTS = ("queue", "between")
"""A run's buckets in which it held no slot of its sweep: not in the sweep's slots x span."""


@dataclasses.dataclass
class Start:
    """One start of a run, as its journal shows it."""

    began: float
    """Its process's start (or its ``start`` event's time, in an older journal)."""
    first_step: int
    """The step it started from."""
    records: list[dict[str, Any]]
    """Its records in order, its start or resume event first."""
    queued: float | None = None
    """When the scheduler took its job in (SLURM's ``SubmitTime``: a submission or a requeue)."""
    allocated: float | None = None
    """When the scheduler gave its job its nodes (SLURM's ``StartTime``)."""

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
    began: float = 0.0
    """When its wall time starts (seconds since the epoch): its first start's ``queued`` or launch."""
    running: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    """Each start's allocation (or process start) and last record: when it held a slot of its sweep."""
    slots: int = 0
    """A sweep's row (``sweep_total``): the slots its wall time is slots x span of; 0 for a run."""

    @property
    def goodput(self) -> float:
        return self.seconds["train"] / self.wall if self.wall > 0 else 0.0


def starts_of(written: Sequence[Mapping[str, Any]]) -> list[Start]:
    """A journal's records (as written, none left out), cut into its starts."""
    starts: list[Start] = []
    for record in written:
        if record.get("event") in ("start", "resume"):
            began = float(record.get("began", record.get("time", 0.0)))
            queued, allocated = record.get("queued"), record.get("allocated")
            starts.append(
                Start(
                    began,
                    int(record.get("step", 0)),
                    [dict(record)],
                    None if queued is None else float(queued),
                    None if allocated is None else min(float(allocated), began),
                )
            )
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
        for bucket, value in _arrival(start, starts[i - 1].last_time if i else None).items():
            seconds[bucket] += value
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
    first = starts[0]
    began = min(first.queued, first.began) if first.queued is not None else first.began
    running = [(s.began if s.allocated is None else s.allocated, s.last_time) for s in starts]
    wall = starts[-1].last_time - began
    return Ledger(name, seconds, wall, len(starts), lost_steps, starts[-1].last_step, began, running)


def _arrival(start: Start, previous: float | None) -> dict[str, float]:
    """The time before a start's process began: since the previous start's last record
    (``previous``; None for the first start), ``between`` until the scheduler took the job in again,
    ``queue`` until it gave the job its nodes, and ``startup`` from there to the process (its batch
    script and ``srun``). Without a ``queued`` (not under SLURM, an older journal) all of it is
    ``between``."""
    if start.queued is None:
        return {"between": max(start.began - previous, 0.0) if previous is not None else 0.0}
    taken = start.queued if previous is None else max(start.queued, previous)
    given = start.allocated if start.allocated is not None else start.began
    return {
        "between": max(min(taken, start.began) - previous, 0.0) if previous is not None else 0.0,
        "queue": max(min(given, start.began) - taken, 0.0),
        "startup": max(start.began - max(given, taken), 0.0),
    }


def sweep_total(name: str, ledgers: Sequence[Ledger], slots: int | None) -> Ledger:
    """A sweep's row: its runs' buckets summed (but ``queue`` and ``between``, when a run held no
    slot) and ``idle``, its slots x its span less the time its runs' processes ran; its wall time is
    slots x span. ``slots``: what the sweep's record says (``sweep_slots``), raised to the most runs
    the journals show running at once (the row's ``slots``)."""
    periods = [p for led in ledgers for p in led.running]
    slots = max(slots or 0, _most_at_once(periods), 1)
    seconds = dict.fromkeys(BUCKETS, 0.0)
    for led in ledgers:
        for bucket in BUCKETS:
            if bucket not in OUTSIDE_SLOTS:
                seconds[bucket] += led.seconds[bucket]
    span = max(end for _, end in periods) - min(start for start, _ in periods) if periods else 0.0
    held = sum(end - start for start, end in periods)
    seconds["idle"] = max(slots * span - held, 0.0)
    return Ledger(name, seconds, slots * span, sum(led.starts for led in ledgers), 0, 0, slots=slots)


def _most_at_once(periods: Sequence[tuple[float, float]]) -> int:
    """The most of the periods (start, end) that overlap at any moment."""
    edges = sorted([(start, 1) for start, _ in periods] + [(end, -1) for _, end in periods], key=lambda e: (e[0], e[1]))
    most = running = 0
    for _, change in edges:
        running += change
        most = max(most, running)
    return most


def sweep_slots(directory: str, run_dirs: Sequence[str]) -> int | None:
    """How many jobs the sweep in ``directory`` runs at once, from its recorded Hydra config (the
    directory's ``multirun.yaml``, else its first job's ``.hydra/hydra.yaml``): a search's
    ``hydra.sweeper.workers`` or ``n_jobs`` (dew's study sweeper: trials at a time); for a grid
    sweep, one under Hydra's basic launcher (one job after another), else every job of a batch at
    once (``hydra.sweeper.max_batch_size``; unset, all of them), at most the launcher's
    ``array_parallelism`` (SLURM's array throttle). None where the directory is no Hydra sweep."""
    hydra = _sweep_record(directory, run_dirs)
    if hydra is None:
        return None
    sweeper, launcher = hydra.get("sweeper") or {}, hydra.get("launcher") or {}
    if "n_jobs" in sweeper:  # a search: its trials at a time
        return int(sweeper.get("workers") or sweeper["n_jobs"])
    if str(launcher.get("_target_", "")).endswith("BasicLauncher"):
        return 1
    batch = sweeper.get("max_batch_size") or len(run_dirs)
    return max(min(int(batch), int(launcher.get("array_parallelism") or batch), len(run_dirs)), 1)


def _sweep_record(directory: str, run_dirs: Sequence[str]) -> dict[str, Any] | None:
    """The ``hydra`` section of a sweep's recorded config, or None where it has none (a directory
    of runs made one by one, a remote one)."""
    import yaml  # Hydra's dependency: the records are YAML

    candidates = [(os.path.join(directory, "multirun.yaml"), False)]
    candidates += [(os.path.join(d, ".hydra", "hydra.yaml"), True) for d in sorted(run_dirs)[:1]]
    for path, of_a_job in candidates:
        try:
            with open(path) as f:
                hydra = (yaml.safe_load(f) or {}).get("hydra") or {}
        except (OSError, yaml.YAMLError):
            continue
        if not of_a_job or hydra.get("mode") == "MULTIRUN":
            return hydra
    return None


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def ledger_text(ledgers: Sequence[Ledger], totals: Sequence[Ledger] = ()) -> str:
    """The ledgers as a table, a row per run, then ``totals`` (a sweep's row: ``sweep_total``), or
    without them, where there are several runs, a row that sums them: each bucket's time and share
    of the row's wall time, and the goodput (``train`` over the wall)."""
    if not totals and len(ledgers) > 1:
        total = dict.fromkeys(BUCKETS, 0.0)
        for led in ledgers:
            for b in BUCKETS:
                total[b] += led.seconds[b]
        wall = sum(led.wall for led in ledgers)
        totals = [Ledger("all runs", total, wall, sum(led.starts for led in ledgers), 0, 0)]
    shown = [*ledgers, *totals]
    used = [b for b in BUCKETS if any(led.seconds[b] > 0 for led in shown)]
    header = ["run", "wall", *used, "goodput"]
    rows = [header]
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
    notes += [
        f"{t.name}: {t.slots} slot{'s' if t.slots > 1 else ''} x {_seconds(t.wall / t.slots)} from the first "
        f"job's start to the last record; idle: a slot running no job (queue and between are outside "
        f"the slots)"
        for t in totals
        if t.slots
    ]
    return "\n".join([*lines, *notes])


def draw_ledgers(ledgers: Sequence[Ledger], output: str) -> tuple[int, int]:
    """A horizontal bar per run (and per sweep row: ``sweep_total``), its wall time split into the
    buckets (seconds), written to ``output`` (.png or .svg): (width, height) in pixels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    palette = plt.get_cmap("tab20")  # pairs of a dark and a light shade of tab10's hues
    hues = [0, 1, 2, 3, 4, 5, 6, 8, 9]  # all but grey, which is the idle slots'
    shades = [palette(2 * h) for h in hues] + [palette(2 * h + 1) for h in hues]
    colours: dict[str, Any] = dict(zip(BUCKETS, shades, strict=False))
    colours["idle"] = "0.82"
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
