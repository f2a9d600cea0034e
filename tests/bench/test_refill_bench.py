"""bench/refill.py at its smoke size (3 trials, 2 slots, 40 to 160 steps, no warm-up run) on the SLURM
stand-in, so the command docs/performance.md quotes cannot rot: both modes run, they draw the same
trials, and the last line is the record with every figure the page quotes."""

import importlib
import json
import os
from pathlib import Path

import pytest

from tests.conftest import SUITE_CACHE

bench = importlib.import_module("bench.refill")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["slurm"])  # the local launcher's refill: tests/cli/test_search.py
def test_batches_and_refilled_slots_run_the_same_trials_and_are_measured(launcher, tmp_path, capsys):
    # On the suite's compilation cache (the trials' model is TINY's, compiled alike: the bench's
    # commands inherit this process's XLA_FLAGS), so that its lone run loads what the suite has
    # compiled instead of compiling it anew. --smoke runs no warm-up before the lone run (the lone
    # run fills the cache the trials load from): a cold dew-train fewer, ~4 CPU-s.
    cache = ["--compilation-cache", SUITE_CACHE]
    assert bench.main(["--smoke", "--launcher", launcher, "--keep", str(tmp_path), *cache]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["bench"] == "refill" and (record["trials"], record["slots"], record["rounds"]) == (3, 2, 1)
    assert record["warm_up"] is False and not (tmp_path / "tracking" / "warm-up").exists()
    assert launcher in record and ({"local", "slurm"} - {launcher}).isdisjoint(record)
    figures = record[launcher]
    assert figures["same_draws"] and figures["draws_matching"] == [3]  # the seeded random sampler: one sequence
    assert figures["modelled_draws"]  # and the sequence the model over seeds draws without training
    assert figures["wall_ratio"] > 0 and figures["wall_ratios"] == [round(figures["wall_ratio"], 3)]
    for mode in ("batch", "refill"):
        assert 0 <= figures[f"{mode}_idle_share"] < 1 and 0 < figures[f"{mode}_run_share"] <= 1
        assert figures[f"{mode}_idle_share_of_wall"] >= figures[f"{mode}_idle_share"]  # the wall holds the span
        assert 0 <= figures[f"{mode}_waiting_idle_share"] <= figures[f"{mode}_idle_share"]
        (run,) = [r[mode] for r in figures["rounds"]]
        assert sum(run["trials"].values()) == 3 and run["trials"]["complete"] >= 1 and run["trials"]["fail"] == 0
        assert len(run["gaps_s"]) == 1 and len(run["steps"]) == 3  # one job after the first two slots' jobs
        assert all(0 < s <= 160 for s in run["steps"])
        assert run["trials"]["pruned"] == run["steps"].count(10)  # the bad rate's, at its first evaluation
        if record["slot_cpus"]:  # each job in a slot of its own, capped (where the machine has cgroups)
            assert run["jobs_in_slots"] == 3 and run["throttled_s"] >= 0
            assert 0 <= run["jobs_held_for_a_slot"] <= 1 and run["held_s"] >= 0  # the third job, at most
        else:
            assert run["jobs_in_slots"] is None
    assert figures["refill_end_to_submit_s"]["median"] > 0 and figures["submit_to_start_s"] > 0
    assert 0 < figures["dedicated_wall_ratio"] <= 1.5
    targets = record["targets"]
    assert (targets["refill_idle_share_at_most"], targets["wall_ratio_at_most"]) == (0.2, 0.7)
    assert targets[launcher] == {
        "refill_idle_share_met": figures["refill_idle_share"] <= 0.2,
        "wall_ratio_met": figures["wall_ratio"] <= 0.7,
    }
    assert record["lone_run"]["step_s"] > 0
    seeds = record["over_seeds"]
    assert seeds["seeds"] == 200 and 0 <= seeds["median_seed"] < 200 and "0" in seeds["by_seed"]
    for name in ("refill_idle_share", "wall_ratio"):
        assert len(seeds["deciles"][name]) == 9 and seeds["deciles"][name] == sorted(seeds["deciles"][name])
    # the median seed's idle share is the model's median, between its 40th and 60th percentiles
    idle = seeds["by_seed"][str(seeds["median_seed"])][0]
    assert seeds["deciles"]["refill_idle_share"][3] <= idle <= seeds["deciles"]["refill_idle_share"][5]
    assert record["slot_cpus"] == (round(0.9 * os.cpu_count() / 2, 3) if bench.cgroup_root() else 0.0)


def test_slots_take_only_their_commands_job_processes_and_leave_none_stopped(tmp_path):
    """A command's slots take the job processes under its own folder, and no other command's: the lone
    run's slot once watched for the marker "\\0", which every command line holds, and stopped every
    submitit task on the machine (another test's) for good. A job held for a slot is resumed at close."""
    import signal
    import subprocess
    import sys
    import time

    def job(folder):
        folder.mkdir(parents=True, exist_ok=True)  # a stand-in for `python -u -m submitit.core._submit FOLDER`
        sleep = "import time; time.sleep(60)"
        return subprocess.Popen([sys.executable, "-c", sleep, "submitit.core._submit", str(folder)], cwd=folder)

    def state(proc):
        return Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    def until(check):
        deadline = time.monotonic() + 10
        while not check():
            assert time.monotonic() < deadline
            time.sleep(0.02)

    if bench.cgroup_root() is None:  # no writable cgroup here: the slots refuse, saying what to do
        with pytest.raises(SystemExit, match="--slot-cpus 0"):
            bench.Slots(1, 0.5, None)
        return
    other, procs = job(tmp_path / "other"), []
    try:
        lone = bench.Slots(1, 0.5, None)  # the lone run's: its one process is put in the slot by its caller
        time.sleep(0.3)  # fifteen of a watcher's looks
        lone.close()
        assert state(other) != "T"
        slots = bench.Slots(1, 0.5, str(tmp_path / "mine"))
        procs = [job(tmp_path / "mine" / "0"), job(tmp_path / "mine" / "1")]
        until(lambda: slots.jobs == 2 and slots.placed)  # the first in the slot, the second held until it empties
        assert sorted(slots.placed) == [procs[0].pid] and state(procs[1]) == "T" and state(other) != "T"
        slots.close()
        assert state(procs[1]) != "T" and state(other) != "T"
    finally:
        for proc in (other, *procs):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
