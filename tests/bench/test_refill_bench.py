"""bench/refill.py at its smoke size (3 trials, 2 slots, 40 to 160 steps) on the SLURM stand-in, so the
command docs/performance.md quotes cannot rot: both modes run, they draw the same trials, and the
last line is the record with every figure the page quotes."""

import importlib
import json
import os

import pytest

from tests.conftest import SUITE_CACHE

bench = importlib.import_module("bench.refill")


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["slurm"])  # the local launcher's refill: tests/cli/test_search.py
def test_batches_and_refilled_slots_run_the_same_trials_and_are_measured(launcher, tmp_path, capsys):
    # On the suite's compilation cache (the trials' model is TINY's, compiled alike: the bench's
    # commands inherit this process's XLA_FLAGS), so that its warm-up run loads what the suite has
    # compiled instead of compiling it anew: 10 s of its 14, ~4 of the test's ~50 CPU-s.
    cache = ["--compilation-cache", SUITE_CACHE]
    assert bench.main(["--smoke", "--launcher", launcher, "--keep", str(tmp_path), *cache]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["bench"] == "refill" and (record["trials"], record["slots"], record["rounds"]) == (3, 2, 1)
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
