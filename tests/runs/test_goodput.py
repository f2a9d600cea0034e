"""The goodput ledger's arithmetic (dew.runs.goodput) on journals written here: starts that said
where their time went, a start killed outright, the steps trained again after a stop, the time
between starts. Real runs: tests/training/test_trainer_resume.py and tests/cli/test_runs.py."""

from __future__ import annotations

import os
import time

import pytest

from dew.runs.goodput import BUCKETS, SPENT, ledger, ledger_text, sweep_slots, sweep_total

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


def test_a_slurm_jobs_queue_wait_is_its_own_bucket_and_shrinks_the_time_between():
    spent = {"startup": 1.0, "compile": 0.5, "data": 0.0, "train": 1.0, "eval": 0.2, "samples": 0.3, "checkpoint": 0.0}
    written = [
        # submitted at 90, given its nodes at 96, its process up at 97 (the batch script and srun)
        {"event": "start", "step": 0, "time": 98.0, "began": 97.0, "queued": 90.0, "allocated": 96.0},
        *trained(range(10, 51, 10), 98.5),  # the last at 98.9
        {"event": "stop", "step": 50, "time": 100.0, "reason": "preempted", "spent": spent},
        # requeued once the stopped run ended (SLURM's new SubmitTime), waited, started again
        {"event": "resume", "step": 50, "time": 111.0, "began": 110.0, "queued": 103.0, "allocated": 109.5},
        {"event": "end", "step": 60, "time": 113.0, "spent": spent},
    ]
    led = ledger("r", written)
    assert led.wall == pytest.approx(113.0 - 90.0)  # from the first submission
    assert led.seconds["queue"] == pytest.approx((96.0 - 90.0) + (109.5 - 103.0))
    assert led.seconds["between"] == pytest.approx(103.0 - 100.0)  # the stop to the requeue, not the queue
    assert led.seconds["startup"] == pytest.approx(2 * 1.0 + (97.0 - 96.0) + (110.0 - 109.5))  # srun's share
    assert led.seconds["samples"] == pytest.approx(0.6) and led.seconds["eval"] == pytest.approx(0.4)
    assert sum(led.seconds.values()) == pytest.approx(led.wall)
    # Without the queue times (not under SLURM, an older journal) the wait is time between starts.
    plain = ledger("p", [{k: v for k, v in r.items() if k not in ("queued", "allocated")} for r in written])
    assert plain.seconds["queue"] == 0 and plain.seconds["between"] == pytest.approx(110.0 - 100.0)
    assert plain.wall == pytest.approx(113.0 - 97.0) and sum(plain.seconds.values()) == pytest.approx(plain.wall)


def _run(began: float, end: float, train: float) -> list[dict]:
    spent = {"startup": 1.0, "compile": 0.0, "data": 0.0, "train": train, "eval": 0.0, "checkpoint": 0.0}
    return [
        {"event": "start", "step": 0, "time": began + 1.0, "began": began},
        {"event": "end", "step": 10, "time": end, "spent": spent},
    ]


def test_a_sweeps_row_adds_its_idle_slots_to_slots_times_its_span():
    # Two slots: jobs a and b together from 0, c in a's slot from 11 (1 s after a ended), b's slot empty from 8.
    ledgers = [ledger("a", _run(0.0, 10.0, 9.0)), ledger("b", _run(0.0, 8.0, 7.0)), ledger("c", _run(11.0, 20.0, 8.0))]
    total = sweep_total("all", ledgers, 2)
    assert total.slots == 2 and total.wall == pytest.approx(2 * 20.0)
    assert total.seconds["idle"] == pytest.approx(2 * 20.0 - (10.0 + 8.0 + 9.0))  # 1 s in a's slot, 12 s in b's
    assert total.seconds["train"] == pytest.approx(24.0) and total.goodput == pytest.approx(24.0 / 40.0)
    assert sum(total.seconds.values()) == pytest.approx(total.wall)
    # A record that says fewer slots than the journals show running at once is raised to them.
    assert sweep_total("all", ledgers, 1).slots == 2
    # A run's time in the queue held no slot: outside the sweep's row; from its allocation it held one.
    queued = _run(0.0, 10.0, 9.0)
    queued[0].update(queued=-5.0, allocated=-0.5)
    row = sweep_total("all", [ledger("a", queued), *ledgers[1:]], 2)
    assert row.seconds["queue"] == 0 and row.wall == pytest.approx(2 * 20.5)
    assert row.seconds["idle"] == pytest.approx(2 * 20.5 - (10.5 + 8.0 + 9.0))
    assert sum(row.seconds.values()) == pytest.approx(row.wall)
    lines = ledger_text(ledgers, [total]).splitlines()
    assert "idle" in lines[0].split() and [line.split()[0] for line in lines[1:5]] == ["a", "b", "c", "all"]
    assert lines[-1].startswith("all: 2 slots x 20.0 s")


HYDRA = {
    "basic": ("hydra._internal.core_plugins.basic_launcher.BasicLauncher", {"max_batch_size": None}, 1),
    "local": ("hydra_plugins.dew_launchers.LocalLauncher", {"max_batch_size": None}, 3),
    "throttled": ("hydra_plugins.dew_launchers.SlurmLauncher", {"max_batch_size": 2}, 2),
    "search": ("hydra_plugins.dew_launchers.LocalLauncher", {"n_jobs": 2, "workers": None}, 2),
}


@pytest.mark.parametrize("kind", list(HYDRA))
def test_a_sweeps_slots_are_read_from_its_recorded_hydra_config(tmp_path, kind):
    import yaml

    target, sweeper, slots = HYDRA[kind]
    jobs = [tmp_path / f"{n}-job" for n in range(3)]
    for job in jobs:
        (job / ".hydra").mkdir(parents=True)
    hydra = {"mode": "MULTIRUN", "launcher": {"_target_": target, "array_parallelism": 256}, "sweeper": sweeper}
    (jobs[0] / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": hydra}))
    assert sweep_slots(str(tmp_path), [str(j) for j in jobs]) == slots
    (jobs[0] / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {**hydra, "mode": "RUN"}}))
    assert sweep_slots(str(tmp_path), [str(j) for j in jobs]) is None  # runs made one by one: no sweep


def test_the_run_report_times_samples_inside_an_evaluation_as_their_own():
    import time
    from types import SimpleNamespace

    from dew.training.reporting.summary import RunReport

    run = SimpleNamespace(trainer=SimpleNamespace(eval_every=1, checkpoint_every=1))
    story = RunReport(run, "r", "/nowhere", total_steps=1)  # type: ignore[arg-type]
    with story.phase("eval"):
        time.sleep(0.05)
        with story.phase("samples"):
            time.sleep(0.1)
    assert story.spent["samples"] == pytest.approx(0.1, abs=0.03)
    assert story.spent["eval"] == pytest.approx(0.05, abs=0.03)
    spent = story.ledger()
    assert spent["samples"] == pytest.approx(story.spent["samples"], abs=1e-3) and set(spent) == set(SPENT)


def test_scontrols_submit_and_start_times_are_read_as_local_time():
    from dew.launching.slurm import job_spec, job_times

    shown = (
        "JobId=1236 ArrayJobId=1234 ArrayTaskId=2 JobName=x\n   SubmitTime=2026-12-06T10:00:05 "
        "EligibleTime=2026-12-06T10:00:05\n   StartTime=2026-12-06T10:03:00 EndTime=Unknown"
    )
    submitted, started = job_times(shown)
    assert started - submitted == 175.0
    assert time.localtime(submitted)[:6] == (2026, 12, 6, 10, 0, 5)
    assert job_times("JobId=1 StartTime=Unknown") is None
    assert job_spec({"SLURM_JOB_ID": "1236", "SLURM_ARRAY_JOB_ID": "1234", "SLURM_ARRAY_TASK_ID": "2"}) == "1234_2"
    assert job_spec({"SLURM_JOB_ID": "77"}) == "77" and job_spec({}) is None


def test_a_start_under_slurm_records_when_its_job_was_queued_and_given_its_nodes(tmp_path, monkeypatch):
    """A start event written in a SLURM job (the stand-in's: tests/slurm_standin) names the job's
    ``SubmitTime`` and ``StartTime`` as scontrol prints them (to the second)."""
    import subprocess

    from dew.config import TrainerConfig
    from dew.contract.journal import read_journal
    from dew.training.reporting.tracker import Tracker
    from tests.slurm_standin import install

    cluster = install(tmp_path / "slurm")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --job-name=q\n#SBATCH --array=0-1\nsleep 60\n")
    env = cluster.env(dict(os.environ))
    job = subprocess.run(["sbatch", "--parsable", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    key = f"{job.stdout.strip()}_1"
    try:
        deadline = time.time() + 30
        while not cluster.job(key)["starts"] and time.time() < deadline:
            time.sleep(0.05)
        record = cluster.job(key)
        for name in ("SLURM_STANDIN_DIR", "PATH"):
            monkeypatch.setenv(name, env[name])
        monkeypatch.setenv("SLURM_JOB_ID", str(record["job_id"]))
        monkeypatch.setenv("SLURM_ARRAY_JOB_ID", job.stdout.strip())
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
        monkeypatch.setenv("DEW_TRACKING_DIR", str(tmp_path / "tracking"))
        trainer = TrainerConfig(steps=6, checkpoint_dir=str(tmp_path / "ck"))
        Tracker(
            trainer, "r", record={}, summary={}, total_steps=6, resume_step=None, wandb_id=None, is_main=True
        ).close()
    finally:
        cluster.kill_all()
    [start] = read_journal(tmp_path / "tracking" / "r" / "journal.jsonl")
    assert start["queued"] == int(record["submitted"]) and start["allocated"] == int(record["starts"][0])
    assert start["queued"] <= start["allocated"] <= start["began"]
