"""The fields of ``mixture`` (``dew.data.specs.Mixture``, which loads them): its components, each a
registered token dataset with a weight, and the stages that change the weights at given steps. In
a module of its own beside ``dew.data.fields``, as a component holds any of those specs; plain
dataclasses, no JAX."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import ClassVar

from dew.contract.data import DataSpec


@dataclasses.dataclass(frozen=True)
class MixtureComponent:
    """One source of a ``mixture``: a token dataset with its own fields, and its share of the
    sequences."""

    weight: float = 1.0
    """Its share of the training sequences, relative to the other components' (normalised over them:
    0.5/0.3/0.2 and 5/3/2 mix alike). 0 trains nothing from it (until a stage gives it a weight) and
    still evaluates its held-out split."""
    data: DataSpec = dataclasses.field(default_factory=lambda: _token_windows())
    """The source: any registered token dataset (``token_windows``, ``text_stream``, ``hf_text``, ...)
    with its own fields; its ``name`` chooses which."""


def _token_windows() -> DataSpec:
    from dew.contract.data import datasets  # the registry's member, registered in dew.data.specs

    return datasets["token_windows"]()


@dataclasses.dataclass(frozen=True)
class MixtureStage:
    """New weights from a step on: the components it names take these, the others keep theirs."""

    step: int = 0
    """The first step (completed optimizer updates before it) whose batch is drawn at these weights."""
    weights: dict[str, float] = dataclasses.field(default_factory=dict)
    """Component name -> its new weight."""


SOURCE_NAME = re.compile(r"[A-Za-z0-9_-]+")
"""A component's name: it is a key of the journal's values (``eval/<name>/loss``)."""


@dataclasses.dataclass(frozen=True)
class MixtureFields(DataSpec):
    """The fields of ``mixture`` (``dew.data.specs.Mixture``, which loads them): what its loader
    reads."""

    kind: ClassVar[str] = "tokens"
    components: dict[str, MixtureComponent] = dataclasses.field(default_factory=dict)
    """Name -> source and weight. Every component reads windows of one ``seq_len`` with one
    vocabulary; each with a held-out split is evaluated on its own (``eval/<name>/loss``)."""
    stages: tuple[MixtureStage, ...] = ()
    """New weights from given steps on, in increasing step order; none trains at ``weight`` throughout."""

    def __post_init__(self) -> None:
        for name, component in self.components.items():
            where = f"data.components.{name}"
            if not SOURCE_NAME.fullmatch(name):
                raise ValueError(f"{where}: a component's name takes letters, digits, _ and - only")
            if not math.isfinite(component.weight) or component.weight < 0:
                raise ValueError(f"{where}.weight={component.weight} must be a finite number >= 0")
            if component.data.kind != "tokens" or isinstance(component.data, MixtureFields):
                raise ValueError(
                    f"{where}.data.name={component.data.name!r}: a component is a token dataset "
                    "(token_windows, text_stream, hf_text, ...), not a mixture or images"
                )
        last = -1
        for i, stage in enumerate(self.stages):
            where = f"data.stages[{i}]"
            if stage.step <= last:
                raise ValueError(f"{where}.step={stage.step} must be >= 0 and after the stage before it (step {last})")
            last = stage.step
            for name, weight in stage.weights.items():
                if name not in self.components:
                    raise ValueError(
                        f"{where}.weights names {name!r}, which is not a component: {', '.join(self.components)}"
                    )
                if not math.isfinite(weight) or weight < 0:
                    raise ValueError(f"{where}.weights.{name}={weight} must be a finite number >= 0")
        if self.components:
            for step in (0, *(s.step for s in self.stages)):
                if not any(self.weights_at(step).values()):
                    raise ValueError(f"data.components: every weight is 0 from step {step} on; give one a weight > 0")

    def weights_at(self, step: int) -> dict[str, float]:
        """Each component's weight for the batch of ``step`` (steps completed before it)."""
        weights = {name: c.weight for name, c in self.components.items()}
        for stage in self.stages:
            if stage.step <= step:
                weights.update(stage.weights)
        return weights
