"""The tracker registry: ``TrackerSpec``, what the config layer knows of each tracker a run can report to.

A tracker is one registered class (``@trackers.register("name")``): its ``Options``, the frozen
dataclass of its settings, is what the run's config holds for it, and the class itself opens the
tracker and hands it what the journal gets (``dew.training.reporting.trackers.Sink``, the base every
tracker subclasses). dew's own (W&B, TensorBoard, MLflow, CSV) are in
``dew.training.reporting.trackers``; a plugin package registers its own through the ``dew.plugins``
entry-point group (docs/extending.md), and the run turns it on with
``trainer.trackers.plugins.<name>``. This module imports nothing from dew but the contract package,
and no JAX.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from dew.contract.registry import Registry


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The options of a tracker that takes none (``{}``)."""


class TrackerSpec:
    """What the config layer reads of a tracker: its registered ``name`` and its ``Options``."""

    name: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    """A frozen dataclass of the tracker's settings, each documented where it is declared: the
    record ``trainer.trackers.plugins.<name>`` holds (dew's own trackers: their fields of
    ``trainer.trackers``, and ``trainer.wandb``)."""


trackers: Registry[type[TrackerSpec]] = Registry("tracker", builtins=("dew.training.reporting.trackers.own",))
"""Tracker name -> its class. dew's own register when ``own`` imports every module of their package."""
