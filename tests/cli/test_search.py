"""Hyperparameter search with hydra/sweeper=optuna (docs/search.md): a trial reports its run's
selection value, a study lives in its sweep directory and the same command continues it with the
trial count taken over the whole study, a diverged trial is recorded failed and the study goes on,
dew-runs shows and plots a study, and overrides into unset records say how to set them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import optuna
import pytest

from dew.commandline.overrides import check_unset_records, nullable_record, unset_record
from dew.contract import journal as journals
from dew.launching.naming import compact, short_keys
from dew.launching.search.trial import TrialFailed, selection_value
from dew.recipe import Recipe
from tests.conftest import SUITE_CACHE, dew
from tests.runs.ledger_checks import check_sweep_ledger
from tests.training.conftest import TINY, dew_train, fast_env, slow_steps

# 3 steps, evaluated at the end (the trial's value), a checkpoint at step 2 (an interrupted trial resumes).
SHORT = [*TINY, "trainer.steps=3", "trainer.eval_every=3", "trainer.checkpoint_every=2", "trainer.checkpoint_dir=ck"]
SEARCH = ["-m", "hydra/sweeper=optuna", "hparams_search=digits", "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=1"]


def study_of(sweep: Path) -> optuna.Study:
    from dew.runs.study_storage import journal

    storage = journal(str(sweep / "study.journal"))
    [summary] = optuna.get_all_study_summaries(storage)
    assert summary.study_name == sweep.name  # named after the sweep
    return optuna.load_study(study_name=summary.study_name, storage=storage)


def best_eval_loss(work: Path, sweep: Path, job: str) -> float:
    view = journals.read(work / "tracking" / sweep.name / job / "journal.jsonl")
    return min(view.series("eval/loss")[1])


def jobs(sweep: Path) -> dict[int, str]:
    return {int(p.name.split("-", 1)[0]): p.name for p in sweep.iterdir() if p.is_dir() and p.name[0].isdigit()}


# ------------------------------------------------------------------------------- fast: no training


def _journal(tmp_path: Path, records: list[dict]) -> Path:
    path = tmp_path / "journal.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_the_selection_value_is_the_best_of_the_metric_else_the_last_train_loss(tmp_path):
    records = [
        {"step": 1, "train/loss": 2.0},
        {"step": 2, "eval/loss": 1.5, "eval/acc": 0.6},
        {"step": 3, "train/loss": 1.2},
        {"step": 4, "eval/loss": 1.7, "eval/acc": 0.7, "train/loss": 1.1},
    ]
    path = _journal(tmp_path, records)
    assert selection_value(path, "eval/loss", False) == 1.5
    assert selection_value(path, "eval/acc", True) == 0.7  # a metric marked best, higher is better
    no_eval = _journal(tmp_path, [{"step": 1, "train/loss": 2.0}, {"step": 2, "train/loss": 1.25}])
    assert selection_value(no_eval, "eval/loss", False) == 1.25
    diverged = _journal(tmp_path, [{"step": 1, "train/loss": math.nan}])
    with pytest.raises(TrialFailed, match="no finite eval/loss nor train/loss"):
        selection_value(diverged, "eval/loss", False)


def test_a_sweeper_direction_against_the_metric_fails_the_trial():
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from dew.launching.search.trial import check_direction

    try:
        HydraConfig.instance().cfg = OmegaConf.create({"hydra": {"sweeper": {"direction": "minimize"}}})
        check_direction("eval/loss", False)
        with pytest.raises(
            TrialFailed,
            match="the best eval/accuracy, is higher for better runs: set hydra.sweeper.direction=maximize",
        ):
            check_direction("eval/accuracy", True)
        HydraConfig.instance().cfg = OmegaConf.create({"hydra": {"sweeper": {"direction": "maximize"}}})
        check_direction("eval/accuracy", True)
    finally:
        HydraConfig.instance().cfg = None


def test_a_search_without_the_extra_says_what_to_install(monkeypatch):
    import sys

    from dew.launching.search.trial import search_unavailable

    assert search_unavailable(["hparams_search=digits"]) is None and search_unavailable(["trainer.steps=2"]) is None
    monkeypatch.setitem(sys.modules, "optuna", None)  # as if not installed: importing it raises ImportError
    assert search_unavailable(["trainer.steps=2"]) is None
    for override in ("hparams_search=digits", "hydra/sweeper=optuna"):
        assert search_unavailable([override]).endswith("pip install 'dew[search]' (docs/search.md)")


def test_a_launch_that_raises_fails_its_trials_with_the_reason(tmp_path):
    """A launcher that raises (a queue that refuses the jobs, say) fails every trial it held, with
    the error on one line as the reason: none is left running for the next command to trip on."""
    from types import SimpleNamespace

    from dew.contract.rundir import STUDY_FAIL_REASON
    from dew.launching.search.study_sweeper import StudySweeper
    from dew.runs.study_storage import journal

    class Refusing:
        def launch(self, overrides, initial_job_idx):
            raise OSError("sbatch: error: Batch job submission failed\nand a second line")

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=journal(str(tmp_path / "study.journal")))
    space = {"trainer.steps": optuna.distributions.IntDistribution(1, 9)}
    trials = [study.ask(space), study.ask(space)]
    sweeper = SimpleNamespace(launcher=Refusing())
    said = StudySweeper._launch(sweeper, study, trials, [["trainer.steps=1"], ["trainer.steps=2"]])
    reason = "its launch failed: sbatch: error: Batch job submission failed"
    assert said == [reason, reason]
    assert [(t.state.name, t.user_attrs) for t in study.trials] == [("FAIL", {STUDY_FAIL_REASON: reason})] * 2


UNSET = {
    "optim.schedule.warmup_steps=15": "optim/schedule=cosine (options: cosine, linear, power)",
    "trainer.batch_ramp.start=16": "trainer.batch_ramp='{start: 16}' (its fields: start, increment, records)",
    "lora.rank=4": "lora='{rank: 4}' (its fields: rank, alpha, targets)",
    "trainer.profile.steps=3": "trainer.profile='{steps: 3}' (its fields: warmup, steps, directory)",
    "trainer.wandb.project=p": "trainer.wandb='{project: p}' (its fields: project, entity, offline)",
    "trainer.quantization.weight_qtype=int8": "trainer.quantization='{weight_qtype: int8}'",
    "trainer.trackers.mlflow.experiment=e": "trainer/trackers=mlflow (options: csv, mlflow, tensorboard, wandb;",
}


@pytest.fixture(scope="module")
def default_config():
    """The config plain ``dew-train`` composes (every optional record unset), composed once."""
    from hydra import compose, initialize_config_dir

    from dew.commandline.configs import conf_dir, register_configs

    register_configs()
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        return compose(config_name="config")


@pytest.mark.parametrize("override", list(UNSET))
def test_an_override_into_an_unset_record_says_how_to_set_it(override, default_config):
    from dew.commandline.configs import conf_dir

    key, _, value = override.partition("=")
    record = key.rsplit(".", 1)[0]
    assert nullable_record(key, Recipe)[0] == record
    problem = unset_record(key, default_config, Recipe, conf_dir(), value)
    assert problem is not None and problem.startswith(f"{key}: {record} is unset in this run (null)"), problem
    assert UNSET[override] in problem, problem


@pytest.mark.slow  # three compositions: ~4 s on a busy machine
def test_the_command_line_check_composes_what_the_command_chooses():
    from omegaconf import OmegaConf

    from dew.commandline.configs import conf_dir, register_configs

    register_configs()
    assert check_unset_records(["optim.schedule.warmup_steps=15"], Recipe, conf_dir()).startswith(
        "optim.schedule.warmup_steps: optim.schedule is unset"
    )
    assert check_unset_records(["experiment=digits", "optim.schedule.warmup_steps=15"], Recipe, conf_dir()) is None
    assert (
        check_unset_records(["optim/schedule=linear,cosine", "optim.schedule.warmup_steps=1"], Recipe, conf_dir())
        is None
    )  # a sweep over the group chooses one
    assert nullable_record("optim.learning_rate", Recipe) is None and nullable_record("lora", Recipe) is None
    chosen = OmegaConf.create({"optim": {"schedule": {"warmup_steps": 1}}})
    assert unset_record("optim.schedule.warmup_steps", chosen, Recipe) is None


@pytest.mark.slow
def test_dew_train_names_the_unset_schedule_and_writes_nothing(workdir: Path):
    result = dew("optim.schedule.warmup_steps=15", "trainer.checkpoint_dir=ck", cwd=workdir)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "dew-train: error: optim.schedule.warmup_steps: optim.schedule is unset in this run (null), so it has no "
        "field to set; choose one first, e.g. optim/schedule=cosine (options: cosine, linear, power), then set "
        "its fields"
    ]
    assert list(workdir.iterdir()) == []


# --------------------------------------------------------------------- a study, interrupted once


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory) -> str:
    """The suite's compilation cache, which the studies of this module share with the other tests:
    the model's initialisation, the evaluation and the sampling are the same programs in every trial
    (~2.5 s of compiling a trial loads instead)."""
    return f"trainer.compilation_cache_dir={SUITE_CACHE}"


@pytest.fixture(scope="module")
def interrupted_study(tmp_path_factory, xla_cache):
    """One study of 3 trials under the basic launcher, SIGKILLed once its second trial has saved
    step 2 (of 3) and then run again with the same command: (work dir, sweep dir, trial states after
    the kill, the first trial's journal as it was). A finished trial before the kill, the one it cut
    short, a new one after: 3 trials check what 4 did (with the kill in the third), ~2 CPU-s fewer."""
    work = tmp_path_factory.mktemp("study")

    def second_trial_saved_step_2(
        cwd: Path,
    ) -> bool:  # then it trains step 3, evaluates, saves: ~0.3 s (cached) to catch it
        return any((job / "2" / "_CHECKPOINT_METADATA").exists() for job in cwd.glob("ck/*/1-*"))

    killed = dew_train(
        *SEARCH, *SHORT, xla_cache, cwd=work, kill_when=second_trial_saved_step_2, poll=0.01, timeout=600
    )
    assert killed is None, killed.stdout[-3000:]
    [sweep] = list((work / "ck").glob("digits-sweep-*"))
    states = [t.state.name for t in study_of(sweep).trials]
    before = {0: (work / "tracking" / sweep.name / jobs(sweep)[0] / "journal.jsonl").read_text()}
    again = dew_train(*SEARCH, *SHORT, xla_cache, cwd=work, timeout=600)
    assert again is not None and again.returncode == 0, again.stdout[-3000:]
    return work, sweep, states, before


@pytest.mark.slow
def test_an_interrupted_study_continues_to_the_trials_asked_for(interrupted_study):
    work, sweep, states, before = interrupted_study
    assert states == ["COMPLETE", "RUNNING"]
    study = study_of(sweep)
    # 3 over the whole study, not 1 + 3: the count is the study's, not the command's
    assert [(t.number, t.state.name) for t in study.trials] == [(n, "COMPLETE") for n in range(3)]
    names = jobs(sweep)
    assert sorted(names) == [0, 1, 2]  # one job directory per trial: trial 1 ran again in its own
    for n, t in enumerate(study.trials):  # each named by its searched values, short keys at 4 digits
        short = short_keys(sorted(t.params))
        assert names[n] == f"{n}-" + ",".join(f"{short[k]}={compact(str(v))}" for k, v in sorted(t.params.items()))
    for n in before:  # a finished trial is kept as it was
        assert (work / "tracking" / sweep.name / names[n] / "journal.jsonl").read_text() == before[n]
    resumed = journals.read(work / "tracking" / sweep.name / names[1] / "journal.jsonl")
    assert [(e["event"], e["step"]) for e in resumed.events if e["event"] in ("start", "resume", "end")] == [
        ("start", 0),
        ("resume", 2),
        ("end", 3),
    ]  # trial 1 went on from its checkpoint


@pytest.mark.slow
def test_the_study_best_value_is_the_best_eval_loss_in_the_journals(interrupted_study):
    work, sweep, _, _ = interrupted_study
    study = study_of(sweep)
    values = {n: best_eval_loss(work, sweep, job) for n, job in jobs(sweep).items()}
    assert [t.value for t in study.trials] == pytest.approx([values[n] for n in range(3)], rel=1e-6)
    assert study.best_value == pytest.approx(min(values.values()), rel=1e-6)
    results = (sweep / "optimization_results.yaml").read_text()
    assert f"best_value: {study.best_value}" in results


@pytest.mark.slow
def test_optuna_dashboard_serves_the_study_as_dew_runs_lists_it(interrupted_study, tmp_path):
    """optuna-dashboard on the study this search made, read back over its HTTP API (the checks:
    tests/cli/test_dashboard.py)."""
    from tests.cli.test_dashboard import check_served

    work, sweep, _, _ = interrupted_study
    check_served(sweep, work / "tracking", tmp_path)


@pytest.mark.slow
def test_dew_runs_shows_the_study_best_first_and_plots_it(interrupted_study, tmp_path):
    from PIL import Image

    from dew.cli.runs import run

    work, sweep, _, _ = interrupted_study
    study = study_of(sweep)
    best = study.best_trial
    text = run([str(sweep), "--tracking", str(work / "tracking")])
    lines = text.splitlines()
    assert lines[0] == f"study {sweep.name} (minimize): 3 trials, 3 complete"
    overrides = " ".join(f"{k}={v}" for k, v in sorted(best.params.items()))
    assert lines[1].startswith(f"best: trial {best.number}, value ") and lines[1].endswith(overrides)
    assert lines[4].split()[:2] == [str(best.number), "complete"]  # the table's first row is the best trial
    assert sum(line.split()[1:2] == ["complete"] for line in lines[3:9]) == 3
    out = tmp_path / "study.png"
    said = run(["plot", str(sweep), "-o", str(out)])
    assert said.startswith(f"wrote {out}") and "3 trials" in said
    assert Image.open(out).size == (1260, 320)  # two searched parameters and the best so far: three panels


# ------------------------------------------------------------ local launcher, a failed trial


@pytest.mark.slow
def test_a_study_under_the_local_launcher_refills_a_diverged_trials_slot_and_goes_on(workdir: Path, xla_cache):
    """Two slots, three trials: the second trial diverges at its first step and is recorded failed;
    its slot takes the third trial at once, while the first still trains its 100 steps. (A fourth
    trial, one more local job, checked nothing the third does not: the study going on past the
    failure, in the freed slot. Without it, and with 100 steps instead of 300: 21 CPU-s, not 32,
    with every program cached.)"""
    from dew.cli.runs import run

    # The preset's TPE sampler (seed 0) draws 0.001, 1e6, 0.001 from this choice.
    local = [
        "hydra/launcher=local",
        "hydra.launcher.tasks_per_node=1",
        "hydra.sweeper.n_jobs=2",
        "optim.learning_rate=choice(1e6,0.001)",
        "optim.weight_decay=0.05",
    ]
    long = ["trainer.steps=100", "trainer.eval_every=100", "trainer.checkpoint_every=null", "trainer.log_every=50"]
    # Each step 60 ms long (a plugin's hook): the first trial's 100 steps outlast the second's
    # failure and the third's start by seconds, whatever the programs' cache (with every program
    # loaded a tiny step takes ~3 ms, and the first trial had ended 6 ms before the third began).
    # 100 steps of 60 ms, not 300 of 20: the same 6 s of margin with a third of the steps to compute.
    pythonpath, hook = slow_steps(workdir / "site", 0.06)
    result = dew_train(
        *SEARCH, *local, *SHORT, *long, hook, xla_cache, cwd=workdir, timeout=600, env=fast_env(PYTHONPATH=pythonpath)
    )
    assert result is not None and result.returncode == 0, result.stdout[-3000:]
    [sweep] = list((workdir / "ck").glob("digits-sweep-*"))
    study = study_of(sweep)
    assert [(t.state.name, t.params["optim.learning_rate"]) for t in study.trials] == [
        ("COMPLETE", 0.001),
        ("FAIL", 1e6),
        ("COMPLETE", 0.001),
    ]
    names = jobs(sweep)
    assert sorted(names) == [0, 1, 2]
    for t in study.trials:
        if t.state.name == "COMPLETE":
            assert t.value == pytest.approx(best_eval_loss(workdir, sweep, names[t.number]), rel=1e-6)
    assert study.best_value == min(t.value for t in study.trials if t.value is not None)
    first, _, third = study.trials
    assert third.datetime_start < first.datetime_complete  # the freed slot did not wait for the first trial
    text = run([str(sweep), "--tracking", str(workdir / "tracking")])
    [failed] = [line for line in text.splitlines() if line.split()[1:2] == ["fail"]]
    assert failed.startswith("1 ") and "(run failed: nonfinite: the loss or the gradients became non-finite" in failed
    # the goodput ledger of a 3-trial sweep: its idle slots (the gap before the third trial, the tail)
    check_sweep_ledger(sweep, workdir / "tracking", slots=2, trials=3)


# ------------------------------------------------------------------------ the documented commands

PRESETS = "tests/cli/test_presets.py::test_a_search_preset_completes_its_trials_with_int_warmups"
DOCUMENTED = {
    "dew-train -m experiment=digits hparams_search=digits": PRESETS,
    "dew-train -m experiment=digits hparams_search=digits hydra.sweeper.n_trials=40": "interrupted_study",
    "dew-train -m experiment=digits hparams_search=digits hydra/launcher=local hydra.launcher.tasks_per_node=1": "test_a_study_under_the_local_launcher_refills_a_diverged_trials_slot_and_goes_on",  # noqa: E501
    "dew-train -m hydra/sweeper=optuna experiment=digits optim.learning_rate='tag(log, interval(1e-4, 1e-2))'": "test_the_documented_search_without_a_preset_runs",  # noqa: E501
    "dew-train -m experiment=tiny_lm hparams_search=tiny_lm data.path=data/tiny/train.bin": PRESETS,
    "dew-train --check -m experiment=digits hparams_search=digits": "tests/cli/test_docs.py runs it as written (a check trains nothing)",  # noqa: E501
    "dew-train -m experiment=digits hparams_search=digits hydra.sweeper.n_trials=8 hydra.sweeper.pruner.n_startup_trials=2": "tests/cli/test_pruning.py::test_a_median_pruner_prunes_the_bad_rates_before_their_end",  # noqa: E501
    "dew-train -m experiment=digits hparams_search=digits hydra/sweeper/pruner=successive_halving hydra.sweeper.pruner.min_resource=300": "tests/cli/test_docs.py checks it (--check builds the pruner; every pruner is tested in tests/cli/test_pruning.py)",  # noqa: E501
    "dew-train -m experiment=digits hparams_search=digits hydra/launcher=slurm hydra.sweeper.workers=4": "tests/cli/test_workers.py::test_workers_run_the_study_without_the_command_to_exactly_n_trials",  # noqa: E501
    "dew-train -m experiment=digits hparams_search=digits hydra/sweeper/sampler=qmc hydra.sweeper.n_trials=16": "tests/cli/test_samplers.py runs a short study with each sampler; tests/cli/test_docs.py checks it as written",  # noqa: E501
}
"""Each search command in docs/search.md and README.md, and the test that runs it at tiny size (the
same overrides plus a tiny model, a few steps and a few trials; the presets with what they set kept,
tests/cli/test_presets.py)."""


def test_every_documented_search_is_run_by_a_test():
    from tests.cli.test_docs import documented_commands

    searches = {c for _, c in documented_commands() if "hparams_search=" in c or "hydra/sweeper=optuna" in c}
    assert searches == set(DOCUMENTED)


@pytest.mark.slow
def test_the_documented_search_without_a_preset_runs(workdir: Path, xla_cache):
    """The documented command with a tiny model and one trial, on the suite's compilation cache and
    with no samples at the end (it had compiled every program without a cache and traced the
    sampler: 17 s of its trial's 18 on a busy machine; nothing here looks at either)."""
    import shlex

    one = [
        "hydra.sweeper.n_trials=1",
        "hydra.sweeper.n_jobs=1",
        "trainer.steps=2",
        "trainer.eval_every=2",
        "trainer.checkpoint_every=null",
        "trainer.log_every=1",
        xla_cache,
        "trainer.final_samples=false",
        "trainer.checkpoint_dir=ck",
        "model.config.depth=1",
        "model.config.hidden_size=32",
        "model.config.num_heads=2",
    ]
    digits = shlex.split(next(c for c in DOCUMENTED if "tag(log" in c))[1:]
    result = dew_train(
        *digits,
        *one,
        "trainer.batch_size=32",
        "optim.schedule.warmup_steps=1",
        "flow_matching.samples_per_class=1",
        "flow_matching.sample_steps=1",
        cwd=workdir,
        timeout=600,
    )
    assert result is not None and result.returncode == 0, result.stdout[-3000:]
    [sweep] = list((workdir / "ck").glob("digits-sweep-*"))
    [trial] = study_of(sweep).trials
    assert trial.state.name == "COMPLETE" and 1e-4 <= trial.params["optim.learning_rate"] <= 1e-2
    assert set(trial.params) == {"optim.learning_rate"}  # the command line's space, no preset's


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # create_trial, add_trial
def test_a_trial_that_fails_before_it_trains_is_a_failed_trial_with_its_reason(workdir: Path):
    """A trial whose override Hydra cannot merge (a float into an int field) or whose config dew
    refuses is recorded FAIL with the message, never left running, and the study goes on: one grid
    trial of three trains. A trial an older command left running with such a value (dew before
    ``int(interval(...))``) is recorded FAIL when the same command resumes the study; the grid of a
    search is checked as well, but a bad trial is one failed trial, not the end of the search. A
    study whose trials mostly failed ends with exit status 1, once its best trial is reported, in a
    line that says so and names the first failure."""
    from dew.cli.runs import run
    from dew.contract.rundir import STUDY_FAIL_REASON

    key = "optim.schedule.warmup_steps"
    command = [
        "-m",
        "hydra/sweeper=optuna",
        "hydra/sweeper/sampler=grid",
        "hydra.sweeper.n_jobs=3",
        f"{key}=choice(1,2.5,-1)",
        *[a for a in SHORT if not a.startswith(f"{key}=")],
    ]
    out = dew_train(*command, "hydra.sweeper.n_trials=3", cwd=workdir)
    assert out.returncode == 1, out.stdout[-3000:]
    assert f"{key}=-1 must be >= 0: the trial fails and the search goes on" in out.stdout
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("dew-train: error: 2 of the study's 3 finished trials failed (the first, trial "), last
    assert "the best of those that completed is trial " in last and "best trial " in out.stdout
    [sweep] = (workdir / "ck").iterdir()
    trials = {t.params[key]: t for t in study_of(sweep).trials}
    assert {v: t.state.name for v, t in trials.items()} == {1: "COMPLETE", 2.5: "FAIL", -1: "FAIL"}
    merge = f"Error merging override {key}=2.5: Value '2.5' of type 'float' could not be converted to Integer"
    assert trials[2.5].user_attrs[STUDY_FAIL_REASON] == merge
    assert f"{key}=-1 must be >= 0" in trials[-1].user_attrs[STUDY_FAIL_REASON]
    assert STUDY_FAIL_REASON not in trials[1].user_attrs

    # As an older dew left a trial whose float it could not merge: running, with no job of its own.
    study = study_of(sweep)
    space = trials[2.5].distributions
    study.add_trial(
        optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING, params={key: 2.5}, distributions=space)
    )
    again = dew_train(*command, "hydra.sweeper.n_trials=4", cwd=workdir)
    assert again.returncode == 1 and "3 of the study's 4 finished trials failed" in again.stdout, again.stdout[-3000:]
    assert "resuming trial(s) [3]" in again.stdout
    resumed = study_of(sweep).trials[3]
    assert resumed.state.name == "FAIL" and resumed.user_attrs[STUDY_FAIL_REASON] == merge
    text = run([str(sweep), "--tracking", str(workdir / "tracking")])
    failed = {line.split()[0]: line for line in text.splitlines() if line.split()[1:2] == ["fail"]}
    assert sorted(failed) == sorted(str(t.number) for t in [trials[2.5], trials[-1], resumed])
    assert failed["3"].endswith(f"(failed before it trained: {merge})")
    assert failed[str(trials[2.5].number)].endswith(f"(failed before it trained: {merge})")
    refused = trials[-1].user_attrs[STUDY_FAIL_REASON]  # its job made a directory (.hydra/), not a run
    assert failed[str(trials[-1].number)].endswith(f"(failed before it trained: {refused})")


@pytest.mark.slow  # a dew-train that composes and stops: ~5 s
def test_a_float_interval_for_an_int_field_is_refused_before_any_trial(workdir: Path):
    """The presets' old ``interval(0, 300)`` for the warmup: every trial would fail, so the search is
    refused at once, with the fix, and nothing is written (no sweep directory, no study)."""
    result = dew(
        "-m",
        "experiment=digits",
        "hparams_search=digits",
        "optim.schedule.warmup_steps=interval(0, 300)",
        "trainer.checkpoint_dir=ck",
        cwd=workdir,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "dew-train: error: hydra.sweeper.params: Error merging override optim.schedule.warmup_steps=0.0: Value "
        "'0.0' of type 'float' could not be converted to Integer; optim.schedule.warmup_steps is searched as "
        "floats (interval(a, b) samples floats, even between integer bounds): an int field needs "
        "int(interval(a, b)), range(a, b) or choice(...) (docs/search.md)"
    ]
    assert list(workdir.iterdir()) == []


def test_the_study_file_needs_no_flock_and_one_sweeper_holds_it(tmp_path, capsys, monkeypatch):
    """``flock`` fails on NFS without a lock manager and on Lustre without ``-o flock``: the study's
    journal is written and read with ``flock`` failing, and dew's run lock (a lease where flock fails)
    keeps it to one sweeping command. (Many writers at once: tests/runs/test_study_journal.py.)"""
    import errno
    import fcntl

    from dew.contract.rundir import STUDY_FILE, STUDY_LOCK_DIR
    from dew.launching.search.study_sweeper import holding_the_study
    from dew.runs.study_storage import journal, sweeper_storage

    def no_flock(fd, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    study = optuna.create_study(study_name="s", storage=sweeper_storage(str(tmp_path), None))
    study.tell(study.ask({"x": optuna.distributions.FloatDistribution(0, 1)}), 0.25)
    path = str(tmp_path / STUDY_FILE)
    assert [t.value for t in optuna.load_study(study_name="s", storage=journal(path)).trials] == [0.25]
    assert sorted(p.name for p in tmp_path.iterdir()) == [STUDY_FILE]  # no lock file left behind
    with holding_the_study(str(tmp_path)):
        with pytest.raises(SystemExit) as refused, holding_the_study(str(tmp_path)):
            pass
        assert refused.value.code == 4
        assert "the study in" in capsys.readouterr().err
    assert not (tmp_path / STUDY_LOCK_DIR).exists()  # no trace once the sweep ends
    with holding_the_study(str(tmp_path)):  # and the next command takes it
        pass


# -------------------------------------------------------------- a study an older dew made, continued

OLD_STUDY = Path(__file__).resolve().parents[1] / "fixtures" / "optuna2_study"
"""A study made by dew before its own sweeper (hydra-optuna-sweeper 1.3, optuna 2.10, SQLite), with
the command below at n_trials=2 (checked in: ``study.db`` and its ``optimization_results.yaml``)."""
OLD_COMMAND = [
    "-m",
    "hydra/sweeper=optuna",
    "hparams_search=digits",
    "hydra.sweeper.n_jobs=1",
    # TINY as it was when the study was made (without what it gained since: the sweep's directory
    # is the digest of the command)
    *[a for a in TINY if not a.startswith(("trainer.compilation_cache_dir=", "trainer.final_samples="))],
    "trainer.steps=3",
    "trainer.eval_every=3",
    "trainer.checkpoint_every=2",
    "trainer.checkpoint_dir=ck",
]


@pytest.mark.slow
def test_a_study_an_older_dew_made_is_continued_by_the_same_command(workdir: Path):
    """The same command, asked for one trial more, keeps the two trials optuna 2.10 recorded (their
    parameters, values and intermediate values), adds the third, reports the best, and leaves the
    old file exactly as it was; ``dew-runs`` reads the old file before and the journal after."""
    import filecmp
    import shutil

    from dew.cli.runs import run
    from dew.runs.study_storage import reading, study_name

    sweep = workdir / "ck" / "digits-sweep-91ab037321"  # the digest of OLD_COMMAND: the same directory
    sweep.mkdir(parents=True)
    shutil.copy(OLD_STUDY / "study.db", sweep / "study.db")
    with reading(str(sweep)) as storage:
        old = optuna.load_study(study_name=study_name(storage, str(sweep)), storage=storage).trials
    assert [(t.number, t.state.name) for t in old] == [(0, "COMPLETE"), (1, "COMPLETE")]
    before = run([str(sweep), "--tracking", str(workdir / "tracking")]).splitlines()
    assert before[0] == f"study {sweep.name} (minimize): 2 trials, 2 complete"

    result = dew_train(*OLD_COMMAND, "hydra.sweeper.n_trials=3", cwd=workdir, timeout=600)
    assert result is not None and result.returncode == 0, result.stdout[-3000:]
    assert f"{sweep.name}: 2 trials so far, 3 asked for" in result.stdout
    study = study_of(sweep)
    assert [(t.number, t.state.name) for t in study.trials] == [(0, "COMPLETE"), (1, "COMPLETE"), (2, "COMPLETE")]
    for was, now in zip(old, study.trials):
        assert (now.params, now.value, now.intermediate_values) == (was.params, was.value, was.intermediate_values)
    assert set(jobs(sweep)) == {2}  # only the new trial trained here
    assert study.trials[2].value == pytest.approx(best_eval_loss(workdir, sweep, jobs(sweep)[2]), rel=1e-6)
    best = min(study.trials, key=lambda t: t.value)
    assert f"best trial {best.number}: {best.params} = {best.value}" in result.stdout
    assert f"best_value: {best.value}" in (sweep / "optimization_results.yaml").read_text()
    assert filecmp.cmp(OLD_STUDY / "study.db", sweep / "study.db", shallow=False)  # the old file as it was
    after = run([str(sweep), "--tracking", str(workdir / "tracking")]).splitlines()
    assert after[0] == f"study {sweep.name} (minimize): 3 trials, 3 complete"
