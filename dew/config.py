"""The typed configuration of a run: the public module the API contract names.

The classes are defined in the contract package (``dew.contract.config``, with the registries and the
run directory's format beside them); this module hands them on under the name users import, and
imports dew-train's ``Recipe`` so that ``RunConfig.load`` on a record dew-train wrote names the class
to load it with. Importing it imports no JAX.
"""

from __future__ import annotations

import dew.recipe  # noqa: F401  (registers Recipe as a known writer of run records)
from dew.contract.config import (
    CSV,
    ConfigError,
    DataSpec,
    EarlyStopping,
    Evals,
    EvalTask,
    JsonDict,
    Layout,
    LoRA,
    MeshSpec,
    MLflow,
    ModelConfig,
    NoRunRecord,
    OptimConfig,
    ParamGroup,
    ProfileWindow,
    Quantization,
    Ramp,
    RunConfig,
    RunRecord,
    RunRecordError,
    ScheduleSpec,
    TensorBoard,
    Trackers,
    TrainerConfig,
    Wandb,
    default_compilation_cache_dir,
    default_rules,
    json_list_argument,
    records_to_steps,
)

__all__ = [
    "CSV",
    "ConfigError",
    "DataSpec",
    "EarlyStopping",
    "EvalTask",
    "Evals",
    "JsonDict",
    "Layout",
    "LoRA",
    "MLflow",
    "MeshSpec",
    "ModelConfig",
    "NoRunRecord",
    "OptimConfig",
    "ParamGroup",
    "ProfileWindow",
    "Quantization",
    "Ramp",
    "RunConfig",
    "RunRecord",
    "RunRecordError",
    "ScheduleSpec",
    "TensorBoard",
    "Trackers",
    "TrainerConfig",
    "Wandb",
    "default_compilation_cache_dir",
    "default_rules",
    "json_list_argument",
    "records_to_steps",
]
