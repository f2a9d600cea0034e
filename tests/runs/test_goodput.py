"""The goodput ledger's arithmetic (dew.runs.goodput) on journals written here: starts that said
where their time went, a start killed outright, the steps trained again after a stop, the time
between starts. Real runs: tests/training/test_trainer_resume.py and tests/cli/test_runs.py."""

from __future__ import annotations

import pytest

from dew.runs.goodput import BUCKETS, ledger, ledger_text

STEP_S = 0.01


def trained(steps: range, t0: float) -> list[dict]:
    """Training records every 10 steps, ``STEP_S`` a step, the first at ``t0``."""
    return [{"step": s, "time": t0 + (s - steps.start) * STEP_S, "train/loss": 1.0} for s in steps]


def test_a_stop_then_a_resume_from_an_earlier_checkpoint():
    written = [
        {"event": "start", "step": 0, "time": 102.0, "began": 100.0},
        *trained(range(10, 91, 10), 102.5),
        {
            "event": "stop",
            "step": 90,
            "time": 104.0,
            "reason": "preempted",
            "spent": {"startup": 2.0, "compile": 1.0, "data": 0.1, "train": 0.8, "eval": 0.0, "checkpoint": 0.1},
        },
        {"event": "resume", "step": 50, "time": 111.0, "began": 110.0},
        *trained(range(60, 101, 10), 111.5),
        {
            "event": "end",
            "step": 100,
            "time": 113.0,
            "spent": {"startup": 1.0, "compile": 0.5, "data": 0.0, "train": 1.3, "eval": 0.2, "checkpoint": 0.0},
        },
    ]
    led = ledger("r", written)
    assert (led.starts, led.lost_steps, led.final_step) == (2, 40, 100)  # steps 51-90 were trained twice
    assert led.wall == pytest.approx(13.0)  # from the first launch to the last record
    assert led.seconds["lost"] == pytest.approx(40 * STEP_S)  # at the stopped start's median step time
    assert led.seconds["train"] == pytest.approx(0.8 - 0.4 + 1.3)
    assert led.seconds["between"] == pytest.approx(6.0)  # 104 to 110: the run was not running
    assert led.seconds["startup"] == pytest.approx(3.0) and led.seconds["compile"] == pytest.approx(1.5)
    assert sum(led.seconds.values()) == pytest.approx(led.wall)
    assert led.goodput == pytest.approx(1.7 / 13.0)


def test_a_start_killed_outright_is_unrecorded_less_what_it_lost():
    written = [
        {"event": "start", "step": 0, "time": 101.0, "began": 100.0},
        *trained(range(10, 301, 10), 101.0),  # the last record at 103.9, step 300
        {"event": "resume", "step": 200, "time": 106.0, "began": 105.0},
        *trained(range(210, 401, 10), 106.2),
        {
            "event": "end",
            "step": 400,
            "time": 108.5,
            "spent": {"startup": 1.0, "compile": 0.2, "data": 0.0, "train": 2.3, "eval": 0.0, "checkpoint": 0.0},
        },
    ]
    led = ledger("r", written)
    assert led.lost_steps == 100 and led.seconds["lost"] == pytest.approx(100 * STEP_S)
    assert led.seconds["unrecorded"] == pytest.approx((103.9 - 101.0) - 1.0)  # its time after the start-up, less lost
    assert led.seconds["startup"] == pytest.approx(1.0 + 1.0)
    assert sum(led.seconds.values()) == pytest.approx(led.wall) and led.wall == pytest.approx(8.5)


def test_the_table_has_a_row_per_run_and_one_for_them_all():
    one = ledger("a", [{"event": "start", "step": 0, "time": 1.0, "began": 0.0}, *trained(range(10, 21, 10), 2.0)])
    two = ledger(
        "b",
        [
            {"event": "start", "step": 0, "time": 1.0, "began": 0.0},
            {"event": "end", "step": 5, "time": 3.0, "spent": {"startup": 1.0, "train": 2.0}},
        ],
    )
    lines = ledger_text([one, two]).splitlines()
    assert lines[0].split()[:2] == ["run", "wall"] and lines[0].split()[-1] == "goodput"
    assert set(lines[0].split()[2:-1]) <= set(BUCKETS)
    assert [line.split()[0] for line in lines[1:4]] == ["a", "b", "all"]
    assert lines[2].split()[-1] == f"{100 * 2.0 / 3.0:.1f}%"
