"""bench/task_evals.py at a tiny size, so the command docs/performance.md quotes cannot rot: a
4-step run scored every 2 steps, its last line the record, its scorings' time a share of the run's."""

import importlib
import json

import pytest

from tests.conftest import SUITE_CACHE

bench = importlib.import_module("bench.task_evals")


@pytest.mark.slow  # a whole tiny run: its start-up and compilation (~10 s on 2 shared cores), not the steps
def test_a_tiny_run_scores_its_task_twice_and_the_record_says_what_it_cost(capsys):
    from dew.training.task_evals import TaskEvaluator

    score = TaskEvaluator.__call__
    tiny = ["--steps", "4", "--every", "2", "--examples", "6", "--rows", "8", "--width", "16", "--depth", "1"]
    tiny += ["--seq-len", "64", "--batch", "4", "--train-words", "2000", "--cache", str(SUITE_CACHE)]
    assert bench.main(tiny) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    record = json.loads(lines[-1])
    assert record["steps"] == 4 and record["scorings"] == 2 and record["rows"] == 24  # steps 2 and 4
    assert 0 < record["tasks_s"] < record["wall_s"] and record["share_of_wall"] == pytest.approx(
        record["tasks_s"] / record["wall_s"], abs=0.01
    )
    assert lines[-2].startswith("2 scorings of 24 rows in a 4-step run: ")
    assert TaskEvaluator.__call__ is score  # the bench's clock is off again
