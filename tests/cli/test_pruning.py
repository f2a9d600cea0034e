"""Pruning a search's trials (hydra/sweeper/pruner; docs/search.md, "Pruning"): a trial's verdict,
judged against a study built from the sweep's journals, is Optuna's own verdict for a study its
trials reported to directly; a pruned trial stops through its run's stop request, the study records
it PRUNED with its intermediate values, and dew-runs says where it stopped, under the basic and the
local launcher."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import optuna
import pytest

from dew.contract import journal as journals
from dew.contract.rundir import PRUNED
from dew.launching.search.pruning import Reported, judge, sweep_reports
from dew.launching.search.sweeper_conf import PRUNERS
from dew.runs.study_storage import journal
from tests.conftest import SUITE_CACHE
from tests.training.conftest import TINY, dew_train

TrialState = optuna.trial.TrialState

# ------------------------------------------------------------------------------- fast: no training

STEPS = (5, 10, 15, 20)
"""The evaluations of each simulated trial (training steps)."""


def curves(n: int = 9, seed: int = 0) -> list[list[float]]:
    """``n`` loss curves over ``STEPS``: falling at rates drawn at random, some not at all."""
    rng = np.random.default_rng(seed)
    return [[2.0 * math.exp(-rate * s / 20) + noise for s in STEPS] for rate, noise in rng.uniform(0, 1.5, (n, 2))]


PRUNER_CASES = {
    "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=2),
    "percentile": lambda: optuna.pruners.PercentilePruner(40.0, n_startup_trials=1, n_warmup_steps=6),
    "successive_halving": lambda: optuna.pruners.SuccessiveHalvingPruner(min_resource=5, reduction_factor=2),
    "hyperband": lambda: optuna.pruners.HyperbandPruner(min_resource=5, max_resource=20, reduction_factor=2),
    "threshold": lambda: optuna.pruners.ThresholdPruner(upper=1.5, n_warmup_steps=6),
}


def optuna_verdicts(make_pruner, values: list[list[float]]) -> list[int | None]:
    """The reference: the trials run one after another in a study held by Optuna, each reporting at
    its evaluations and asking ``should_prune``, as in Optuna's own examples; the step each was
    pruned at (None: it completed)."""
    study = optuna.create_study(study_name="s", pruner=make_pruner())
    out: list[int | None] = []
    for curve in values:
        trial, pruned = study.ask(), None
        for step, value in zip(STEPS, curve):
            trial.report(value, step)
            if step < STEPS[-1] and trial.should_prune():
                pruned = step
                break
        study.tell(trial, state=TrialState.PRUNED) if pruned else study.tell(trial, curve[-1])
        out.append(pruned)
    return out


def dew_verdicts(make_pruner, values: list[list[float]]) -> list[int | None]:
    """The same trials judged as dew's trials judge: each in a pruner of its own (a process of its
    own), against what the trials before it reported (their journals), carrying the pruner's
    attributes for itself from one evaluation to the next (its checkpoint)."""
    reports: dict[int, Reported] = {}
    out: list[int | None] = []
    for number, curve in enumerate(values):
        pruner, own, pruned = make_pruner(), Reported(number, TrialState.RUNNING, {}), None
        for step, value in zip(STEPS, curve):
            own.values[step] = value
            if step < STEPS[-1]:
                verdict, own.attrs = judge(pruner, "s", "minimize", reports, own)
                if verdict:
                    pruned = step
                    break
        own.state, own.pruned_at = (TrialState.PRUNED, pruned) if pruned else (TrialState.COMPLETE, None)
        reports[number] = own
        out.append(pruned)
    return out


@pytest.mark.parametrize("name", list(PRUNER_CASES))
def test_a_trial_judged_from_the_journals_gets_optunas_own_verdict(name):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    values = curves()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        expected = optuna_verdicts(PRUNER_CASES[name], values)
        assert dew_verdicts(PRUNER_CASES[name], values) == expected
    assert any(expected) and not all(expected), expected  # the case prunes some trials and keeps others


def test_every_pruner_option_builds_optunas_class():
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    confs = {name: OmegaConf.structured(conf) for name, conf in PRUNERS.items()}
    with pytest.raises(TypeError, match="Either lower or upper"):  # dew-train reports it in one line, exit 2
        instantiate(confs["threshold"])()
    confs["threshold"].upper = 1.5
    built = {name: instantiate(conf)() for name, conf in confs.items()}
    assert isinstance(built["median"], optuna.pruners.MedianPruner)
    assert isinstance(built["percentile"], optuna.pruners.PercentilePruner)
    assert isinstance(built["successive_halving"], optuna.pruners.SuccessiveHalvingPruner)
    assert isinstance(built["hyperband"], optuna.pruners.HyperbandPruner)
    assert isinstance(built["threshold"], optuna.pruners.ThresholdPruner)
    assert (built["threshold"]._lower, built["threshold"]._upper) == (-math.inf, 1.5)  # Optuna's own


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # create_trial, add_trial
def test_hyperbands_bracket_is_the_same_in_every_process():
    """Every trial's process judges it in the same bracket: Optuna picks a trial's bracket with a
    crc32 of the study's name and the trial's number (Optuna 2.10 used Python's salted ``hash``),
    whose values are known."""
    import zlib

    pruner = optuna.pruners.HyperbandPruner(min_resource=1, max_resource=27, reduction_factor=3)
    study = optuna.create_study(study_name="study")
    for _ in range(8):
        study.add_trial(optuna.trial.create_trial(state=TrialState.RUNNING, params={}, distributions={}))
    assert pruner._get_bracket_id(study, study.trials[7]) == 0  # before its brackets are known
    study._storage.set_trial_intermediate_value(study.trials[0]._trial_id, 1, 1.0)
    pruner.prune(study, study.trials[0])  # the brackets, from max_resource
    budgets = pruner._trial_allocation_budgets
    assert len(budgets) == 4  # log_3(27) + 1 brackets
    for number in range(8):
        n = zlib.crc32(f"study_{number}".encode()) % sum(budgets)
        expected = next(i for i in range(4) if n < sum(budgets[: i + 1]))
        assert pruner._get_bracket_id(study, study.trials[number]) == expected


def _journal(path: Path, records: list[dict]) -> None:
    path.mkdir(parents=True)
    (path / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_sweeps_journals_say_each_trials_state_values_and_rungs(tmp_path):
    start = {"event": "start", "step": 0, "total_steps": 20, "version": 1}
    _journal(
        tmp_path / "0-lr=1",
        [start, {"step": 5, "eval/loss": 1.0}, {"step": 20, "eval/loss": 0.5}, {"event": "end", "step": 20}],
    )
    _journal(
        tmp_path / "1-lr=2",
        [
            start,
            {"step": 5, "eval/loss": 2.0},
            {"event": "prune_check", "step": 5, "value": 2.0, "pruned": True, "attrs": {"completed_rung_0": 2.0}},
            {"event": "early_stop", "step": 5, "reason": PRUNED, "message": "MedianPruner at step 5 of 20"},
            {"event": "end", "step": 5},
        ],
    )
    _journal(
        tmp_path / "2-lr=3",
        [start, {"step": 5, "eval/loss": "nan"}, {"event": "stop", "step": 5, "reason": "nonfinite"}],
    )
    _journal(tmp_path / "3-lr=4", [start, {"step": 5, "eval/loss": 1.5}])  # still running
    (tmp_path / "4-lr=5").mkdir()  # refused before it trained: no journal
    reports = sweep_reports(tmp_path, "eval/loss")
    assert {n: (r.state, r.pruned_at) for n, r in reports.items()} == {
        0: (TrialState.COMPLETE, None),
        1: (TrialState.PRUNED, 5),
        2: (TrialState.FAIL, None),
        3: (TrialState.RUNNING, None),
    }
    assert reports[0].values == {5: 1.0, 20: 0.5} and reports[1].attrs == {"completed_rung_0": 2.0}
    assert math.isnan(reports[2].values[5])


def test_a_pruned_trials_report_is_replayed_into_the_study_with_its_rungs(tmp_path):
    """The sweeper, the study's writer, puts a trial's journal into the study when it ends: its
    intermediate values and the pruner's attributes (successive halving's rung), where Optuna's own
    reporting would have put them, so the study file holds what a pruner reads."""
    from dew.launching.search.pruning import replay

    start = {"event": "start", "step": 0, "total_steps": 20, "version": 1}
    _journal(
        tmp_path / "0-lr=2",
        [
            start,
            {"step": 5, "eval/loss": 2.0},
            {"event": "prune_check", "step": 5, "value": 2.0, "pruned": True, "attrs": {"completed_rung_0": 2.0}},
            {"event": "early_stop", "step": 5, "reason": PRUNED, "message": "SuccessiveHalvingPruner at step 5"},
            {"event": "end", "step": 5},
        ],
    )
    study = optuna.create_study(storage=journal(str(tmp_path / "study.journal")))
    trial = study.ask()
    report = replay(study, trial.number, str(tmp_path / "0-lr=2" / "journal.jsonl"), "eval/loss")
    assert report.state == TrialState.PRUNED
    study.tell(trial.number, state=TrialState.PRUNED)
    [told] = study.trials
    assert told.intermediate_values == {5: 2.0} and told.value == 2.0
    assert told.system_attrs == {"completed_rung_0": 2.0}


def test_a_pruner_optuna_refuses_or_that_could_never_prune_is_refused(capsys):
    import functools

    from omegaconf import OmegaConf

    from dew.launching.search.study_sweeper import StudySweeper

    evaluating = OmegaConf.create({"trainer": {"eval_every": 5}})
    bad = SimpleNamespace(pruner=functools.partial(optuna.pruners.PercentilePruner, 150.0), config=evaluating)
    with pytest.raises(SystemExit) as refused:
        StudySweeper._check_pruner(bad)
    assert refused.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "dew-train: error: hydra.sweeper.pruner: Percentile must be between 0 and 100 inclusive, "
        "but got percentile=150.0."
    )
    blind = SimpleNamespace(
        pruner=optuna.pruners.MedianPruner, config=OmegaConf.create({"trainer": {"eval_every": None}})
    )
    with pytest.raises(SystemExit) as refused:
        StudySweeper._check_pruner(blind)
    assert refused.value.code == 2 and "trainer.eval_every=null" in capsys.readouterr().err


# ------------------------------------------------------------------------- studies that prune

# TPE's first trials are random: with seed 10 it draws 3e-3, 3e-3, 1e-7, 1e-6, 1e-6, 1e-7, 3e-3, 1e-6
# from this space. The median pruner judges once two trials completed: the two bad rates (a loss that
# barely moves) are worse than the good rate's median at the first evaluation, step 5 of 20.
GOOD, BAD = 3e-3, (1e-7, 1e-6)
SEARCH = [
    "-m",
    "hparams_search=digits",
    "hydra.sweeper.n_trials=8",
    "hydra.sweeper.sampler.seed=10",
    f"optim.learning_rate=choice({GOOD},{BAD[0]},{BAD[1]})",
    "optim.weight_decay=0.0",
    "hydra/sweeper/pruner=median",
    "hydra.sweeper.pruner.n_startup_trials=2",
    *TINY,
    "trainer.log_every=5",
    "trainer.steps=20",
    "trainer.eval_every=5",
    "trainer.checkpoint_every=null",
    "trainer.checkpoint_dir=ck",
]


def study_of(sweep: Path) -> optuna.Study:
    storage = journal(str(sweep / "study.journal"))
    [summary] = optuna.get_all_study_summaries(storage)
    return optuna.load_study(study_name=summary.study_name, storage=storage)


def check_the_bad_rates_were_pruned(work: Path, n_trials: int = 8) -> None:
    """Every trial of a bad rate is pruned at step 5, its run stopped early there with its last
    checkpoint; the good ones complete; the study holds each trial's evaluations and dew-runs says
    the same."""
    from dew.cli.runs import run

    [sweep] = list((work / "ck").glob("digits-sweep-*"))
    trials = study_of(sweep).trials
    rates = [t.params["optim.learning_rate"] for t in trials]
    assert rates == [GOOD, GOOD, BAD[0], BAD[1], BAD[1], BAD[0], GOOD, BAD[1]][:n_trials]
    assert [t.state.name for t in trials] == ["PRUNED" if r in BAD else "COMPLETE" for r in rates]
    for t in trials:
        job = next(sweep.glob(f"{t.number}-*"))
        view = journals.read(work / "tracking" / sweep.name / job.name / "journal.jsonl")
        steps, losses = view.series("eval/loss")
        assert t.intermediate_values == dict(zip(steps, losses))  # the journal, replayed into the study
        if t.state.name == "PRUNED":
            assert steps == [5] and t.value == losses[0]
            assert view.early_stop()["reason"] == PRUNED
            assert sorted(p.name for p in job.iterdir() if p.name.isdigit()) == ["5"]  # its last checkpoint
        else:
            assert steps == [5, 10, 15, 20] and t.value == min(losses)
    lines = run([str(sweep), "--tracking", str(work / "tracking")]).splitlines()
    pruned = sum(r in BAD for r in rates)
    assert (
        lines[0] == f"study {sweep.name} (minimize): {n_trials} trials, {n_trials - pruned} complete, {pruned} pruned"
    )
    rows = {line.split()[0]: line for line in lines[4 : 4 + n_trials]}  # the study's table: a row per trial
    runs = {line.split("-")[0]: line for line in lines[6 + n_trials : 6 + 2 * n_trials]}  # the runs' table
    for t in trials:
        if t.state.name == "PRUNED":
            assert rows[str(t.number)].split()[1] == "pruned"
            assert rows[str(t.number)].endswith(f"(pruned by MedianPruner at step 5 of 20: eval/loss {t.value:.6g})")
            assert runs[str(t.number)].split()[1:4] == ["stopped", "early", "5/20"]
        else:
            assert rows[str(t.number)].split()[1] == "complete" and runs[str(t.number)].split()[1:3] == [
                "finished",
                "20/20",
            ]


@pytest.fixture(scope="module")
def xla_cache(tmp_path_factory) -> str:
    return f"trainer.compilation_cache_dir={SUITE_CACHE}"


@pytest.mark.slow
def test_a_median_pruner_prunes_the_bad_rates_before_their_end(workdir: Path, xla_cache):
    # Three trials (two good rates, which complete and so start the pruner's judging, then a bad
    # rate), not the space's eight: the five after them repeated what these show (a bad rate pruned
    # at step 5, a good one completed), ~2 CPU-s each; the fourth, the other bad rate, was pruned at
    # step 5 against the same two completed trials as the third.
    result = dew_train(
        *SEARCH, "hydra.sweeper.n_jobs=1", "hydra.sweeper.n_trials=3", xla_cache, cwd=workdir, timeout=600
    )
    assert result is not None and result.returncode == 0, result.stdout[-3000:]
    check_the_bad_rates_were_pruned(workdir, n_trials=3)


@pytest.mark.slow
def test_a_median_pruner_under_the_local_launcher_two_at_a_time(workdir: Path, xla_cache):
    """The first two trials (good rates) run together, each in a process of its own, and complete; the
    third (a bad rate) judges against their journals and is pruned at step 5. Three trials, not
    eight: each is a process that imports JAX and compiles anew."""
    local = ["hydra/launcher=local", "hydra.launcher.tasks_per_node=1", "hydra.sweeper.n_jobs=2"]
    result = dew_train(*SEARCH, *local, "hydra.sweeper.n_trials=3", xla_cache, cwd=workdir, timeout=600)
    assert result is not None and result.returncode == 0, result.stdout[-3000:]
    check_the_bad_rates_were_pruned(workdir, n_trials=3)
