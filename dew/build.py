"""From a typed run to the things it trains: the dataset, the resolved model fields, the objective.

``dew-train`` and ``dew-sample`` both build through here, so inference rebuilds exactly what training
built. The objective is imported only when it is built.
"""

from __future__ import annotations

import importlib
from typing import Any

from dew.config import RunConfig
from dew.data.base import Dataset
from dew.objectives import check_objective, natural_objective, objectives
from dew.recipe import with_data_fields


def data_kind(dataset: Dataset) -> str:
    spec = dataset.batch_spec()
    if "image" in spec:
        return "image"
    if "tokens" in spec:
        return "tokens"
    raise ValueError(f"dataset fields {sorted(spec)} are neither images nor tokens")


def build_objective(run: RunConfig, dataset: Dataset) -> Any:
    """The objective ``run`` names (or the natural one) for ``dataset``; ``run`` is resolved."""
    kind = data_kind(dataset)
    name = run.objective or natural_objective(run.model.architecture, kind)
    check_objective(name, run.model.architecture, kind)
    module_name, cls_name = objectives[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    if name == "flow_matching":
        fields = dataset.model_fields()
        size, channels = int(fields["input_size"]), int(fields["in_channels"])
        return cls(model_config=run.model, knobs=run.flow_matching,  # type: ignore[attr-defined]
                   num_classes=int(fields.get("num_classes", 0)), image_shape=(size, size, channels))
    raise ValueError(f"objective {name!r} has no builder")


def build_run(run: RunConfig) -> tuple[RunConfig, Any, Dataset]:
    """Load the dataset at the trainer's batch, fill in the model fields that follow from it, and
    build the objective. Returns the resolved run (what run.json records)."""
    dataset = run.data.load(batch_size=run.trainer.batch_size, seed=run.trainer.seed)
    run = with_data_fields(run, dict(dataset.model_fields()))
    objective = build_objective(run, dataset)
    return run, objective, dataset


