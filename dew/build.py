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
from dew.typed import ConfigError


def data_kind(dataset: Dataset) -> str:
    spec = dataset.batch_spec()
    if "image" in spec:
        return "image"
    if "tokens" in spec:
        return "tokens"
    raise ValueError(f"dataset fields {sorted(spec)} are neither images nor tokens")


def objective_name(run: RunConfig, dataset: Dataset) -> str:
    """The objective ``run`` names, or the natural one for its architecture and ``dataset``; an
    incompatible pair raises naming both."""
    kind = data_kind(dataset)
    name = run.objective or natural_objective(run.model.architecture, kind)
    check_objective(name, run.model.architecture, kind)
    return name


def data_fields(name: str, dataset: Dataset) -> dict[str, object]:
    """The model fields that follow from ``dataset`` when objective ``name`` trains on it.

    ``masked_diffusion`` adds the mask token to the vocabulary, as id V of a model vocabulary of
    V + 1, and reads the window's first ``seq_len`` tokens with an unconditional simple_dit (its
    ``input_size`` is the sequence length, its ``num_classes`` 0). run.json records the result.
    """
    fields = dict(dataset.model_fields())
    if name == "masked_diffusion":
        return {"vocab_size": int(fields["vocab_size"]) + 1, "input_size": int(fields["seq_len"]),
                "num_classes": 0}
    return fields


def build_objective(run: RunConfig, dataset: Dataset) -> Any:
    """The objective ``run`` names (or the natural one) for ``dataset``; ``run`` is resolved (its
    model fields filled in from ``data_fields``)."""
    name = objective_name(run, dataset)
    module_name, cls_name = objectives[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    fields = dataset.model_fields()
    if name == "flow_matching":
        size, channels = int(fields["input_size"]), int(fields["in_channels"])
        return cls(model_config=run.model, knobs=run.flow_matching,  # type: ignore[attr-defined]
                   num_classes=int(fields.get("num_classes", 0)), image_shape=(size, size, channels))
    if name in ("masked_diffusion", "next_token"):
        return cls(model_config=run.model, knobs=getattr(run, name), vocab_size=int(fields["vocab_size"]),
                   seq_len=int(fields["seq_len"]), tokenizer=getattr(dataset, "tokenizer", None))
    raise ValueError(f"objective {name!r} has no builder")


def build_run(run: RunConfig) -> tuple[RunConfig, Any, Dataset]:
    """Load the dataset at the trainer's batch, fill in the model fields that follow from it, and
    build the objective. Returns the resolved run (what run.json records)."""
    dataset = run.data.load(batch_size=run.trainer.batch_size, seed=run.trainer.seed)
    name = objective_name(run, dataset)
    try:
        run = with_data_fields(run, data_fields(name, dataset))
    except ConfigError as err:
        if name != "masked_diffusion":
            raise
        raise ConfigError(f"{err} (masked_diffusion adds the mask token to the data's vocabulary: "
                          f"vocab_size is the data's + 1)") from None
    objective = build_objective(run, dataset)
    return run, objective, dataset
