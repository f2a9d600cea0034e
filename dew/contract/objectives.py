"""The objective registry: ``ObjectiveSpec``, the class each registered objective subclasses.

An objective is one registered class (``@objectives.register("name")``) holding what dew needs to
know about it without JAX: its knobs (a frozen dataclass, which becomes the field of the same name
on ``Recipe``: ``flow_matching.guidance_scale=3`` on the command line), the architecture role and
the data kind it trains, the model fields it derives from the data, the unit of its loss, its
built-in metrics, and ``build``, which imports the JAX side (loss, evaluation, sampler) only then.
An objective pairs with an architecture through the architecture's ``role``, never its name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from dew.contract.registry import Registry

if TYPE_CHECKING:
    from dew.contract.config import RunConfig
    from dew.contract.data import Dataset
    from dew.objectives.base import Objective


class ObjectiveSpec:
    """Base of the registered objectives. The class methods take the run (whose field ``name``
    holds this objective's knobs) and the dataset."""

    name: ClassVar[str]
    """The name it is registered under (``objective=``, and its knobs' field on ``Recipe``)."""
    Knobs: ClassVar[type]
    """A frozen dataclass of the objective's knobs, with their types, defaults and docstrings."""
    role: ClassVar[str]
    """The architecture role it trains (``Architecture.role``)."""
    data_kind: ClassVar[str]
    """The data it reads, as the datasets declare it (``DataSpec.kind``: ``image`` or ``tokens``)."""
    natural: ClassVar[bool] = True
    """The objective dew picks for its role and data kind when ``objective`` is unset (at most one
    per pair)."""
    loss_unit: ClassVar[str] = "loss"
    """What ``train/loss`` and ``eval/loss`` measure, for plots (``dew-runs plot``)."""
    batch_fields: ClassVar[tuple[str, ...]] = ()
    """The optional batch fields (``OPTIONAL_BATCH_FIELDS``) it honours. A dataset whose batches carry
    one it does not is refused before the first step (``check_batch_fields``), never silently
    trained across documents, on padding or on prompts."""

    @classmethod
    def knobs(cls, run: RunConfig) -> Any:
        """The run's knobs of this objective (their defaults when the run holds none)."""
        return getattr(run, cls.name, None) or cls.Knobs()

    @classmethod
    def model_fields(cls, dataset: Dataset) -> dict[str, object]:
        """The model fields that follow from the data when this objective trains on it."""
        return dict(dataset.model_fields())

    @classmethod
    def conflict_hint(cls) -> str:
        """Said after a model field that conflicts with ``model_fields``; empty says nothing."""
        return ""

    @classmethod
    def build(cls, run: RunConfig, dataset: Dataset) -> Any:
        """The objective the trainer calls (``dew.objectives.base.Objective``); ``run`` is resolved
        (its model fields filled in from ``model_fields``)."""
        raise NotImplementedError(f"objective {cls.name!r} must implement build")

    @classmethod
    def metrics(cls) -> tuple[Any, ...]:
        """The metrics ``dew-train`` evaluates beside the loss (``dew.objectives.base.Metric``)."""
        return ()


objectives: Registry[type[ObjectiveSpec]] = Registry(
    "objective",
    builtins=("dew.objectives.flow_matching", "dew.objectives.masked_diffusion", "dew.objectives.next_token"),
)
"""Objective name -> its class."""


OPTIONAL_BATCH_FIELDS = ("segment_ids", "positions", "loss_mask")
"""Fields a token dataset's batches may carry beside ``tokens`` (docs/data.md): packed documents'
``segment_ids`` and ``positions`` (``data.documents=true``), a chat's ``loss_mask`` (``data=chat``)."""


def check_batch_fields(spec: type[ObjectiveSpec], fields: Iterable[str], data: str) -> None:
    """Raise naming the objective, the data and the fields when the batches carry an optional field
    (``OPTIONAL_BATCH_FIELDS``) the objective does not honour (``ObjectiveSpec.batch_fields``)."""
    ignored = [f for f in OPTIONAL_BATCH_FIELDS if f in fields and f not in spec.batch_fields]
    if ignored:
        raise ValueError(
            f"objective={spec.name!r} does not read the batch fields {', '.join(ignored)} that {data} gives "
            f"(packed documents: data.documents=true; prompts without loss: data=chat): it would attend across "
            f"documents and train on padding and prompts; it honours {list(spec.batch_fields) or 'none of them'}"
        )


def natural_objective(role: str, data_kind: str) -> str:
    """The objective dew trains an architecture of ``role`` with on data of ``data_kind``."""
    for name, spec in objectives.items():
        if spec.natural and spec.role == role and spec.data_kind == data_kind:
            return name
    raise ValueError(f"no objective trains a {role} architecture on {data_kind} data; objectives train {pairs()}")


def objective_of(knobs: object) -> str:
    """The name of the objective whose knobs ``knobs`` are (``Knobs`` is one class per objective): a
    built objective names itself in its summary without importing its registration back."""
    for name, spec in objectives.items():
        if type(knobs) is spec.Knobs:
            return name
    raise ValueError(f"{type(knobs).__qualname__} are the knobs of no registered objective")


def check_objective(name: str, role: str, data_kind: str, architecture: str) -> None:
    """Raise if objective ``name`` is unknown or cannot train this architecture on this data."""
    spec = objectives[name]
    if (spec.role, spec.data_kind) != (role, data_kind):
        raise ValueError(
            f"objective={name!r} cannot train model.architecture={architecture!r} "
            f"(a {role}) on {data_kind} data; it trains a {spec.role} on {spec.data_kind} data"
        )


def pairs() -> str:
    return ", ".join(f"{n}: a {s.role} on {s.data_kind} data" for n, s in objectives.items())


def knob_fields() -> list[tuple[str, type, Any]]:
    """``(name, knobs class, field)`` of every registered objective, for ``Recipe``."""
    return [(name, spec.Knobs, dataclasses.field(default_factory=spec.Knobs)) for name, spec in objectives.items()]


def check_sampling(name: str, ema_decay: float, steps: int, temperature: float, top_k: int, samples: int) -> None:
    """The checks the sampling knobs of a token objective share."""
    if not 0.0 <= ema_decay < 1.0:
        raise ValueError(f"{name}.ema_decay={ema_decay} must lie in [0, 1)")
    if steps <= 0:
        raise ValueError(f"{name}.sample_steps={steps} must be positive")
    if temperature <= 0:
        raise ValueError(f"{name}.temperature={temperature} must be > 0")
    if top_k < 0:
        raise ValueError(f"{name}.top_k={top_k} must be >= 0 (0 keeps every token)")
    if samples <= 0:
        raise ValueError(f"{name}.samples={samples} must be positive")


def summary_name(objective: Objective) -> str | None:
    """The registered name of a built objective (its summary's ``objective``)."""
    summary: Mapping[str, Any] = objective.summary()
    return summary.get("objective")


def can_sample(objective: Objective) -> bool:
    """Whether a built objective draws samples: an image grid (``sample_grid``) or text
    (``sample_text``). dew-train writes samples, suggests ``dew-sample`` and dew-sample runs only
    for one that does; a plugin's classifier, say, draws none."""
    return hasattr(objective, "sample_grid") or hasattr(objective, "sample_text")
