"""Training a run further (dew.training.extension): a finished run given a longer ``trainer.steps``
resumes and ends, bit for bit, where a run of that length trained in one go ends, when its schedule
keeps the rates of the steps it trained; a length change that would rewrite those rates is refused
in one line. ``trainer.max_time`` stops a run with a checkpoint, and the run resumes bit for bit."""

from __future__ import annotations

import dataclasses
import signal
from pathlib import Path

import numpy as np
import pytest
from etils import epath

from dew.config import TrainerConfig
from dew.launching.stop_exit import EXIT_MAX_TIME, exit_after_stop
from dew.recipe import Recipe
from dew.runs.status import read_run
from dew.training.extension import check_length
from dew.training.optim.schedules import CosineSchedule, PowerSchedule
from dew.training.preemption import MAX_TIME, Preempted
from dew.training.run_directory import RunDirError, prepare_run_dir
from tests.training.conftest import journal, load_params, losses, steps_on_disk, train_tiny

# A constant rate after a 10-step warmup: cosine with its floor at the peak.
CONSTANT_AFTER_WARMUP = ["optim.schedule.warmup_steps=10", "optim.schedule.floor_ratio=1.0"]
QUIET = ["trainer.eval_every=null", "trainer.checkpoint_every=null", "trainer.log_every=10"]
# The length of the run both slow tests compare with (in this process a tiny step costs ~9 ms of
# CPU, a 12-step run ~1.6 CPU-s: a run's cost is almost all fixed).
WHOLE = [*CONSTANT_AFTER_WARMUP, *QUIET, "trainer.steps=60"]


def _same_params(a: Path, b: Path, step: int) -> None:
    x, y = load_params(a, step), load_params(b, step)
    assert x.keys() == y.keys() and len(x) > 5
    for key in x:
        np.testing.assert_array_equal(x[key], y[key], err_msg=key)


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> tuple[Path, list[dict]]:
    """A run of 60 steps trained at once (its directory, its journal): what the extended run and the
    run stopped by trainer.max_time each end on: one run for both tests, where each trained its own."""
    tmp = tmp_path_factory.mktemp("whole")
    _, run, records = train_tiny(tmp, *WHOLE, name="whole")
    return run, records


@pytest.mark.slow
def test_a_finished_run_trained_further_equals_one_run_of_the_new_length(tmp_path: Path, whole):
    # 20 steps grown to 60 (they were 100 and 200, then 40 and 80): past the warmup's 10, and the
    # grown run crosses an epoch of the digits (1,617 images: 50 batches of 32) after its resume.
    whole, whole_journal = whole
    _, run, _ = train_tiny(tmp_path, *WHOLE, "trainer.steps=20", name="grown")
    assert steps_on_disk(run) == [20]
    _, run, grown_journal = train_tiny(tmp_path, *WHOLE, name="grown")

    # The schedule past step 20: the peak, as in the run trained to 60 at once (and the warmup's
    # rates before it were the same at either length, which is why the extension was accepted).
    peak = Recipe.load(str(run)).optim.learning_rate
    rates = losses(grown_journal, "train/lr")
    assert [s for s in rates if s > 20] == [30, 40, 50, 60]
    assert all(rates[s] == np.float32(peak) for s in rates if s > 20)
    assert rates == losses(whole_journal, "train/lr") and losses(grown_journal) == losses(whole_journal)
    _same_params(whole, run, 60)

    # The record says 60 steps; the journal says where the length changed; dew-runs reads it as done.
    assert Recipe.load(str(run)).trainer.steps == 60
    events = [(r["event"], r["step"]) for r in grown_journal if r.get("event") in ("start", "resume", "extend", "end")]
    assert events == [("start", 0), ("resume", 20), ("extend", 20), ("end", 60)]
    extend = next(r for r in grown_journal if r.get("event") == "extend")
    assert (extend["from_steps"], extend["to_steps"]) == (20, 60)
    summary = read_run(epath.Path(run), "grown", tracking=str(tmp_path / "tracking")).summary
    assert (summary.status, summary.step, summary.total_steps) == ("finished", 60, 60)


def _recorded(tmp: Path, schedule: object, steps: int, reached: int) -> Recipe:
    """A run recorded at ``steps`` with a checkpoint directory at step ``reached``."""
    recipe = Recipe(trainer=TrainerConfig(checkpoint_dir=str(tmp), steps=steps, compilation_cache_dir=None))
    recipe = dataclasses.replace(recipe, optim=dataclasses.replace(recipe.optim, schedule=schedule))
    prepare_run_dir(recipe, "r", trains="flow_matching")
    (tmp / "r" / str(reached)).mkdir()
    return recipe


def _grow(recipe: Recipe, steps: int) -> Recipe:
    return dataclasses.replace(recipe, trainer=dataclasses.replace(recipe.trainer, steps=steps))


def _check(tmp: Path, recipe: Recipe, steps: int):
    path = epath.Path(tmp / "r")
    recorded = {"trainer": {"steps": recipe.trainer.steps, "epochs": None}}
    return check_length(_grow(recipe, steps), recorded, None, path)  # type: ignore[arg-type]  # steps: no data read


def test_a_decay_over_the_runs_length_is_not_stretched_over_steps_already_trained(tmp_path: Path):
    recipe = _recorded(tmp_path, CosineSchedule(warmup_steps=10), steps=100, reached=100)
    with pytest.raises(RunDirError) as refused:
        _check(tmp_path, recipe, 200)
    message = str(refused.value)
    assert "\n" not in message and "trainer.steps=100 -> trainer.steps=200" in message
    assert "step 11 trained at" in message and "trainer.init_from=" in message  # the first step past the warmup


@pytest.mark.parametrize(
    "reached, accepted",
    # the tail of a 100-step run starts at step 80: step 81's rate is the first it lowers
    [(60, True), (81, True), (82, False), (100, False)],
)
def test_warmup_stable_decay_extends_until_its_tail_begins(tmp_path: Path, reached: int, accepted: bool):
    wsd = PowerSchedule(warmup_steps=10, b=0.0, decay_steps=20)  # min(peak, a·T^0): the peak, then a tail
    recipe = _recorded(tmp_path, wsd, steps=100, reached=reached)
    if accepted:
        extension = _check(tmp_path, recipe, 300)
        assert extension is not None and (extension.at_step, extension.to_steps) == (reached, 300)
    else:
        with pytest.raises(RunDirError, match="would change the learning rate of steps already trained"):
            _check(tmp_path, recipe, 300)


def test_a_length_below_the_step_reached_is_refused(tmp_path: Path):
    recipe = _recorded(tmp_path, None, steps=100, reached=60)
    assert _check(tmp_path, recipe, 70) is not None  # a constant rate: shortened, still the same run
    with pytest.raises(RunDirError, match="already reached step 60; give at least trainer.steps=60"):
        _check(tmp_path, recipe, 50)


# ------------------------------------------------------------------------------- trainer.max_time


@pytest.mark.parametrize(
    "value, seconds",
    [("5400", 5400), (90, 90), ("90m", 5400), ("1.5h", 5400), ("1h30m", 5400), ("00:12:00:00", 43200), ("2d", 172800)],
)
def test_max_time_reads_the_spellings_people_use(value: object, seconds: float):
    assert TrainerConfig(max_time=value).max_time_seconds() == seconds  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["0", "-5", "12:00", "90x", "30m1h", "soon", "nan"])
def test_a_bad_max_time_is_refused_naming_the_field(value: str):
    with pytest.raises(ValueError, match=r"^trainer\.max_time=.* is not a positive duration: give seconds") as err:
        TrainerConfig(max_time=value)
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_max_time_stops_with_a_checkpoint_and_the_run_resumes_bit_for_bit(tmp_path: Path, whole):
    # The same run as the extension's whole run of 60, which it ends on: the ~48 steps more that the
    # resume trains here cost less than the 12-step reference run it trained did (0.4 against 1.6
    # CPU-s, measured in one process with the programs cached).
    whole, whole_journal = whole
    # 10 ms: spent before the first step ends (the set-up and the compilation count), so the run
    # stops at its first step boundary, whatever this machine's speed.
    with pytest.raises(Preempted) as stopped:
        train_tiny(tmp_path, *WHOLE, "trainer.max_time=0.01", name="cut")
    at = stopped.value.step
    assert stopped.value.reason == MAX_TIME and 1 <= at < 60
    assert "trainer.max_time reached" in str(stopped.value)
    assert steps_on_disk(tmp_path / "ck" / "cut") == [at]
    last = [r for r in journal(tmp_path, "cut") if "event" in r][-1]
    assert (last["event"], last["reason"], last["step"]) == ("stop", MAX_TIME, at)
    summary = read_run(epath.Path(tmp_path / "ck" / "cut"), "cut", tracking=str(tmp_path / "tracking")).summary
    assert summary.status == "stopped" and summary.reason is not None and summary.reason.startswith("max_time")

    # A later command, with another limit (a resume may change it), trains the rest.
    _, cut, cut_journal = train_tiny(tmp_path, *WHOLE, "trainer.max_time=1h", name="cut")
    assert losses(cut_journal) == losses(whole_journal)
    _same_params(whole, cut, 60)


def test_a_max_time_stop_exits_with_timeouts_status():
    with pytest.raises(SystemExit) as exited:
        exit_after_stop(signal.SIGTERM, reason=MAX_TIME)
    assert exited.value.code == EXIT_MAX_TIME == 124
