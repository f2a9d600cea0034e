"""Typed configuration for a training run.

One dataclass tree describes a run: what to build (``ModelConfig``), what to feed it (a registered
``DataSpec``), how to optimize it (``OptimConfig``) and how the trainer runs (``TrainerConfig``).
``dew-train`` composes it with Hydra, converts it once with ``RunConfig.from_dict``, builds the
objective and the dataset it names and hands both to ``RunConfig.train``; ``to_dict`` is a full
record of the run and ``from_dict`` puts it back together. The resolved config is the run's spec:
``save`` writes it to ``run.json`` next to the checkpoints and ``load`` reads it back into the same
class, so inference rebuilds a run from what training was built from.

This module does not import JAX.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from dew.contract import duration
from dew.contract.axes import LOGICAL_AXES
from dew.contract.data import DataSpec, datasets
from dew.contract.evals import Evals, EvalTask
from dew.contract.models import architecture, resolve_fields
from dew.contract.models import build as build_architecture
from dew.contract.registry import AttentionImpl, DtypeName, MatmulPrecision
from dew.contract.rundir import RUN_RECORD
from dew.contract.schedules import ScheduleSpec
from dew.contract.trackers import trackers as tracker_classes
from dew.contract.typed import ConfigError, JsonString, from_json, to_json, with_defaults

if TYPE_CHECKING:
    from etils import epath
    from flax import nnx

    from dew.contract.data import Dataset
    from dew.objectives.base import Metric, Objective
    from dew.training.state import TrainState

__all__ = [
    "CSV",
    "ConfigError",
    "DataSpec",
    "EarlyStopping",
    "EvalTask",
    "Evals",
    "HookSpec",
    "JsonDict",
    "Layout",
    "LoRA",
    "MLflow",
    "MeshSpec",
    "ModelConfig",
    "OptimConfig",
    "ParamGroup",
    "ProfileWindow",
    "Quantization",
    "Ramp",
    "RunConfig",
    "ScheduleSpec",
    "TensorBoard",
    "Trackers",
    "TrainerConfig",
    "Wandb",
    "default_compilation_cache_dir",
    "json_list_argument",
]

JsonDict = Annotated[dict[str, Any], JsonString]
"""The fields a model is built from, written as a single JSON string on the command line
(``model.config='{"depth": 4}'``) or with Hydra's dict syntax. The registry knows which architecture
takes which field and narrows each one where it builds it, so the values are read there."""


def json_list_argument(cls: type) -> JsonString:
    """Marks a tuple-of-records field that also accepts one JSON list string of ``cls`` records."""
    del cls  # the element type is read from the annotation itself
    return JsonString()


# --------------------------------------------------------------------------------------------- model


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Holds the architecture name and the fields ``models.build`` receives."""

    architecture: str = "simple_dit"
    """A key of the architecture registry (``dew.contract.models.architectures``)."""
    config: JsonDict = dataclasses.field(default_factory=dict)
    """The architecture's fields, merged over its defaults (``dew.contract.models``)."""
    dtype: DtypeName = "bfloat16"
    """Compute dtype; parameter storage is independent."""
    param_dtype: DtypeName | None = None
    """Parameter storage, where the model declares the field. Unset stores float32, which is the
    model's own default."""
    matmul_precision: MatmulPrecision | None = None
    """What every matmul of the model asks XLA for, where the model declares a precision field:
    default is the backend's fastest algorithm, high and highest trade throughput for mantissa bits
    (on Ampere and later, tf32 and fp32 against bf16x3). Unset leaves the model's own."""
    attention_impl: AttentionImpl = "auto"
    """Attention kernel; 'auto' is cudnn on a GPU for the shapes cudnn supports and xla for the
    rest, xla on any other backend."""

    def __post_init__(self) -> None:
        try:
            architecture(self.architecture)
        except ValueError as err:
            raise ConfigError(f"model.architecture: {err}") from None
        resolve_fields(self.architecture, self.config)  # raises naming the field at fault
        for name, value in self._precision().items():
            # One setting, two places: the one that built the model and the one MFU and the record
            # read must not disagree (a silent float32 run reported as bfloat16).
            if name in self.config and self.config[name] != value:
                raise ConfigError(
                    f"model.config.{name}={self.config[name]!r} disagrees with model.{name}={value!r}: "
                    f"set the precision once, as model.{name} (or give both the same value)"
                )

    def _precision(self) -> dict[str, object]:
        declared = architecture(self.architecture).precision()
        values = {
            "dtype": self.dtype,
            "param_dtype": self.param_dtype,
            "matmul_precision": self.matmul_precision,
            "attention_impl": self.attention_impl,
        }
        return {k: v for k, v in values.items() if k in declared and v is not None}

    def fields(self) -> Mapping[str, object]:
        """Return the model's fields with the run's precision settings in them."""
        return {**self.config, **{k: v for k, v in self._precision().items() if k not in self.config}}

    def precision_settings(self) -> frozenset[str]:
        """Return the names ``fields()`` writes that ``config`` did not carry: the run's precision
        settings, as this architecture takes them. A resolved record leaves them out, since this
        value writes them again every time it builds."""
        return frozenset(k for k in self._precision() if k not in self.config)

    @classmethod
    def from_dict(cls, values: Mapping[str, object]) -> Self:
        """Read back the record ``RunConfig.to_dict`` writes for this field."""
        return from_json(cls, values, "model")

    def build(self, rngs: nnx.Rngs | int = 0) -> nnx.Module:
        """Build the architecture from ``fields()``; ``rngs`` seeds its initialisation."""
        from flax import nnx

        if isinstance(rngs, int):
            rngs = nnx.Rngs(rngs)
        return build_architecture(self.architecture, self.fields(), rngs)


# ----------------------------------------------------------------------------------------- optimizer


@dataclasses.dataclass(frozen=True)
class ParamGroup:
    """A group of parameters by path pattern: its learning-rate multiplier and weight decay."""

    pattern: str
    """A regular expression searched in each parameter's path (``blocks/attn/qkv/kernel``)."""
    lr_multiplier: float = 1.0
    """The group's learning rate as a multiple of the run's."""
    weight_decay: float | None = None
    """The group's decoupled weight decay; unset uses ``OptimConfig.weight_decay``."""

    def __post_init__(self) -> None:
        import re

        try:
            re.compile(self.pattern)
        except re.error as err:
            raise ValueError(f"param group pattern {self.pattern!r} is not a regular expression: {err}") from None
        if self.lr_multiplier < 0:
            raise ValueError(f"param group {self.pattern!r}: lr_multiplier={self.lr_multiplier} must be >= 0")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Holds the optimizer, learning-rate schedule and gradient clipping."""

    optimizer: Literal["adam", "adamw", "lamb", "muon", "muonclip"] = "adamw"
    """The update rule (``dew.training.optim.build``)."""
    optimizer_opts: JsonDict = dataclasses.field(default_factory=dict)
    """The optimizer's own options (betas, eps, Muon's momentum, QK-clip's tau, ...)."""
    learning_rate: float = 0.00027
    """The constant rate, when no schedule is named; a schedule's peak otherwise."""
    schedule: ScheduleSpec | None = None
    """The learning-rate schedule, one typed record per kind (``dew.training.optim.schedules``): cosine,
    power (lm-engine's power law with an optional linear tail) or linear; each holds only its own
    fields."""
    weight_decay: float | None = None
    """Decoupled weight decay; unset is the optimizer's own default (docs/optimizers.md)."""
    param_groups: Annotated[tuple[ParamGroup, ...], json_list_argument(ParamGroup)] = ()
    """Per-group learning-rate multipliers and weight decay, first match wins; empty moves every
    parameter alike. ``dew.training.optim.build.mup_param_groups`` is lm-engine's muP split; with
    ``model.config.mup`` on, the built run holds it here (``dew.training.optim.mup``)."""
    clip_grads: float = 0.0
    """Global-norm gradient clipping threshold; 0 disables."""
    state_dtype: Literal["float32", "bfloat16"] = "float32"
    """Adam's moments in memory. bfloat16 stores both stochastically rounded
    (``dew.training.optim.build.bf16_moments``), for adam and adamw only: half the optimizer state and
    less of the update's memory traffic."""

    def __post_init__(self) -> None:
        if self.learning_rate < 0:
            raise ValueError(f"optim.learning_rate={self.learning_rate} must be >= 0")
        if self.weight_decay is not None and self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay={self.weight_decay} must be >= 0")
        if self.clip_grads < 0:
            raise ValueError(f"optim.clip_grads={self.clip_grads} must be >= 0 (0 disables)")
        if self.state_dtype == "bfloat16" and self.optimizer not in ("adam", "adamw"):
            raise ValueError(
                f"optim.state_dtype='bfloat16' is for adam and adamw only, not optim.optimizer={self.optimizer!r}"
            )


# ------------------------------------------------------------------------------------------- trainer


@dataclasses.dataclass(frozen=True)
class Wandb:
    """Says where a run reports to. Setting it turns tracking on; the entity and the offline switch
    mean nothing without a project."""

    project: str
    """The W&B project."""
    entity: str | None = None
    """The W&B team or user; unset is the account's default."""
    offline: bool = False
    """Write the run locally (``wandb sync`` later); needs no key and no network."""

    def __post_init__(self) -> None:
        if not self.project:
            raise ValueError("trainer.wandb.project must be a non-empty W&B project name")


@dataclasses.dataclass(frozen=True)
class TensorBoard:
    """TensorBoard event files (docs/tracking.md): every scalar the journal logs, the resolved config
    as text, the samples of each evaluation."""

    directory: str | None = None
    """The folder that holds each run's event files, in ``<directory>/<run name>``; unset:
    ``tensorboard/`` in the run's tracking folder, so ``tensorboard --logdir <tracking dir>`` shows
    every run."""


@dataclasses.dataclass(frozen=True)
class MLflow:
    """An MLflow run (docs/tracking.md): the resolved config as params, the metrics by step, run.json
    and the samples as artifacts. A resumed run logs into the same MLflow run."""

    tracking_uri: str | None = None
    """The tracking server or store (``http://host:5000``, ``sqlite:///mlflow.db``); unset:
    ``MLFLOW_TRACKING_URI``, else MLflow's own default."""
    experiment: str | None = None
    """The experiment the run joins, created if it does not exist; unset: ``MLFLOW_EXPERIMENT_NAME``,
    else MLflow's default experiment."""

    def __post_init__(self) -> None:
        if self.experiment is not None and not self.experiment.strip():
            raise ValueError("trainer.trackers.mlflow.experiment must be a non-empty name, or null for the default")


@dataclasses.dataclass(frozen=True)
class CSV:
    """One CSV of the run's logged metrics, ``metrics.csv`` beside the journal: a row per metric
    record the journal's history holds (docs/tracking.md)."""


@dataclasses.dataclass(frozen=True)
class Trackers:
    """Where a run reports besides its journal (always written) and ``trainer.wandb``: each set
    record turns one on, in any combination (``dew-train trainer/trackers=[tensorboard,csv]``);
    ``plugins`` holds the trackers of plugin packages. Each tracker is a class registered in
    ``dew.contract.trackers.trackers`` (dew's own: ``dew.training.reporting.trackers``)."""

    tensorboard: TensorBoard | None = None
    """TensorBoard event files (tensorboardX, ``pip install 'dew[trackers]'``)."""
    mlflow: MLflow | None = None
    """An MLflow run (mlflow-skinny, ``pip install 'dew[trackers]'``)."""
    csv: CSV | None = None
    """``metrics.csv`` beside the journal (no extra library)."""
    plugins: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The trackers of plugin packages (docs/extending.md), by registered name: each one's options,
    a record of its ``Options`` (``{}`` for its defaults). Each package's
    ``conf/trainer/trackers/<name>.yaml`` turns one on (``trainer/trackers=[csv,<name>]``)."""

    def __post_init__(self) -> None:
        # Each plugin's options read into its Options record here, once: a bad one is refused by
        # its dotted path, and run.json records every option, defaults included.
        declared = [f.name for f in dataclasses.fields(self) if f.name != "plugins"]
        options: dict[str, Any] = {}
        for name, value in self.plugins.items():
            if value is None:  # trainer.trackers.plugins.<name>=null: off
                continue
            where = f"trainer.trackers.plugins.{name}"
            if name in declared or name == "wandb":
                own = "trainer.wandb" if name == "wandb" else f"trainer.trackers.{name}"
                raise ConfigError(f"{where}: {name} is dew's own tracker, set as {own}")
            if name not in tracker_classes:
                known = sorted(set(tracker_classes) - {*declared, "wandb"})
                raise ConfigError(f"{where}: unknown tracker {name!r}; plugin trackers: {', '.join(known) or 'none'}")
            cls = tracker_classes[name].Options
            options[name] = value if isinstance(value, cls) else from_json(cls, with_defaults(cls, value), where)
        object.__setattr__(self, "plugins", options)

    def get(self, name: str) -> Any:
        """The options of tracker ``name`` this record turns on (a field of dew's own, or a
        plugin's), None when it is off."""
        if name != "plugins" and name in {f.name for f in dataclasses.fields(self)}:
            return getattr(self, name)
        return self.plugins.get(name)


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """Axis sizes of the device mesh over every visible device. -1 takes the devices left over
    (at most one axis)."""

    data: int = -1
    """Data parallel: replicas of the parameters, each with its own part of the batch."""
    fsdp: int = 1
    """Fully-sharded data parallel: parameters and optimizer state sharded, batch split too."""
    tensor: int = 1
    """Tensor parallel (Megatron): attention heads, MLP hidden width and vocabulary split, as
    ``trainer.layout.rules`` maps them."""

    def __post_init__(self) -> None:
        sizes = dataclasses.asdict(self)
        for axis, size in sizes.items():
            if size == 0 or size < -1:
                raise ValueError(f"trainer.mesh.{axis}={size} must be a positive size or -1")
        if sum(s == -1 for s in sizes.values()) > 1:
            raise ValueError(f"trainer.mesh: at most one axis may be -1, got {sizes}")

    def shape(self, device_count: int) -> dict[str, int]:
        """The axis sizes over ``device_count`` devices; raises if they do not multiply to it."""
        sizes = dataclasses.asdict(self)
        known = math.prod(s for s in sizes.values() if s != -1)
        if -1 in sizes.values():
            if device_count % known:
                raise ValueError(f"trainer.mesh={sizes}: {known} does not divide {device_count} devices")
            sizes = {k: (device_count // known if v == -1 else v) for k, v in sizes.items()}
        if math.prod(sizes.values()) != device_count:
            raise ValueError(
                f"trainer.mesh={sizes} needs {math.prod(sizes.values())} devices, {device_count} are visible; "
                "give trainer.mesh sizes that multiply to the devices here (an axis of -1 takes the rest)"
            )
        return sizes


def default_rules() -> dict[str, tuple[str, ...]]:
    """Data parallel over ``data``, FSDP over ``fsdp`` along ``embed``, Megatron tensor parallel over
    ``tensor`` (heads, MLP hidden, vocabulary), and their products. The order matters for
    activations: ``batch`` comes first, so the residual stream ``(batch, length, embed)`` splits its
    batch over data and fsdp and keeps ``embed`` whole."""
    return {
        "batch": ("data", "fsdp"),
        "embed": ("fsdp",),
        "mlp": ("tensor",),
        "heads": ("tensor",),
        "kv_heads": ("tensor",),
        "vocab": ("tensor",),
        "modulation": ("tensor",),
        "kv": (),
        "length": (),
        "layers": (),
        "classes": (),
        "features": (),
    }


@dataclasses.dataclass(frozen=True)
class Layout:
    """How parameters and activations map onto the mesh: one table from the logical axis names the
    models declare (``dew.models.axes.LOGICAL_AXES``) to mesh axes (``dew.training.sharding``)."""

    rules: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=default_rules)
    """Logical axis name -> the mesh axes (data, fsdp, tensor) its dimension splits over, in order of
    precedence: a dimension takes its rule's axes unless an earlier rule took one of them for another
    dimension of the same array. An empty list or a name without a rule replicates. The batch
    dimension of every input splits over ``rules.batch``. One entry changes from the command line
    (``trainer.layout.rules.embed=[fsdp,tensor]``)."""
    min_shard_size: int = 1024
    """Parameters (and their optimizer state) with fewer elements stay replicated, whatever their
    axes say: splitting them saves nothing and costs a collective."""

    def __post_init__(self) -> None:
        mesh_axes = tuple(f.name for f in dataclasses.fields(MeshSpec))
        for name, axes in self.rules.items():
            if name not in LOGICAL_AXES:
                raise ValueError(
                    f"trainer.layout.rules: unknown logical axis {name!r}; the models name {', '.join(LOGICAL_AXES)}"
                )
            for axis in axes:
                if axis not in mesh_axes:
                    raise ValueError(
                        f"trainer.layout.rules.{name}: unknown mesh axis {axis!r}; axes are {', '.join(mesh_axes)}"
                    )
            if len(set(axes)) != len(axes):
                raise ValueError(f"trainer.layout.rules.{name}={list(axes)} names a mesh axis twice")
        if self.min_shard_size < 0:
            raise ValueError(f"trainer.layout.min_shard_size={self.min_shard_size} must be >= 0")

    @property
    def table(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The rules as flax's ``(name, mesh axes)`` pairs, in order."""
        return tuple((name, tuple(axes)) for name, axes in self.rules.items())

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The mesh axes the batch dimension splits over."""
        return tuple(self.rules.get("batch", ()))


@dataclasses.dataclass(frozen=True)
class Ramp:
    """Grow the global batch over the run's first records: from ``start``, by ``increment`` a stage,
    up to ``TrainerConfig.batch_size``, with the stages spread evenly over ``records``."""

    start: int
    """The global batch the run starts at."""
    increment: int
    """What each stage adds to the global batch."""
    records: int
    """Records the whole ramp spans, before the run trains at ``batch_size``."""

    def __post_init__(self) -> None:
        for name in ("start", "increment", "records"):
            if getattr(self, name) <= 0:
                raise ValueError(f"trainer.batch_ramp.{name}={getattr(self, name)} must be positive")

    def stages(self, batch_size: int) -> list[tuple[int, int]]:
        """``(global batch, steps)`` for each stage: the ramp's records spread evenly over its stages,
        each stage's steps rounded up (at least one); the last, at ``batch_size``, has steps 0 and
        lasts to the end of the run."""
        sizes = list(range(self.start, batch_size, self.increment))
        per_stage = self.records // max(len(sizes), 1)
        return [(b, max(1, math.ceil(per_stage / b))) for b in sizes] + [(batch_size, 0)]


@dataclasses.dataclass(frozen=True)
class HookSpec:
    """One of the loop's hooks by its registered name (docs/training.md, "Hooks"), its cadence and its
    options."""

    name: str
    """The hook's name in ``dew.training.hooks.hooks`` (a plugin's too)."""
    every: int = 1
    """Steps between its calls; it also runs at the run's last step."""
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments of the hook's class."""

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"trainer.hooks: hook {self.name!r}: every={self.every} must be >= 1")


@dataclasses.dataclass(frozen=True)
class ProfileWindow:
    """One profiler window: the steps to trace, the warmup before it and where it is written."""

    warmup: int = 10
    """Steps run before tracing starts (compilation and the first steps excluded)."""
    steps: int = 5
    """Steps traced."""
    directory: str = "./profiles"
    """Where the trace (TensorBoard/Perfetto format) is written."""

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.steps <= 0:
            raise ValueError(f"trainer.profile: warmup={self.warmup} must be >= 0 and steps={self.steps} > 0")


@dataclasses.dataclass(frozen=True)
class EarlyStopping:
    """Stop the run once an evaluation value stops improving: at the first evaluation after
    ``warmup`` at which ``patience`` evaluations in a row have not bettered the best by more than
    ``min_delta``. The run then ends as a finished one does, with its last checkpoint and a note in
    the journal, and the same command trains nothing more (docs/training.md, "Early stopping")."""

    metric: str | None = None
    """The evaluation value watched (``eval/loss``, ``eval/<metric>``). Unset watches the one that
    chooses the best checkpoint (the objective's metric marked best, else ``eval/loss``)."""
    mode: Literal["min", "max"] | None = None
    """Whether lower or higher is better. Unset takes the metric's own direction (a metric marked
    higher-is-better: max; ``eval/loss`` and the rest: min)."""
    patience: int = 3
    """Evaluations in a row without an improvement after which the run stops."""
    min_delta: float = 0.0
    """The least gain over the best value so far that counts as an improvement, in the metric's
    units (0: any gain)."""
    warmup: int = 0
    """Evaluations at the start of the run that may not stop it (they do set the best value and
    count towards the patience)."""

    def __post_init__(self) -> None:
        if self.metric is not None and not self.metric.startswith("eval/"):
            raise ValueError(
                f"trainer.early_stopping.metric={self.metric!r} must be an evaluation value "
                "(eval/loss, eval/<metric>): only evaluations feed the rule"
            )
        if self.patience < 1:
            raise ValueError(f"trainer.early_stopping.patience={self.patience} must be >= 1 evaluation")
        if not math.isfinite(self.min_delta) or self.min_delta < 0:
            raise ValueError(f"trainer.early_stopping.min_delta={self.min_delta} must be finite and >= 0")
        if self.warmup < 0:
            raise ValueError(f"trainer.early_stopping.warmup={self.warmup} must be >= 0 evaluations")


QType = Literal["int8", "int4", "float8_e4m3fn", "float8_e5m2"]


@dataclasses.dataclass(frozen=True)
class Quantization:
    """Quantized training with qwix: the module's matmuls run on quantized operands (straight-through
    gradients), parameters stay in their storage dtype."""

    weight_qtype: QType = "int8"
    """The type weights are quantized to in the forward pass."""
    act_qtype: QType | None = "int8"
    """The type activations are quantized to; unset keeps them in the compute dtype."""
    bwd_qtype: QType | None = None
    """The type the backward pass's matmuls use; unset keeps them in the compute dtype."""
    module_path: str = ".*"
    """Regular expression over module paths that are quantized."""
    tile_size: int | None = None
    """Quantize in tiles of this many elements along the contraction (subchannel); unset is
    per-channel."""

    def __post_init__(self) -> None:
        if self.tile_size is not None and self.tile_size <= 0:
            raise ValueError(f"trainer.quantization.tile_size={self.tile_size} must be positive")


def default_compilation_cache_dir() -> str:
    """$DEW_COMPILATION_CACHE, else the user's cache directory (XDG) under dew/jax."""
    if path := os.environ.get("DEW_COMPILATION_CACHE"):
        return path
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dew", "jax")


Cadence = int | Literal["epoch"] | None

STEP_LIMIT = 2**31 - 1
"""The most steps (and the largest batch, cadence or epoch count) a run can take: the step counter,
the schedules and the batch indices are 32-bit integers on the device."""

SEED_LIMIT = 2**62
"""The largest ``trainer.seed`` magnitude: JAX keys take 64-bit seeds and the run derives seed + 2."""


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """Holds the run length, checkpointing, sharding and run tracking."""

    name: str | None = None
    """The run's name: its directory under ``checkpoint_dir``. Unset names it by the start time
    (or, in a sweep, by the sweep and the job's overrides)."""
    checkpoint_dir: str = "./checkpoints"
    """Where run directories live."""
    keep: int = 2
    """Latest checkpoints kept, besides the best one."""
    batch_size: int = 32
    """Global batch, over every process."""
    seed: int = 0
    """Seed of the run key: parameter init and every per-step draw."""
    steps: int | None = None
    """Run length in optimizer updates; epochs names it as passes over the data instead."""
    epochs: int | None = None
    """Run length as passes over the data; steps names it directly instead."""
    log_every: int = 100
    """Steps between metric fetches (and log lines)."""
    eval_every: Cadence = "epoch"
    """Steps between validation passes: a number of steps, "epoch" for one pass over the data, None
    to never validate. "epoch" over a stream that reports no record count raises a ValueError. A run
    longer than ``EPOCH_EVENTS`` (10) epochs takes "epoch" as every few whole epochs, so that it
    validates at most 10 times; a number of steps is kept as given."""
    checkpoint_every: Cadence = "epoch"
    """Steps between checkpoints, the same three answers ("epoch" bounded to at most 10 checkpoints
    a run, as for eval_every). None is what a stream whose iterator cannot report a read position
    trains with; the trainer refuses any other answer for one."""
    accumulation: int = 1
    """Micro-batches per optimizer update."""
    batch_ramp: Ramp | None = None
    """Grow batch_size over the run's first records instead of starting there. Unset trains at
    batch_size throughout. One optimizer update a step either way; the step is traced once per
    stage."""
    dynamic_scale: bool = False
    """A dynamic loss scale (for float16 compute): a non-finite step is skipped and the scale backs
    off."""
    mesh: MeshSpec = dataclasses.field(default_factory=MeshSpec)
    """Device mesh axis sizes."""
    layout: Layout = dataclasses.field(default_factory=Layout)
    """How parameters and activations map onto the mesh."""
    profile: ProfileWindow | None = None
    """One profiler window. Unset traces nothing."""
    hooks: tuple[HookSpec, ...] = ()
    """The run's own hooks around the steps, by registered name, each at its cadence (e.g.
    ``[{name: my_hook, every: 10}]``); dew's own (the report, the evaluation, the checkpoint)
    always run."""
    compilation_cache_dir: str | None = dataclasses.field(default_factory=default_compilation_cache_dir)
    """Persisted XLA cache, so a restart skips recompiling the step. None compiles from scratch
    every run."""
    wandb: Wandb | None = None
    """Optional W&B sink in addition to the local tracking journal."""
    trackers: Trackers = dataclasses.field(default_factory=Trackers)
    """TensorBoard, MLflow and CSV, besides the journal and ``wandb`` (docs/tracking.md). Process 0
    writes them; a tracker that fails (a server down) is warned about once and turned off, never
    ending the run."""
    multi_host: bool | None = None
    """Join the JAX process pool. None asks and continues alone only when no cluster is configured;
    True requires the pool; False never asks."""
    xla_flags: str | None = None
    """Extra XLA_FLAGS for this run, appended to the environment before JAX opens a backend."""
    quantization: Quantization | None = None
    """Quantized-training spec, wrapped around the module the objective trains before the run
    initialises it; unset trains in the compute dtype."""
    init_from: str | None = None
    """Start from these parameters instead of the seed's (docs/weights.md): a dew run directory
    (its latest intact step), ``<run>/<step>``, or a Hugging Face Llama, Qwen2, Qwen3 or Mistral
    directory (``dew-export``'s layout), whose ``config.json`` fills the ``model.config`` fields the
    run does not set; or such a model's hub name (``owner/name``), read from the local Hugging Face
    cache. Parameters only: the optimizer, the step and the schedule start fresh. With ``lora``
    the loaded parameters are the frozen base. A local path is recorded absolute, a hub name as it
    is. Unset starts from the seed."""
    init_skip: tuple[str, ...] = ()
    """Regular expressions over parameter paths (``head/kernel``) that init_from leaves as the seed
    initialised them: the parameters whose shape must differ from the source's (a new vocabulary
    or class count). Every other parameter must match the source's shape."""
    early_stopping: EarlyStopping | None = None
    """Stop the run once an evaluation value stops improving (patience, min_delta, warmup); unset
    trains the whole length."""
    overfit_batches: int | None = None
    """Train on the first this many batches of the data, served again and again, instead of on all
    of it: a model that cannot drive its loss down on one batch has a bug (``debug=overfit``).
    Evaluation still reads the held-out data. Unset trains on the whole data."""
    debug_nans: bool = False
    """Turn on JAX's ``jax_debug_nans`` and ``jax_debug_infs``: a compiled call (the train step, an
    evaluation) whose output holds a NaN or an infinity is run again op by op, and the run stops at
    the operation that made the first one, naming the step and the operation (``debug=nans``). Each
    call then waits for its outputs and checks them on the host: for debugging, not for speed. An
    infinity inside a compiled call that never reaches its outputs (an attention mask's -inf) is not
    checked; one that does stops the run as a NaN does."""
    check_resume: bool = False
    """At the run's first checkpoint, read it back as a resumed run would (the state, the data
    position, the hooks' state) and check it holds the live run's values bit for bit; a debugging
    aid (``debug=fast``) that costs one restore."""
    prefetch: int = 2
    """Batches read and placed on the devices ahead of the step that trains them, by a background
    thread, while the steps before run (dew.training.prefetch); each holds device memory for one
    batch. 0 reads and places each batch at the top of its step. Which records a step trains on,
    and the data position a checkpoint saves, are the same at every depth."""
    max_time: str | None = None
    """Wall-clock limit of one start of the run, counted from its set-up (restore and compilation
    included): seconds (``5400``), a number with units (``90m``, ``1.5h``, ``2d``, ``1h30m``) or
    ``DD:HH:MM:SS`` / ``HH:MM:SS`` (``00:12:00:00``). When it is reached, the run stops at the next
    step boundary with a checkpoint, as a preempted run does, and the same command resumes it (with
    a fresh limit); a resume may change it. Unset: no limit. Leave room for that last save below a
    job's own time limit."""

    stall_timeout: str | None = None
    """How long a process may go without progress (a step ending, an evaluation or a save starting
    or ending) before its watchdog ends the job (dew.training.watchdog): the same spellings as
    ``max_time``. It then logs which process is stuck and the Python stacks of its threads, ends
    the job's processes that are not running on its host, and requeues a submitit job (the run
    resumes from its last checkpoint) or exits with status 75. The first step of each start (its
    compilation) and the first evaluation and save are not timed; every later step, data read,
    evaluation and save is, so set it above the longest of them. Unset: no watchdog."""

    evals: Evals | None = None
    """Downstream tasks (multiple choice, log-likelihood: ``dew.contract.evals``) scored during the
    run beside the held-out evaluation, as ``eval/<task>/<value>`` (docs/eval.md); unset scores none."""

    dynamics_every: int | None = None
    """Steps between reports of the training dynamics (docs/training.md): each block's and
    parameter group's RMS of activations, gradients, updates and parameters and the
    update/parameter ratio, as ``dynamics/<kind>/<group>`` metrics, computed inside the steps that
    report them (a second compiled program). A multiple of ``log_every``, so that each lands in a
    report. Unset reports none."""

    final_samples: bool = True
    """Whether ``dew-train`` draws samples of the trained model into the run directory at the end of
    the run (``samples.png`` of an image model, ``samples.txt`` of a language model: the objective's
    own sampler and sizes). ``false`` skips them: a large model's samples can take minutes, and
    ``dew-sample RUN`` draws them from any saved step later."""

    def max_time_seconds(self) -> float | None:
        """``max_time`` in seconds, None for no limit."""
        return None if self.max_time is None else duration.seconds(self.max_time, "trainer.max_time")

    def stall_timeout_seconds(self) -> float | None:
        """``stall_timeout`` in seconds, None for no watchdog."""
        return None if self.stall_timeout is None else duration.seconds(self.stall_timeout, "trainer.stall_timeout")

    def check_dynamics_every(self) -> None:
        """Refuse a ``dynamics_every`` that is not a positive multiple of ``log_every``."""
        if self.dynamics_every is not None and (
            self.dynamics_every <= 0 or self.dynamics_every % self.log_every or self.dynamics_every > STEP_LIMIT
        ):
            raise ValueError(
                f"trainer.dynamics_every={self.dynamics_every} must be a positive multiple of "
                f"trainer.log_every={self.log_every} (the dynamics are reported with the step's "
                "metrics), or null for none"
            )

    def __post_init__(self) -> None:
        for field in ("max_time", "stall_timeout"):
            value = getattr(self, field)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                object.__setattr__(self, field, str(value))  # a number of seconds, from Python
        self.max_time_seconds()  # a bad value is refused here, naming the field
        self.stall_timeout_seconds()
        if self.init_from is not None and "://" not in self.init_from and not hub_name(self.init_from):
            object.__setattr__(self, "init_from", os.path.abspath(os.path.expanduser(self.init_from)))
        for pattern in self.init_skip:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"trainer.init_skip pattern {pattern!r} is not a regular expression: {err}") from None
        if self.init_skip and self.init_from is None:
            raise ValueError(
                f"trainer.init_skip={list(self.init_skip)} needs trainer.init_from: "
                "there is nothing to skip when every parameter starts from the seed"
            )
        if self.steps is not None and self.epochs is not None:
            raise ValueError(
                f"trainer.steps={self.steps} and trainer.epochs={self.epochs}: set exactly one (null the other)"
            )
        for name in ("steps", "epochs"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"trainer.{name}={value} must be positive")
        for name in ("keep", "batch_size", "log_every", "accumulation"):
            if getattr(self, name) <= 0:
                raise ValueError(f"trainer.{name}={getattr(self, name)} must be positive")
        for name in ("steps", "epochs", "batch_size", "log_every", "accumulation", "eval_every", "checkpoint_every"):
            value = getattr(self, name)
            if isinstance(value, int) and value > STEP_LIMIT:
                raise ValueError(
                    f"trainer.{name}={value} exceeds {STEP_LIMIT}, the most a run can take "
                    "(steps, batches and cadences are 32-bit integers on the device)"
                )
        self.check_dynamics_every()
        if not -SEED_LIMIT <= self.seed <= SEED_LIMIT:
            raise ValueError(
                f"trainer.seed={self.seed} must lie in [-{SEED_LIMIT}, {SEED_LIMIT}] "
                "(JAX keys take 64-bit seeds, and the run draws from seed + 2)"
            )
        for name in ("eval_every", "checkpoint_every"):
            value = getattr(self, name)
            if isinstance(value, int) and value <= 0:
                raise ValueError(f"trainer.{name}={value} must be a positive number of steps, 'epoch' or null")
        if self.batch_size % self.accumulation:
            raise ValueError(
                f"trainer.batch_size={self.batch_size} does not divide into "
                f"trainer.accumulation={self.accumulation} micro-batches"
            )
        if self.batch_ramp is not None:
            ramp = self.batch_ramp
            if ramp.start >= self.batch_size or (self.batch_size - ramp.start) % ramp.increment:
                raise ValueError(
                    f"trainer.batch_ramp: start={ramp.start} must lie below "
                    f"trainer.batch_size={self.batch_size} and reach it in whole "
                    f"increments of {ramp.increment}"
                )
        if self.prefetch < 0:
            raise ValueError(
                f"trainer.prefetch={self.prefetch} must be >= 0 (batches read ahead; 0 reads each at its step)"
            )
        if self.overfit_batches is not None and self.overfit_batches <= 0:
            raise ValueError(f"trainer.overfit_batches={self.overfit_batches} must be a positive number of batches")
        if self.overfit_batches is not None and self.batch_ramp is not None:
            raise ValueError(
                f"trainer.overfit_batches={self.overfit_batches} repeats batches of one size: unset "
                "trainer.batch_ramp (or trainer.overfit_batches)"
            )
        if self.early_stopping is not None and self.eval_every is None:
            raise ValueError(
                "trainer.early_stopping is set but trainer.eval_every=null: the rule watches evaluations; "
                "give a number of steps or 'epoch'"
            )
        if self.name is not None:
            _check_run_name(self.name)

    def stages(self) -> list[tuple[int, int]]:
        """``(global batch, steps)`` per stage of the batch ramp; the last stage (steps 0) lasts to
        the end of the run. Without a ramp, one stage at ``batch_size``."""
        return self.batch_ramp.stages(self.batch_size) if self.batch_ramp else [(self.batch_size, 0)]

    # The three lengths below read only the dataset's record count: they are what the spec's
    # stream rules are about.
    def _steps_per_epoch(self, dataset: Dataset, field: str) -> int:
        if dataset.num_records is None:
            raise ValueError(
                f"trainer.{field}='epoch' (or trainer.epochs) needs a record count, and "
                "this dataset is a stream that reports none: give a number of steps"
            )
        return records_to_steps(self, dataset.num_records)

    def _epoch_cadence(self, dataset: Dataset, field: str) -> int:
        """The steps of an ``"epoch"`` cadence: one pass over the data, or as many whole passes as
        keep the run to at most ``EPOCH_EVENTS`` evaluations (checkpoints) when it is longer."""
        per_epoch = self._steps_per_epoch(dataset, field)
        if self.steps is None and self.epochs is None:
            return per_epoch  # no length yet: total_steps says so
        return per_epoch * epochs_between(self.total_steps(dataset), per_epoch)

    def total_steps(self, dataset: Dataset) -> int:
        """Return the run's length in steps, from steps or from epochs over data."""
        if self.steps is not None:
            return self.steps
        if self.epochs is None:
            raise ValueError("the run has no length: set trainer.steps or trainer.epochs")
        if dataset.num_records is None:
            raise ValueError(
                "trainer.epochs needs a record count, and this dataset is a stream "
                "that reports none: set trainer.steps instead"
            )
        return records_to_steps(self, self.epochs * dataset.num_records)

    def eval_interval(self, dataset: Dataset) -> int | None:
        """Return the steps between validation passes over data, or None for never."""
        if self.eval_every == "epoch":
            return self._epoch_cadence(dataset, "eval_every")
        return self.eval_every

    def checkpoint_interval(self, dataset: Dataset) -> int | None:
        """Return the steps between checkpoints over data, or None for never."""
        if self.checkpoint_every is not None and not getattr(dataset, "resumable", True):
            raise ValueError(
                f"trainer.checkpoint_every={self.checkpoint_every!r}: this dataset's "
                "iterator cannot report a read position, so a checkpoint could not "
                "resume it; train it with trainer.checkpoint_every=null"
            )
        if self.checkpoint_every == "epoch":
            return self._epoch_cadence(dataset, "checkpoint_every")
        return self.checkpoint_every


EPOCH_EVENTS = 10
"""The most evaluations (and checkpoints) an ``"epoch"`` cadence makes in one run: a run of more
epochs evaluates every few epochs instead (``epochs_between``). A number of steps is kept as given."""


def epochs_between(total_steps: int, steps_per_epoch: int) -> int:
    """Whole epochs between two events of an ``"epoch"`` cadence: 1, or the fewest that keep a run of
    ``total_steps`` to at most ``EPOCH_EVENTS`` of them (a 200-step run of 7-step epochs: every 3
    epochs, 9 events rather than 28)."""
    return max(1, math.ceil(total_steps / (steps_per_epoch * EPOCH_EVENTS)))


def records_to_steps(trainer: TrainerConfig, records: int) -> int:
    """Optimizer updates that consume ``records`` (at least one), the batch ramp included."""
    steps, left = 0, records
    for batch, n in trainer.stages():
        n = min(n or left // batch, left // batch)
        steps, left = steps + n, left - n * batch
        if left < batch:
            break
    return max(steps, 1)


HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
"""A Hugging Face hub repository id, ``owner/name``."""


def hub_name(value: str) -> bool:
    """Whether ``value`` reads as a hub id (``Qwen/Qwen2.5-0.5B``) and names no local path: a
    ``trainer.init_from`` kept as it is, read from the local Hugging Face cache."""
    return bool(HUB_NAME.match(value)) and not os.path.exists(os.path.expanduser(value))


def _check_run_name(name: str) -> None:
    parts = name.replace("\\", "/").split("/")
    if not name or os.path.isabs(name) or any(p in ("", ".", "..") for p in parts):
        raise ValueError(
            f"trainer.name={name!r} must be a relative path inside trainer.checkpoint_dir "
            "(no '..', no leading '/', no empty parts)"
        )


# ----------------------------------------------------------------------------------------------- run


PUBLIC_MODULE = "dew.config"
"""Where users import the contract's classes from (it re-exports this module): the name a message
gives for a class defined here."""


def _written_by(cls: type, values: object, directory: str) -> str:
    """For a record ``cls`` cannot read: which subclass of RunConfig wrote it (the one whose fields
    are exactly the record's) and how to load it; empty when none is known. The subclasses known are
    those imported: the public ``dew.config`` imports dew-train's ``Recipe``, so a plain
    ``RunConfig.load`` recognises its records."""
    if not isinstance(values, Mapping):
        return ""
    pending, seen = list(RunConfig.__subclasses__()) + [RunConfig], []
    while pending:
        sub = pending.pop()
        pending.extend(sub.__subclasses__())
        if sub is not cls and sub not in seen:
            seen.append(sub)
    for sub in seen:
        if {f.name for f in dataclasses.fields(sub) if f.init} == set(values):
            module = PUBLIC_MODULE if sub.__module__ == __name__ else sub.__module__
            where = f"{module}.{sub.__qualname__}"
            return (
                f"\nThis record was written by {where} (not {cls.__qualname__}); load it as that class: "
                f"{where}.load({directory!r})"
            )
    return ""


NO_RECORD = (
    f"no {RUN_RECORD}: not a dew run directory (no run record: dew-train writes one before the first "
    "step), or the record was deleted"
)
"""What a directory without a run record is: the reason ``NoRunRecord`` gives."""


class NoRunRecord(FileNotFoundError):
    """A directory that holds no run record. ``reason`` says so without the directory, for a reader
    that names the run already (a ``dew-runs`` row)."""

    def __init__(self, directory: str) -> None:
        super().__init__(f"{directory} holds {NO_RECORD}")
        self.directory, self.reason = directory, NO_RECORD


class RunRecordError(ConfigError):
    """A run record that cannot be read: not JSON, not a run record, or not one of the class asked
    for. ``path`` is the file, ``reason`` what is wrong with it; the message is both."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """A run's record (``run.json``) as read from its directory, by ``read``: the one reader of the
    file. ``dew-runs`` and the resume rules compare the values as written; ``RunConfig.load`` and
    ``dew-sample`` rebuild the run from the typed view."""

    directory: str
    """The run directory, local or any filesystem epath reaches (``gs://...``)."""
    values: dict[str, Any]
    """The record as written (``RunConfig.to_dict``): JSON values, a section per part of the run."""

    @property
    def path(self) -> str:
        return os.fspath(_record_file(self.directory))

    @classmethod
    def read(cls, directory: str | os.PathLike[str]) -> RunRecord:
        """The record in ``directory``. Raises ``NoRunRecord`` when there is none and
        ``RunRecordError`` when the file is not JSON (cut off mid-write, edited) or not a run record
        (no trainer section)."""
        directory = os.fspath(directory)
        file = _record_file(directory)
        if not file.exists():
            raise NoRunRecord(directory)
        try:
            values = json.loads(file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RunRecordError(
                os.fspath(file), f"not a JSON run record ({err}): cut off mid-write, or edited"
            ) from None
        if not isinstance(values, dict) or not isinstance(values.get("trainer"), dict):
            raise RunRecordError(os.fspath(file), "not a dew run record (no trainer section)")
        return cls(directory, with_added_fields(values))

    def typed[C: RunConfig](self, cls: type[C]) -> C:
        """The record as ``cls`` (``RunConfig`` or a subclass such as ``Recipe``); a record ``cls``
        cannot read raises ``RunRecordError`` naming the field, and the class that wrote it when
        that is another."""
        try:
            return cls.from_dict(self.values)
        except ConfigError as err:
            raise RunRecordError(self.path, f"{err}{_written_by(cls, self.values, self.directory)}") from None


ADDED_FIELDS: dict[str, Any] = {
    "trainer.max_time": None,
    "trainer.stall_timeout": None,
    "trainer.trackers.plugins": {},
    "data.documents": False,
    "trainer.evals": None,
    "trainer.dynamics_every": None,
    "trainer.final_samples": True,
}
"""Fields a record gained after runs were written without them, each with the value a run written
before behaves as: ``RunRecord.read`` fills them in where a record lacks them, so a run an older dew
wrote is resumed, evaluated and sampled by this one (a record lacking any other field is still
refused by name). Every field added to the record from now on comes here with its default."""


def with_added_fields(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (a record as written) with ``ADDED_FIELDS`` it lacks filled in; a section the
    record does not hold is left alone (the typed view names it)."""
    import copy

    filled = copy.deepcopy(values)
    for dotted, default in ADDED_FIELDS.items():
        *parents, leaf = dotted.split(".")
        section: Any = filled
        for key in parents:
            section = section.get(key) if isinstance(section, dict) else None
        if isinstance(section, dict) and leaf not in section and declares(parents, section, leaf):
            section[leaf] = copy.deepcopy(default)
    return filled


def declares(parents: Sequence[str], section: Mapping[str, Any], leaf: str) -> bool:
    """Whether ``section`` (at ``parents``) has a field ``leaf`` to fill in. The ``data`` section is
    one of the registered dataset specs, named by its ``name``: a field added to some of them
    (``data.documents``, the token datasets') is filled in only where the record's spec declares it."""
    if list(parents) != ["data"]:
        return True
    name = section.get("name")
    return isinstance(name, str) and name in datasets and leaf in {f.name for f in dataclasses.fields(datasets[name])}


def _record_file(directory: str) -> epath.Path:
    from etils import epath

    return epath.Path(directory) / RUN_RECORD


@dataclasses.dataclass(frozen=True)
class LoRA:
    """A low-rank adapter (qwix): a delta B·A of rank ``rank`` on each targeted module's weight."""

    rank: int = 8
    """Rank of each delta."""
    alpha: float = 16.0
    """The delta is scaled by alpha / rank."""
    targets: tuple[str, ...] = (".*",)
    """Regular expressions over module paths under params that carry a delta."""

    def __post_init__(self) -> None:
        if self.rank <= 0:
            raise ValueError(f"lora.rank={self.rank} must be positive")
        if not self.targets:
            raise ValueError("lora.targets must name at least one module path pattern")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Describes a whole run. Recipes add their objective's knobs by subclassing this."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    """What to build."""
    data: DataSpec = dataclasses.field(default_factory=lambda: datasets["oxford_flowers102"]())
    """What to feed it: a registered dataset spec."""
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    """How to optimize it."""
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    """How the trainer runs."""
    objective: str | None = None
    """What the model learns (``dew.objectives``); unset picks the natural one for the architecture
    and the data."""
    lora: LoRA | None = None
    """The low-rank adapter the run trains instead of the whole model. The targets are the module
    paths under params a delta sits on; train adapts the objective's module and freezes every other
    leaf."""

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-safe record of the run. A registered member is written as its name and its
        fields."""
        return to_json(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, object]) -> Self:
        """Read back what ``to_dict`` wrote, for subclasses too. An unknown or a missing field
        raises."""
        return from_json(cls, values, "")

    def save(self, directory: str) -> str:
        """Write this config as run.json in ``directory`` and return the path.

        The path goes through epath, the same filesystem layer orbax writes the checkpoints with, so
        a gs:// run directory takes the record too. The record is written to a temporary file and
        renamed over any record there (a run trained further takes its new length: docs/training.md),
        so a reader never sees half a record.
        """
        from etils import epath

        folder = epath.Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / RUN_RECORD
        tmp = folder / f".{RUN_RECORD}.tmp"
        # allow_nan=False: the record is strict JSON (the typed conversion already refuses NaN).
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False, allow_nan=False) + "\n")
        tmp.replace(path)
        return os.fspath(path)

    @classmethod
    def load(cls, directory: str) -> Self:
        """Read the config a run in ``directory`` was built from, as this class (``RunRecord``)."""
        return RunRecord.read(directory).typed(cls)

    def train(
        self,
        objective: Objective,
        dataset: Dataset,
        *,
        name: str,
        metrics: Sequence[Metric] = (),
        summary: Mapping[str, object] | None = None,
    ) -> TrainState:
        """Train ``objective`` on ``dataset`` as this run says; every recipe calls this once it has
        built both.

        The run lives under ``name`` in ``trainer.checkpoint_dir``, and process zero writes the record
        there before anything trains. ``dataset`` must be the one loaded at ``trainer.batch_size``.
        ``metrics`` (``dew.objectives.base.Metric``) are computed on every evaluation batch as sums
        and counts, logged as ``eval/<name>`` to the journal and W&B, and one marked ``best`` chooses
        the best checkpoint instead of ``eval/loss``.
        """
        from dew.training.trainer import (
            train,
        )  # the one arrow up (tests/test_layers.py); heavy: JAX stays out of the contract

        return train(self, objective, dataset, name=name, metrics=metrics, summary=summary)
