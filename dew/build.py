"""From a typed run to the things it trains: the dataset, the resolved model fields, the objective.

``dew-train`` and ``dew-sample`` both build through here, so inference rebuilds exactly what training
built. Which objective trains which model on which data is the registered parts' business: the
architecture's ``role``, the dataset's ``kind`` and the objective's (``dew.contract.objectives``).
The objective's JAX side is imported only when it is built.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dew.contract.config import RunConfig
from dew.contract.data import Dataset
from dew.contract.models import architecture
from dew.contract.objectives import (
    ObjectiveSpec,
    check_batch_fields,
    check_objective,
    natural_objective,
    objectives,
    pairs,
)
from dew.contract.typed import ConfigError
from dew.recipe import with_data_fields
from dew.training.checkpointing.hf_config import with_checkpoint_fields


def data_kind(run: RunConfig, dataset: Dataset) -> str:
    """What ``dataset``'s batches hold (``DataSpec.kind``: ``image``, ``tokens``, or a plugin's own
    kind): the loaded dataset's ``kind`` where it states one, else that of the spec it was loaded
    from (``run.data``)."""
    return getattr(dataset, "kind", None) or type(run.data).kind


def objective_spec(run: RunConfig, kind: str) -> type[ObjectiveSpec]:
    """The objective ``run`` names, or the natural one for its architecture and data of ``kind``;
    an incompatible pair raises naming both."""
    role = architecture(run.model.architecture).role
    try:
        name = run.objective or natural_objective(role, kind)
    except ValueError:
        raise ValueError(
            f"no objective trains model.architecture={run.model.architecture!r} (a {role}) on "
            f"data={getattr(run.data, 'name', '?')!r} ({kind} data); objectives train "
            f"{pairs()}"
        ) from None
    check_objective(name, role, kind, run.model.architecture)
    return objectives[name]


def build_objective(run: RunConfig, dataset: Dataset) -> Any:
    """The objective ``run`` names (or the natural one) for ``dataset``; ``run`` is resolved (its
    model fields filled in by ``resolve``). Batch fields it would ignore (packed documents' segments,
    a chat's loss mask) are refused naming both (``check_batch_fields``)."""
    spec = objective_spec(run, data_kind(run, dataset))
    name = getattr(run.data, "name", "?")
    data = f"data={name} with data.documents=true" if getattr(run.data, "documents", False) else f"data={name}"
    check_batch_fields(spec, dataset.batch_spec(), data)
    return spec.build(run, dataset)


def resolve[R: RunConfig](run: R, dataset: Dataset) -> R:
    """``run`` with the model fields that follow from ``dataset`` (and the objective) filled in, and
    the data spec's own where the dataset states them (``data_fields``: an image dataset's class
    names), so run.json records what the data gave."""
    if hasattr(dataset, "data_fields"):
        run = dataclasses.replace(run, data=dataclasses.replace(run.data, **dataset.data_fields()))
    spec = objective_spec(run, data_kind(run, dataset))
    try:
        return with_data_fields(run, spec.model_fields(dataset))
    except ConfigError as err:
        hint = spec.conflict_hint()
        raise ConfigError(f"{err} ({hint})" if hint else str(err)) from None


def build_run[R: RunConfig](run: R) -> tuple[R, Any, Dataset]:
    """Fill in the model fields a Hugging Face ``trainer.init_from`` gives (``with_checkpoint_fields``),
    load the dataset at the trainer's batch, fill in the model fields that follow from it, and
    build the objective. Returns the resolved run (what run.json records): with muP on, its
    optimizer groups are muP's (``dew.training.optim.mup``)."""
    given = run.model.config
    run = with_checkpoint_fields(run)  # trainer.init_from's config.json, before the data's fields
    dataset = run.data.load(batch_size=run.trainer.batch_size, seed=run.trainer.seed)
    try:
        run = resolve(run, dataset)
    except ConfigError as err:  # say where a field the run did not set came from
        filled = [k for k in run.model.config.keys() - given.keys() if f"model.config.{k}=" in str(err)]
        if not filled:
            raise
        raise ConfigError(
            f"{err} ({filled[0]} is config.json's of trainer.init_from={run.trainer.init_from!r})"
        ) from None
    objective = build_objective(run, dataset)
    from dew.training.optim.mup import (
        with_mup_groups,
    )  # heavy: optax stays out of the launcher's checks until a run is built

    return with_mup_groups(run, objective), objective, dataset
