"""Checks of the goodput ledger (dew.runs.goodput) on journals that other tests' runs wrote: a run of
several processes, a SLURM job requeued, a sweep's slots. Called from those tests, so that the
ledger is checked without a run of its own (the suite's runs are what it reads)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from dew.runs.goodput import BUCKETS, Ledger, ledger


def check_ledger_adds_up(written: Sequence[Mapping[str, Any]], name: str = "run") -> Ledger:
    """A run's buckets add up to its wall time within 1% (the issue's bar), the wall time runs from
    its first start's launch (its job's submission, where SLURM said) to its last record, and it
    trained: its ledger."""
    led = ledger(name, written)
    assert led.starts >= 1 and led.wall > 0, (name, led)
    assert sum(led.seconds.values()) == pytest.approx(led.wall, rel=0.01), (name, led)
    first = next(r for r in written if r.get("event") in ("start", "resume"))
    began = min(first.get("queued", first["began"]), first["began"])
    assert led.wall == pytest.approx(max(r["time"] for r in written if "time" in r) - began, rel=1e-6), (name, led)
    assert led.seconds["train"] > 0 and led.seconds["startup"] > 0, (name, led.seconds)
    return led


def check_slurm_queue(written: Sequence[Mapping[str, Any]], job: Mapping[str, Any]) -> Ledger:
    """A requeued SLURM job's journal (``written``) against the stand-in's record of the job
    (``job``, tests/slurm_standin): each start event names when the job was queued and given its
    nodes, as scontrol printed them (to the second); its resume was queued no earlier than the stopped
    start's last record; the ledger adds up, with the waits in ``queue``."""
    led = check_ledger_adds_up(written, "requeued")
    opened = [r for r in written if r.get("event") in ("start", "resume")]
    assert len(opened) == len(job["starts"]) >= 2, (opened, job["starts"])
    for record, allocated in zip(opened, job["starts"], strict=True):
        assert record["allocated"] == int(allocated), (record, job)
        assert record["queued"] <= record["allocated"] <= record["began"], record
    assert opened[-1]["queued"] == int(job["submitted"])  # SLURM's SubmitTime, set again by the requeue
    before = max(r["time"] for r in written[: written.index(opened[-1])] if "time" in r)
    assert opened[-1]["queued"] >= int(before), (before, opened[-1])
    expected = sum(min(r["allocated"], r["began"]) - r["queued"] for r in opened)
    assert led.seconds["queue"] == pytest.approx(expected, abs=0.01), (led.seconds, opened)
    return led


def check_sweep_ledger(sweep: Path, tracking: Path, slots: int, trials: int) -> Ledger:
    """``dew-runs goodput`` on a sweep of ``trials`` runs (each one's journal found): each run's row
    adds up to its wall time, and the sweep's row (``slots`` slots, from its recorded Hydra config)
    adds up to slots x span, its ``idle`` the slots' time no run held."""
    from dew.cli.runs import load_runs
    from dew.cli.runs import run as dew_runs
    from dew.runs.goodput import sweep_slots, sweep_total

    runs = [r for r in load_runs([str(sweep)], str(tracking)) if r.journal is not None]
    assert len(runs) == trials, [r.summary.name for r in runs]
    ledgers = [check_ledger_adds_up(r.journal.written, r.summary.name) for r in runs if r.journal is not None]
    assert sweep_slots(str(sweep), [str(r.path) for r in runs]) == slots
    total = sweep_total("all", ledgers, slots)
    periods = [p for led in ledgers for p in led.running]
    span = max(end for _, end in periods) - min(start for start, _ in periods)
    assert total.slots == slots and total.wall == pytest.approx(slots * span)
    assert sum(total.seconds.values()) == pytest.approx(total.wall, rel=0.01), total.seconds
    assert 0 < total.seconds["idle"] < total.wall and set(total.seconds) == set(BUCKETS)
    text = dew_runs(["goodput", str(sweep), "--tracking", str(tracking)])
    rows = {line.split()[0]: line for line in text.splitlines()[1 : 2 + len(runs)]}
    assert {r.summary.name for r in runs} <= set(rows) and "all" in rows, text
    assert rows["all"].split()[-1] == f"{100 * total.goodput:.1f}%", text
    assert text.splitlines()[-1].startswith(f"all in {sweep.name}: {slots} slots x "), text
    return total


def check_journal_ledger(journal: Path, name: str = "run") -> Ledger:
    """``check_ledger_adds_up`` on the journal at ``journal``, read as written."""
    from dew.contract.journal import read_journal

    return check_ledger_adds_up(read_journal(journal, raw=True), name)
