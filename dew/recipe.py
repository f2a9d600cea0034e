"""The run ``dew-train`` composes: ``RunConfig`` plus the knobs of every objective.

"Recipes add their objective's knobs by subclassing RunConfig": ``Recipe`` is that subclass, so
every knob is typed, documented, overridable from the command line, written to run.json and read
back by ``Recipe.load``. Only the knobs of the objective a run trains are read. No JAX here.
"""

from __future__ import annotations

import dataclasses

from dew.config import RunConfig
from dew.objectives.knobs import FlowMatchingKnobs, MaskedDiffusionKnobs, NextTokenKnobs


@dataclasses.dataclass(frozen=True)
class Recipe(RunConfig):
    """A whole run as ``dew-train`` composes it."""

    flow_matching: FlowMatchingKnobs = dataclasses.field(default_factory=FlowMatchingKnobs)
    """Knobs of the ``flow_matching`` objective."""
    masked_diffusion: MaskedDiffusionKnobs = dataclasses.field(default_factory=MaskedDiffusionKnobs)
    """Knobs of the ``masked_diffusion`` objective (``masked_diffusion.eps=1e-3``)."""
    next_token: NextTokenKnobs = dataclasses.field(default_factory=NextTokenKnobs)
    """Knobs of the ``next_token`` objective (``next_token.top_k=40``)."""


def with_data_fields(run: RunConfig, data_fields: dict[str, object]) -> RunConfig:
    """``run`` with the model fields that follow from the data filled in (``dew.models.registry``);
    an explicit value that disagrees with the data is an error, not a silent override."""
    from dew.models.registry import with_data_fields as merge

    config = merge(run.model.architecture, run.model.config, data_fields)
    return dataclasses.replace(run, model=dataclasses.replace(run.model, config=config))
