"""The run ``dew-train`` composes: ``RunConfig`` plus the knobs of every registered objective.

"Recipes add their objective's knobs by subclassing RunConfig": ``Recipe`` is that subclass, made
from the objective registry (``dew.contract.objectives``), one field per objective named after it and
typed by its knobs class, so a plugin's objective gets its knobs on the command line, in run.json and
in ``Recipe.load`` like dew's own. Only the knobs of the objective a run trains are read. No JAX here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Self

from dew.contract.config import RunConfig
from dew.contract.models import with_data_fields as merge
from dew.contract.objectives import knob_fields


class _Recipe(RunConfig):
    """A whole run as ``dew-train`` composes it: ``RunConfig`` and, under each registered
    objective's name, that objective's knobs (``flow_matching.guidance_scale=3``)."""

    @classmethod
    def from_dict(cls, values: Mapping[str, object]) -> Self:
        """Read back what ``to_dict`` wrote. The knobs of an objective the record does not hold (one
        installed after the run was written) take their defaults; any other missing field raises."""
        knobs = {f.name for f in dataclasses.fields(cls)} - {f.name for f in dataclasses.fields(RunConfig)}
        if isinstance(values, Mapping):
            values = {**{name: {} for name in knobs if name not in values}, **values}
        return super().from_dict(values)


Recipe: Any = dataclasses.make_dataclass("Recipe", knob_fields(), bases=(_Recipe,), frozen=True, module=__name__)
Recipe.__doc__ = _Recipe.__doc__
Recipe.__qualname__ = "Recipe"


def with_data_fields(run: RunConfig, data_fields: dict[str, object]) -> RunConfig:
    """``run`` with the model fields that follow from the data filled in (``dew.contract.models``);
    an explicit value that disagrees with the data is an error, not a silent override."""
    config = merge(run.model.architecture, run.model.config, data_fields)
    return dataclasses.replace(run, model=dataclasses.replace(run.model, config=config))
