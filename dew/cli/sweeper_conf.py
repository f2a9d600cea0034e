"""dew's Optuna sweeper's config (``hydra/sweeper=optuna``), stored in Hydra's ConfigStore by
``store_sweeper_config``: in the launching process by the plugin ``hydra_plugins.dew_sweepers``, and
in a submitit job's process (``dew.launching.launchers.job_process_setup``), which composes its job's
config again.

Its pruners (``hydra/sweeper/pruner=<name>``) are Optuna's own classes, built from these fields by Hydra
(``_partial_``: the sweeper and each trial call it, so a bad value ends in one line, not Hydra's
traceback). A trial reports each evaluation's value of the metric it returns at the training step
of the evaluation, so every ``step`` below is a training step (docs/search.md, "Pruning").

No Optuna here: Hydra's plugin scan stores these at every ``dew-train`` start (over a second).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hydra.core.config_store import ConfigStore

SWEEPER_TARGET = "hydra_plugins.dew_sweepers.OptunaSweeper"
"""dew's sweeper class (``hydra_plugins.dew_sweepers``: Hydra instantiates sweepers from there)."""


def store_sweeper_config(target: str = SWEEPER_TARGET) -> None:
    """Store dew's sweeper config as ``hydra/sweeper/optuna``: hydra-optuna-sweeper's fields and
    defaults, dew's class, failures that do not end the study, and a ``pruner`` (none by default;
    the options of ``hydra/sweeper/pruner``). Nothing without the ``dew[search]`` extra:
    ``hydra/sweeper=optuna`` is then not an option, as Hydra says itself."""
    try:
        from hydra_plugins.hydra_optuna_sweeper.config import OptunaSweeperConf
    except ImportError:
        return
    fields = [
        ("_target_", str, dataclasses.field(default=target)),
        (
            "defaults",
            list[Any],
            dataclasses.field(default_factory=lambda: ["_self_", {"sampler": "tpe"}, {"pruner": None}]),
        ),
        ("max_failure_rate", float, dataclasses.field(default=1.0)),
        ("pruner", Any, dataclasses.field(default=None)),
    ]
    node = dataclasses.make_dataclass("DewOptunaSweeperConf", fields, bases=(OptunaSweeperConf,))
    store = ConfigStore.instance()
    store.store(group="hydra/sweeper", name="optuna", node=node, provider="dew")
    for name, pruner in PRUNERS.items():
        store.store(group="hydra/sweeper/pruner", name=name, node=pruner, provider="dew")


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
    """Optuna's ``HyperbandPruner`` (several successive-halving brackets), with its bracket chosen
    by a hash stable across processes (``dew.compat.optuna_hyperband_pruner``: Optuna 2.10 hashes
    with Python's per-process ``hash``, and dew's trials judge in processes of their own)."""

    _target_: str = "dew.compat.optuna_hyperband_pruner"
    _partial_: bool = True
    min_resource: int = 1
    """Steps of the first rung of the most aggressive bracket; set it to ``trainer.eval_every``."""
    max_resource: Any = "auto"
    """A trial's steps (``trainer.steps``), or ``auto``: the first completed trial's."""
    reduction_factor: int = 3
    bootstrap_count: int = 0


PRUNERS: dict[str, type] = {
    "median": MedianPrunerConf,
    "percentile": PercentilePrunerConf,
    "successive_halving": SuccessiveHalvingPrunerConf,
    "hyperband": HyperbandPrunerConf,
}
"""``hydra/sweeper/pruner``'s options (docs/search.md)."""
