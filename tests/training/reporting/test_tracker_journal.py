"""The journal: only ever appended to; read as the run's history, where each segment (a resume)
replaces what earlier segments logged past its step; ``end`` written once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dew.config import TrainerConfig
from dew.contract.journal import read_journal
from dew.training.reporting.tracker import Tracker


def _segment(
    trainer: TrainerConfig, *, resume: int | None, steps: range, end: bool = False, cut_short: bool = False
) -> Tracker:
    tracker = Tracker(
        trainer, "r", record={}, summary={}, total_steps=6, resume_step=resume, wandb_id=None, is_main=True
    )
    for step in steps:
        tracker.metrics(step, {"train/loss": 10.0 / step + (0.5 if resume is None else 0.0)})
        if step % 2 == 0:
            tracker.event("checkpoint", step=step)
    if end:
        tracker.event("end", step=steps[-1] if steps else resume)
    tracker.close()
    if cut_short:  # a process killed in the middle of a line
        with open(tracker.journal.path, "a") as f:
            f.write('{"step": 99, "train/lo')
    return tracker


@pytest.fixture
def trainer(tmp_path: Path, monkeypatch) -> TrainerConfig:
    monkeypatch.setenv("DEW_TRACKING_DIR", str(tmp_path / "tracking"))
    return TrainerConfig(steps=6, checkpoint_dir=str(tmp_path / "ck"))


def test_a_resumed_run_appends_and_reads_as_one_uninterrupted_run(trainer, tmp_path):
    path = tmp_path / "tracking" / "r" / "journal.jsonl"
    _segment(trainer, resume=None, steps=range(1, 6), cut_short=True)  # killed after step 5; last save: 4
    first = path.read_text()
    _segment(trainer, resume=4, steps=range(5, 7), end=True)
    assert path.read_text().startswith(first)  # nothing the first process wrote was rewritten

    raw = read_journal(path, raw=True)
    assert [r["step"] for r in raw if "train/loss" in r] == [1, 2, 3, 4, 5, 5, 6]  # the cut line is skipped
    history = read_journal(path)
    assert [r["step"] for r in history if "train/loss" in r] == [1, 2, 3, 4, 5, 6]
    assert {r["step"]: r["train/loss"] for r in history if "train/loss" in r}[5] == 2.0  # the resumed run's
    assert [(r["event"], r["step"]) for r in history if "event" in r] == [
        ("start", 0),
        ("checkpoint", 2),
        ("checkpoint", 4),
        ("resume", 4),
        ("checkpoint", 6),
        ("end", 6),
    ]
    lines = path.read_text().splitlines()
    assert lines.count('{"step": 99, "train/lo') == 1  # the cut line stayed a line of its own
    for line in (line for line in lines if not line.startswith('{"step": 99')):
        json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} is not strict JSON"))


def test_end_is_written_once_and_a_fresh_start_replaces_the_history(trainer, tmp_path):
    path = tmp_path / "tracking" / "r" / "journal.jsonl"
    _segment(trainer, resume=None, steps=range(1, 7), end=True)
    done = path.read_text()
    again = _segment(trainer, resume=6, steps=range(0), end=True)  # the finished run started again
    assert again.complete and path.read_text() == done
    assert [r["event"] for r in read_journal(path) if "event" in r].count("end") == 1

    _segment(trainer, resume=None, steps=range(1, 3))  # started from scratch (it had never saved)
    assert len(read_journal(path, raw=True)) > len(read_journal(path))
    assert [r.get("event", r["step"]) for r in read_journal(path)] == ["start", 1, 2, "checkpoint"]


def test_non_finite_values_are_written_as_strict_json(trainer, tmp_path):
    tracker = Tracker(trainer, "r", record={}, summary={}, total_steps=6, resume_step=None, wandb_id=None, is_main=True)
    tracker.metrics(1, {"train/loss": float("nan")})
    tracker.event("stop", step=1, reason="nonfinite", message="m", detail={"values": [float("inf")]})
    tracker.close()
    records = read_journal(tmp_path / "tracking" / "r" / "journal.jsonl")
    assert records[1]["train/loss"] == "nan" and records[2]["detail"] == {"values": ["inf"]}
