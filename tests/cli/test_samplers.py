"""Each sampler of hydra/sweeper/sampler (dew.launching.search.sweeper_conf.SAMPLERS; docs/search.md) runs a short
study through the real command: every option builds Optuna's own class with Optuna's defaults, and
each study's trials are the ones Optuna's sampler of that class, seeded as the command seeds it,
draws from the same space given the same values (replayed here in a study held in memory), with what
only that sampler leaves behind (Sobol points, CMA-ES generations, a grid covered once, NSGA-II's
child of its random first generation, TPE's draw without one). ``gp`` needs PyTorch, which
dew[search] does not bring: without it the command refuses it before any trial."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution

from dew.launching.search.sweeper_conf import SAMPLERS
from tests.cli.test_search import jobs, study_of
from tests.conftest import dew
from tests.training.conftest import TINY, dew_train

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # QMCSampler

CLASSES = {
    "tpe": optuna.samplers.TPESampler,
    "random": optuna.samplers.RandomSampler,
    "cmaes": optuna.samplers.CmaEsSampler,
    "gp": optuna.samplers.GPSampler,
    "qmc": optuna.samplers.QMCSampler,
    "grid": optuna.samplers.GridSampler,
    "nsgaii": optuna.samplers.NSGAIISampler,
}
"""Each option of hydra/sweeper/sampler and the Optuna class it builds."""

DEWS_OWN_DEFAULTS: dict[tuple[str, str], Any] = {}
"""(option, field) whose default dew sets otherwise than Optuna (sweeper_conf: "Each field's default is
Optuna's (5.x), but where dew says otherwise"): none today."""


# ------------------------------------------------------------------------------- fast: no training


def test_every_sampler_option_builds_optunas_class_with_optunas_defaults():
    """Composed as dew-train composes ``hydra/sweeper=optuna hydra/sweeper/sampler=<name>`` (the hydra
    config included) and built as Hydra builds it: Optuna's class, each field Optuna's default."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate

    from dew.commandline.configs import conf_dir, register_configs

    assert set(SAMPLERS) == set(CLASSES)
    GlobalHydra.instance().clear()
    register_configs()
    built, fields = {}, {}
    with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
        for name in SAMPLERS:
            overrides = ["hydra/sweeper=optuna", f"hydra/sweeper/sampler={name}"]
            cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
            fields[name] = {k: v for k, v in cfg.hydra.sweeper.sampler.items() if not k.startswith("_")}
            built[name] = instantiate(cfg.hydra.sweeper.sampler)
    grid = built.pop("grid")  # a partial until the sweeper knows the space (the grid is the space)
    assert grid.func is optuna.samplers.GridSampler and grid.keywords == {"seed": None}
    built["grid"] = grid({"optim.weight_decay": [0.0, 0.05]})
    for name, sampler in built.items():
        assert type(sampler) is CLASSES[name], name
        signature = inspect.signature(CLASSES[name]).parameters
        assert fields[name] == {f.name: f.default for f in dataclasses.fields(SAMPLERS[name]) if f.name[0] != "_"}
        for field, value in fields[name].items():
            assert field in signature, f"{name}: {field} is no argument of {CLASSES[name].__name__}"
            optunas = DEWS_OWN_DEFAULTS.get((name, field), signature[field].default)
            assert value == optunas, f"hydra.sweeper.sampler.{field}={value} for {name}, Optuna's default {optunas}"


# ------------------------------------------------------------------------- a short study for each

SPACE = {
    "optim.learning_rate": FloatDistribution(1e-4, 1e-2, log=True),
    "optim.weight_decay": FloatDistribution(0.01, 0.1),
}
"""What every sampler can take. Both are inputs of the compiled train step, so every trial of every
study here runs one compiled program (loaded from the suite's compilation cache, TINY's): but a zero
weight decay, which is a constant of another program (dew.training.optim.build), hence no 0.0 here."""
SEARCHED = ["optim.learning_rate=tag(log, interval(1e-4, 1e-2))", "optim.weight_decay=interval(0.01, 0.1)"]

# A 2-step trial, evaluated at its end (its value), no checkpoint but the final one.
TRIAL = [*TINY, "trainer.steps=2", "trainer.eval_every=2", "trainer.checkpoint_every=null", "trainer.checkpoint_dir=ck"]


def run_study(workdir: Path, name: str, n_trials: int, *overrides: str) -> tuple[str, optuna.Study]:
    """``dew-train -m hydra/sweeper=optuna hydra/sweeper/sampler=<name>`` seeded 0, ``n_trials`` asked
    for under the basic launcher (one after another, each asked when the one before is told): its
    output and its study."""
    result = dew_train(
        "-m",
        "hydra/sweeper=optuna",
        f"hydra/sweeper/sampler={name}",
        "hydra.sweeper.sampler.seed=0",
        f"hydra.sweeper.n_trials={n_trials}",
        "hydra.sweeper.n_jobs=1",
        *overrides,
        *TRIAL,
        cwd=workdir,
        timeout=600,
    )
    assert result is not None and result.returncode == 0, result.stdout[-3000:]
    assert "sampled independently" not in result.stdout  # no sampler fell back to random draws
    [sweep] = list((workdir / "ck").glob("digits-sweep-*"))
    study = study_of(sweep)
    assert sorted(jobs(sweep)) == [t.number for t in study.trials]  # a job directory per trial
    return result.stdout, study


def replay(study: optuna.Study, sampler: optuna.samplers.BaseSampler) -> list[dict[str, Any]]:
    """The parameters ``sampler`` draws for ``study``'s trials when each is asked for in turn from the
    space the study searched and told the value the study recorded, in a study held in memory."""
    space = study.trials[0].distributions
    again = optuna.create_study(sampler=sampler, direction=study.direction)
    drawn = []
    for trial in study.trials:
        asked = again.ask(space)
        drawn.append(asked.params)
        try:
            again.tell(asked, trial.value)
        except RuntimeError as err:  # the grid sampler stops the study once it is covered
            assert "Study.stop" in str(err)
    return drawn


def sobol_points(trials: list[optuna.trial.FrozenTrial]) -> None:
    # The first trial tells QMC the space (drawn by its independent sampler); the next are the
    # unscrambled 2-d Sobol sequence's first points, (0, 0) and (0.5, 0.5), the rate's at its log scale.
    assert [tuple(t.params.values()) for t in trials[1:]] == [
        pytest.approx((1e-4, 0.01)),
        pytest.approx((1e-3, 0.055)),
    ]


def cma_generations(trials: list[optuna.trial.FrozenTrial]) -> None:
    # One random start (n_startup_trials=1), then a trial drawn by CMA-ES, which records its generation.
    assert ["cma:generation" in t.system_attrs for t in trials] == [False, True]


def nsga_generations(trials: list[optuna.trial.FrozenTrial]) -> None:
    # Generations of 2: the third trial is a child of the first two.
    assert [t.system_attrs["NSGAIISampler:generation"] for t in trials] == [0, 0, 1]
    # The first generation is drawn by Optuna's RandomSampler seeded as NSGA-II is (0): the seeded
    # random sequence going on from trial to trial through the command, which the random sampler's
    # own study, one trial, does not show (it ran 2 for it).
    drawn = [t.params for t in trials]
    again = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    assert [again.ask(trials[0].distributions).params for _ in range(2)] == drawn[:2]


@dataclasses.dataclass
class Case:
    n_trials: int
    sampler: Callable[[], optuna.samplers.BaseSampler]
    """Optuna's own sampler, as the command sets it."""
    overrides: tuple[str, ...] = ()
    own: Callable[[list[optuna.trial.FrozenTrial]], None] | None = None
    """What only this sampler leaves in the study."""


# Each study is as short as what it shows: a trial is ~2.4 CPU-s of the suite's, and each is the
# sampler's own draw but the random starts that CMA-ES, QMC and NSGA-II need before their own. TPE
# draws its first trial itself (no random start: n_startup_trials=0), unlike the random draw; that a
# sampler's draw reads the trials told before it from the study's storage is what CMA-ES's second
# trial, QMC's third and NSGA-II's child show (TPE's second trial, after one random start, showed it
# again). The random sampler's second trial, its seeded sequence going on, is NSGA-II's first
# generation (nsga_generations). 3, 3 and 4 trials before 257e0cb, 2, 2 and 2 before this.
STUDIES = {
    "tpe": Case(
        1,
        lambda: optuna.samplers.TPESampler(seed=0, n_startup_trials=0),
        ("hydra.sweeper.sampler.n_startup_trials=0",),  # the first trial is TPE's
    ),
    "random": Case(1, lambda: optuna.samplers.RandomSampler(seed=0)),
    "cmaes": Case(2, lambda: optuna.samplers.CmaEsSampler(seed=0), own=cma_generations),
    "qmc": Case(3, lambda: optuna.samplers.QMCSampler(seed=0), own=sobol_points),
    "nsgaii": Case(
        3,
        lambda: optuna.samplers.NSGAIISampler(seed=0, population_size=2),
        ("hydra.sweeper.sampler.population_size=2",),
        own=nsga_generations,
    ),
}
"""A study for each sampler but ``grid`` (its own test) and ``gp`` (PyTorch: below)."""


def test_every_sampler_but_grid_and_gp_has_a_study():
    assert set(STUDIES) == set(SAMPLERS) - {"grid", "gp"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STUDIES))
def test_a_short_study_with_each_sampler_draws_what_optunas_sampler_draws(name: str, workdir: Path):
    case = STUDIES[name]
    _, study = run_study(workdir, name, case.n_trials, *case.overrides, *SEARCHED)
    trials = study.trials
    assert [(t.number, t.state.name) for t in trials] == [(n, "COMPLETE") for n in range(case.n_trials)]
    for t in trials:
        assert t.distributions == SPACE
        for key, value in t.params.items():
            assert type(value) is float and SPACE[key].low <= value <= SPACE[key].high, (key, value)
    drawn = [t.params for t in trials]
    assert replay(study, case.sampler()) == drawn  # that class, seeded 0, with the command's settings
    if name != "random":  # and no random draws: after its start, the sampler drew them itself
        assert replay(study, optuna.samplers.RandomSampler(seed=0)) != drawn
    if case.own is not None:
        case.own(trials)


@pytest.mark.slow
def test_a_grid_study_runs_each_combination_once_and_stops_at_the_grids_size(workdir: Path):
    grid = ["optim.learning_rate=choice(1e-3,3e-3)", "optim.weight_decay=choice(0.01,0.05)"]
    out, study = run_study(workdir, "grid", 6, *grid)
    assert f"{study.study_name} in ck/{study.study_name}: 0 trials so far, 4 asked for" in out  # 6, capped
    trials = study.trials
    assert [(t.number, t.state.name) for t in trials] == [(n, "COMPLETE") for n in range(4)]
    assert trials[0].distributions == {
        "optim.learning_rate": CategoricalDistribution((1e-3, 3e-3)),
        "optim.weight_decay": CategoricalDistribution((0.01, 0.05)),
    }
    pairs = [(t.params["optim.learning_rate"], t.params["optim.weight_decay"]) for t in trials]
    assert sorted(pairs) == [(1e-3, 0.01), (1e-3, 0.05), (3e-3, 0.01), (3e-3, 0.05)]  # each once
    assert all(type(v) is float for pair in pairs for v in pair)
    space = {k: list(d.choices) for k, d in trials[0].distributions.items()}
    assert replay(study, optuna.samplers.GridSampler(space, seed=0)) == [t.params for t in trials]


# --------------------------------------------------------------------------------------------- gp

# Optuna's GPSampler computes with PyTorch, which dew[search] does not install (torch from PyPI brings
# GBs of CUDA libraries). Where torch is installed, this test skips: gp is then checked by
# test_every_sampler_option_builds_optunas_class_with_optunas_defaults (the option builds Optuna's
# GPSampler with its defaults) and by the sweeper, which then takes it as it takes the others.


@pytest.mark.slow  # a dew-train that composes and stops
@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed: gp can sample")
def test_gp_without_torch_is_refused_before_any_trial(workdir: Path):
    result = dew(
        "-m",
        "hydra/sweeper=optuna",
        "hydra/sweeper/sampler=gp",
        "hydra.sweeper.sampler.seed=0",
        *SEARCHED,
        *TRIAL,
        cwd=workdir,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "dew-train: error: hydra/sweeper/sampler: Optuna's GPSampler needs the torch package, which is not "
        "installed: pip install 'torch'"
    ]
    assert list(workdir.iterdir()) == []
