"""What a run under a sweeper reports back: one number, or that it failed.

A sweeper that optimises (``hydra/sweeper=optuna``) needs the task function to return the run's
*selection value*: the best value of the metric that chooses the best checkpoint (``eval/loss``, or
the objective's metric marked ``best``, higher or lower is better as that metric says), or the last
``train/loss`` of a run that never evaluates. It is read back from the run's journal, so a resumed
run reports its whole history. A run that stops on its own terms (it diverged, or its config was
refused) raises ``TrialFailed`` there instead of ending the process: the sweeper records a failed
trial and goes on.

With a pruner (``hydra/sweeper/pruner``), the value comes with what the sweeper needs to record the
trial as Optuna would have: its journal (its intermediate values) and the step its pruner stopped
it at (``TrialOutcome``; dew.launching.search.pruning).

Hydra's basic sweeper (a grid) is left as it was: a stopped job ends the sweep with its exit status.
"""

from __future__ import annotations

import dataclasses
import math
import os

from etils import epath
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from dew.contract import journal as journals

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


class TrialFailed(RuntimeError):
    """A sweep trial that stopped on its own terms; the message says why (as dew-runs does)."""


@dataclasses.dataclass(frozen=True)
class TrialOutcome:
    """What a search's trial returns to the sweeper: its selection value (``float()`` of it), and
    where the sweeper reads what it reported to its pruner."""

    value: float
    journal: str
    """The run's journal: its evaluations are the trial's intermediate values
    (``dew.launching.search.pruning.replay``)."""
    metric: str
    """The metric of the value and of the intermediate values."""
    pruned: bool
    """Its pruner stopped it (the journal's ``early_stop`` event, reason ``pruned``)."""

    def __float__(self) -> float:
        return self.value


def in_a_search() -> bool:
    """Whether this process runs a job of a sweeper other than Hydra's grid (which reads no value)."""
    if not HydraConfig.initialized():
        return False
    hc = HydraConfig.get()
    return hc.mode == RunMode.MULTIRUN and hc.sweeper.get("_target_") != BASIC_SWEEPER


def selection_value(journal: str | os.PathLike, metric: str, higher_is_better: bool) -> float:
    """The run's selection value from its journal: the best finite ``metric``, else the last finite
    ``train/loss``. Raises TrialFailed when the journal holds neither."""
    view = journals.read(epath.Path(journal))
    _, values = view.series(metric)
    scored = [v for v in values if math.isfinite(v)]
    if scored:
        return max(scored) if higher_is_better else min(scored)
    _, losses = view.series("train/loss")
    if losses and math.isfinite(losses[-1]):
        return losses[-1]
    raise TrialFailed(f"{journal}: no finite {metric} nor train/loss to report")


def check_direction(metric: str, higher_is_better: bool) -> None:
    """Refuse a sweeper that would optimise the selection value the wrong way (minimising an
    accuracy): every trial would run and the study would pick the worst."""
    direction = HydraConfig.get().sweeper.get("direction")
    name = str(getattr(direction, "name", direction)).rsplit(".", 1)[-1]
    wanted = "maximize" if higher_is_better else "minimize"
    if name in ("minimize", "maximize") and name != wanted:
        raise TrialFailed(
            f"hydra.sweeper.direction={name}, but this run's selection value, the best {metric}, "
            f"is {'higher' if higher_is_better else 'lower'} for better runs: set "
            f"hydra.sweeper.direction={wanted}"
        )


def search_unavailable(overrides: list[str]) -> str | None:
    """A message when the command line asks for the Optuna sweeper (``hydra/sweeper=optuna``, a
    ``hparams_search`` preset) and the ``dew[search]`` extra is not installed; Hydra alone would only
    say that it cannot find the option."""
    if not any(o.startswith(("hparams_search=", "hydra/sweeper=optuna")) for o in overrides):
        return None
    try:
        import optuna  # noqa: F401
    except ImportError as err:
        return f"Optuna is not installed ({err}): pip install 'dew[search]' (docs/search.md)"
    return None
