"""dew's Optuna sweeper's config (``hydra/sweeper=optuna``), stored in Hydra's ConfigStore by
``store_sweeper_config``: in the launching process by the plugin ``hydra_plugins.dew_sweepers``, and
in a submitit job's process (``dew.launching.launchers.job_process_setup``), which composes its job's
config again.

The fields are the ones users of Hydra's Optuna sweeper (hydra-optuna-sweeper) know, so their configs
and ``hparams_search`` presets keep working: ``params`` in Hydra's override grammar, ``direction``,
``n_trials``, ``n_jobs``, ``storage``, ``study_name``, ``max_failure_rate``, ``sampler``; dew adds a
``pruner``. The samplers (``hydra/sweeper/sampler=<name>``) and the pruners (``hydra/sweeper/pruner=
<name>``) are Optuna's own classes, built from these fields by Hydra (a pruner ``_partial_``: the
sweeper and each trial call it, so a bad value ends in one line, not Hydra's traceback). Each field's
default is Optuna's (5.x), but where dew says otherwise. A trial reports each evaluation's value of
the metric it returns at the training step of the evaluation, so every ``step`` below is a training
step (docs/search.md, "Pruning").

No Optuna here: Hydra's plugin scan stores these at every ``dew-train`` start.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

SWEEPER_TARGET = "hydra_plugins.dew_sweepers.OptunaSweeper"
"""dew's sweeper class (``hydra_plugins.dew_sweepers``: Hydra instantiates sweepers from there)."""


@dataclasses.dataclass
class OptunaSweeperConf:
    """``hydra/sweeper=optuna``: a search of ``n_trials`` trials, each one dew run, chosen by Optuna's
    ``sampler`` from the values of the ones before (docs/search.md)."""

    _target_: str = SWEEPER_TARGET
    defaults: list[Any] = dataclasses.field(default_factory=lambda: ["_self_", {"sampler": "tpe"}, {"pruner": None}])
    sampler: Any = MISSING
    """``hydra/sweeper/sampler``'s option: Optuna's sampler and its fields."""
    direction: Any = "minimize"
    """``minimize`` or ``maximize``: what the value a trial returns (its run's selection value) should do."""
    storage: str | None = None
    """Where the study lives: unset, ``<sweep dir>/study.journal`` (Optuna's journal file storage); a
    path, a journal file there; a database URL (``postgresql://...``), that database."""
    study_name: str | None = None
    """The study's name; unset, the sweep directory's name."""
    n_trials: int = 20
    """Trials in the whole study: a continued study runs only the ones it lacks."""
    n_jobs: int = 2
    """Trials run at once (under ``hydra/launcher=local`` or ``slurm``; the basic launcher runs one at a time)."""
    max_failure_rate: float = 1.0
    """The share of a batch's trials that may fail before the study stops (0-1): 1.0 goes on whatever
    fails, as a search that explores a learning rate must (a diverged rate is a failed trial)."""
    params: dict[str, str] | None = None
    """The search space: a key per searched field, in Hydra's sweep grammar (``interval(a, b)``,
    ``int(interval(a, b))``, ``tag(log, interval(a, b))``, ``range(a, b, step)``, ``choice(...)``)."""
    pruner: Any = None
    """``hydra/sweeper/pruner``'s option (none: every trial runs to its end)."""
    workers: int | None = None
    """With ``hydra/launcher=slurm``: submit this many worker jobs, each training the study's trials
    one after another until it has ``n_trials``, and return at once: no process watches the study
    (docs/search.md, "Workers"). Unset: this command runs the study, ``n_jobs`` trials at a time."""
    worker_grace_s: float = 300.0
    """Seconds a worker's trial may go without a heartbeat (its worker touches one every quarter of
    this) before another worker records it FAIL: its worker was killed or its node lost."""
    refill: bool = True
    """Under ``hydra/launcher=local`` and ``slurm``: start the next trial the moment one ends, keeping
    ``n_jobs`` running. False runs batches of ``n_jobs``, each waiting for its slowest trial, as Hydra's
    sweepers do (docs/performance.md measures the two side by side: bench/refill.py)."""


def store_sweeper_config(target: str = SWEEPER_TARGET) -> None:
    """Store dew's sweeper config as ``hydra/sweeper/optuna``, its samplers as the options of
    ``hydra/sweeper/sampler`` and its pruners as those of ``hydra/sweeper/pruner``."""
    store = ConfigStore.instance()
    node = OptunaSweeperConf if target == SWEEPER_TARGET else _with_target(target)
    store.store(group="hydra/sweeper", name="optuna", node=node, provider="dew")
    for name, sampler in SAMPLERS.items():
        store.store(group="hydra/sweeper/sampler", name=name, node=sampler, provider="dew")
    for name, pruner in PRUNERS.items():
        store.store(group="hydra/sweeper/pruner", name=name, node=pruner, provider="dew")


def _with_target(target: str) -> type:
    """``OptunaSweeperConf`` building another class (a test's sweeper)."""
    return dataclasses.make_dataclass(
        "OptunaSweeperConf", [("_target_", str, dataclasses.field(default=target))], bases=(OptunaSweeperConf,)
    )


# --------------------------------------------------------------------------------------- samplers


@dataclasses.dataclass
class TPESamplerConf:
    """``optuna.samplers.TPESampler``: random trials first, then trials drawn where the good ones were
    (tree-structured Parzen estimators). ``constant_liar`` counts the trials still running as bad ones,
    so trials drawn while others run go elsewhere."""

    _target_: str = "optuna.samplers.TPESampler"
    seed: int | None = None
    n_startup_trials: int = 10
    """Random trials before TPE models the others."""
    n_ei_candidates: int = 24
    multivariate: bool | None = None
    """Model the parameters jointly (unset: Optuna's default)."""
    group: bool = False
    """With ``multivariate``: model each group of parameters that occur together on its own."""
    constant_liar: bool = True
    consider_endpoints: bool | None = None
    prior_weight: float | None = None
    warn_independent_sampling: bool | None = None


@dataclasses.dataclass
class RandomSamplerConf:
    """``optuna.samplers.RandomSampler``: every trial drawn at random from the space."""

    _target_: str = "optuna.samplers.RandomSampler"
    seed: int | None = None


@dataclasses.dataclass
class CmaEsSamplerConf:
    """``optuna.samplers.CmaEsSampler`` (the ``cmaes`` library): the covariance matrix adaptation
    evolution strategy, for continuous and integer parameters (a ``choice`` is drawn at random)."""

    _target_: str = "optuna.samplers.CmaEsSampler"
    seed: int | None = None
    sigma0: float | None = None
    """The initial step size (unset: a sixth of the space's smallest width)."""
    n_startup_trials: int = 1
    restart_strategy: str | None = None
    """``ipop`` or ``bipop``: restart with a larger population when it converges (unset: no restart)."""
    popsize: int | None = None
    inc_popsize: int = -1
    use_separable_cma: bool = False
    with_margin: bool = False
    lr_adapt: bool = False
    consider_pruned_trials: bool = False
    warn_independent_sampling: bool = True


@dataclasses.dataclass
class GPSamplerConf:
    """``optuna.samplers.GPSampler``: Bayesian optimisation with a Gaussian process, for few, costly
    trials. Optuna computes it with PyTorch, which ``dew[search]`` does not bring: install ``torch``."""

    _target_: str = "optuna.samplers.GPSampler"
    seed: int | None = None
    n_startup_trials: int = 10
    deterministic_objective: bool = False
    warn_independent_sampling: bool = True


@dataclasses.dataclass
class QMCSamplerConf:
    """``optuna.samplers.QMCSampler``: a quasi-Monte Carlo sequence, which covers the space more evenly
    than random draws."""

    _target_: str = "optuna.samplers.QMCSampler"
    seed: int | None = None
    qmc_type: str = "sobol"
    """``sobol`` or ``halton``."""
    scramble: bool = False


@dataclasses.dataclass
class GridSamplerConf:
    """``optuna.samplers.GridSampler``: every combination of the space's values, once each, in a random
    order (``choice``, ``range`` and stepped spaces only). The grid is the space: the sweeper builds it."""

    _target_: str = "optuna.samplers.GridSampler"
    _partial_: bool = True
    seed: int | None = None


@dataclasses.dataclass
class NSGAIISamplerConf:
    """``optuna.samplers.NSGAIISampler``: a genetic algorithm (generations of ``population_size``)."""

    _target_: str = "optuna.samplers.NSGAIISampler"
    seed: int | None = None
    population_size: int = 50
    mutation_prob: float | None = None
    crossover_prob: float = 0.9
    swapping_prob: float = 0.5


SAMPLERS: dict[str, type] = {
    "tpe": TPESamplerConf,
    "random": RandomSamplerConf,
    "cmaes": CmaEsSamplerConf,
    "gp": GPSamplerConf,
    "qmc": QMCSamplerConf,
    "grid": GridSamplerConf,
    "nsgaii": NSGAIISamplerConf,
}
"""``hydra/sweeper/sampler``'s options (docs/search.md)."""


# ---------------------------------------------------------------------------------------- pruners


@dataclasses.dataclass
class MedianPrunerConf:
    """``optuna.pruners.MedianPruner``: stop a trial whose best value so far is worse than the median
    of the completed trials' values at the same step."""

    _target_: str = "optuna.pruners.MedianPruner"
    _partial_: bool = True
    n_startup_trials: int = 5
    """Completed trials before any trial is pruned."""
    n_warmup_steps: int = 0
    """Training steps of a trial before it may be pruned."""
    interval_steps: int = 1
    """Steps between the checks (after the warmup); a check runs at an evaluation only."""
    n_min_trials: int = 1
    """Completed trials that reported the same step, at least, for a check at that step."""


@dataclasses.dataclass
class PercentilePrunerConf(MedianPrunerConf):
    """``optuna.pruners.PercentilePruner``: as the median pruner, at another percentile."""

    _target_: str = "optuna.pruners.PercentilePruner"
    percentile: float = 25.0
    """Keep a trial that is within the best ``percentile`` percent of the completed ones at its step
    (0-100; Optuna has no default: 25 keeps the best quarter)."""


@dataclasses.dataclass
class SuccessiveHalvingPrunerConf:
    """``optuna.pruners.SuccessiveHalvingPruner`` (asynchronous successive halving): at each rung
    (``min_resource * reduction_factor ** (min_early_stopping_rate + rung)`` steps) keep the best
    ``1 / reduction_factor`` of the trials that reached it."""

    _target_: str = "optuna.pruners.SuccessiveHalvingPruner"
    _partial_: bool = True
    min_resource: Any = "auto"
    """Steps of the first rung, or ``auto`` (a hundredth of the first completed trial's steps); set
    it to ``trainer.eval_every``, the step of the first evaluation."""
    reduction_factor: int = 4
    min_early_stopping_rate: int = 0
    bootstrap_count: int = 0
    """Trials that must reach a rung before any is pruned there."""


@dataclasses.dataclass
class HyperbandPrunerConf:
    """``optuna.pruners.HyperbandPruner`` (several successive-halving brackets; a trial's bracket is a
    CRC32 of the study's name and its number, the same in every trial's process)."""

    _target_: str = "optuna.pruners.HyperbandPruner"
    _partial_: bool = True
    min_resource: int = 1
    """Steps of the first rung of the most aggressive bracket; set it to ``trainer.eval_every``."""
    max_resource: Any = "auto"
    """A trial's steps (``trainer.steps``), or ``auto``: the first completed trial's."""
    reduction_factor: int = 3
    bootstrap_count: int = 0


@dataclasses.dataclass
class ThresholdPrunerConf:
    """``optuna.pruners.ThresholdPruner``: stop a trial whose value leaves ``[lower, upper]`` or is
    NaN (a diverging run), judging each trial by its own values alone (no startup trials)."""

    _target_: str = "optuna.pruners.ThresholdPruner"
    _partial_: bool = True
    lower: float | None = None
    """Prune a trial whose value falls below this (a maximized metric); null: no lower bound."""
    upper: float | None = None
    """Prune a trial whose value rises above this (a minimized loss); null: no upper bound. Optuna
    refuses a threshold pruner with neither bound."""
    n_warmup_steps: int = 0
    """Training steps of a trial before it may be pruned."""
    interval_steps: int = 1
    """Steps between the checks (after the warmup); a check runs at an evaluation only."""


PRUNERS: dict[str, type] = {
    "median": MedianPrunerConf,
    "percentile": PercentilePrunerConf,
    "successive_halving": SuccessiveHalvingPrunerConf,
    "hyperband": HyperbandPrunerConf,
    "threshold": ThresholdPrunerConf,
}
"""``hydra/sweeper/pruner``'s options (docs/search.md)."""
