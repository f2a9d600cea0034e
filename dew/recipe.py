"""The run ``dew-train`` composes: ``RunConfig`` plus the knobs of every registered objective.

"Recipes add their objective's knobs by subclassing RunConfig": ``Recipe`` is that subclass, made
from the objective registry (``dew.contract.objectives``), one field per objective named after it and
typed by its knobs class, so a plugin's objective gets its knobs on the command line, in run.json and
in ``Recipe.load`` like dew's own. Only the knobs of the objective a run trains are read. No JAX here.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Self

from dew.contract.config import RunConfig
from dew.contract.models import with_data_fields as merge
from dew.contract.objectives import knob_fields
from dew.contract.typed import ConfigError


def with_knobs[C: RunConfig](cls: type[C]) -> type[C]:
    """``cls`` as a frozen dataclass with one more field per registered objective, named after it,
    typed by its knobs class and defaulting to its defaults (``dew.contract.objectives.knob_fields``).
    The fields are the registry's, known when this module is imported, so no type checker sees them:
    a knob is read by the objective's name (``ObjectiveSpec.knobs``), never as a typed attribute."""
    annotations = dict(inspect.get_annotations(cls))  # its own, not RunConfig's
    for name, knobs, field in knob_fields():
        annotations[name] = knobs
        setattr(cls, name, field)
    cls.__annotations__ = annotations
    return dataclasses.dataclass(frozen=True)(cls)


@with_knobs
class Recipe(RunConfig):
    """A whole run as ``dew-train`` composes it: ``RunConfig`` and, under each registered
    objective's name, that objective's knobs (``flow_matching.guidance_scale=3``)."""

    @classmethod
    def from_dict(cls, values: object) -> Self:
        """Read back what ``to_dict`` wrote (or what ``OmegaConf.to_container`` made of the composed
        config: anything but a mapping is refused). The knobs of an objective the record does not
        hold (one installed after the run was written) take their defaults; any other missing field
        raises."""
        if not isinstance(values, Mapping):
            raise ConfigError(f"a run's record is a mapping of its fields, not {type(values).__name__}")
        knobs = {f.name for f in dataclasses.fields(cls)} - {f.name for f in dataclasses.fields(RunConfig)}
        return super().from_dict({**{name: {} for name in knobs if name not in values}, **values})


def with_data_fields[R: RunConfig](run: R, data_fields: dict[str, object]) -> R:
    """``run`` with the model fields that follow from the data filled in (``dew.contract.models``);
    an explicit value that disagrees with the data is an error, not a silent override."""
    config = merge(run.model.architecture, run.model.config, data_fields)
    return dataclasses.replace(run, model=dataclasses.replace(run.model, config=config))
