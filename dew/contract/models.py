"""The architecture registry: ``Architecture``, the class each registered architecture subclasses.

An architecture is one registered class (``@architectures.register("name")``) that knows everything
about itself: its typed fields (a frozen dataclass the YAML option and ``model.config`` mirror), the
fields that follow from the data, how to build it, its training FLOPs, where its attention keeps the
query and key projections (MuonClip's QK-clip), and the shapes of one call (quantization and LoRA
trace it; ``dew-plan`` sizes activations with it). Objectives pair with an architecture through its
``role``, the call it answers, never through its name.

This module imports no JAX, and neither do dew's own architecture modules (``dew.models.simple_dit``,
``dew.models.transformer``): ``ModelConfig.fields()`` validates on a login node, and ``build`` imports
the layers only when it builds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from dew.contract.registry import AttentionImpl, DtypeName, MatmulPrecision, Registry
from dew.contract.typed import ConfigError, from_json, hints, optional_of, with_defaults

if TYPE_CHECKING:
    from flax import nnx

PRECISION_FIELDS = ("dtype", "param_dtype", "matmul_precision", "attention_impl")
"""The run's precision settings (``ModelConfig``) an architecture may declare as fields."""


@dataclasses.dataclass(frozen=True)
class PrecisionFields:
    """The precision fields an architecture's fields inherit to take the run's ``model.dtype``,
    ``model.param_dtype``, ``model.matmul_precision`` and ``model.attention_impl``
    (``ModelConfig.fields`` writes them in; ``dew.models.precision.Precision`` reads them)."""

    dtype: DtypeName = "float32"
    """Compute dtype of every layer."""
    param_dtype: DtypeName = "float32"
    """Storage dtype of the parameters."""
    matmul_precision: MatmulPrecision = "default"
    """What every matmul asks XLA for: default, high or highest."""
    attention_impl: AttentionImpl = "auto"
    """Attention kernel; see ``ModelConfig.attention_impl``."""


QK_LAYER = "attn"
"""The name of the one QK-clip layer description of dew's architectures: both stack their blocks on
a leading depth axis, so one description covers every layer, and the model's ``(depth, heads)`` max
logits (``return_max_logits=True``) line up with the leaves' leading axes."""

Shape = tuple[tuple[int, ...], str]
"""An array's shape and dtype name, without importing JAX."""


@dataclasses.dataclass(frozen=True)
class QKClipLayer:
    """Where one attention layer keeps its query and key projections, for MuonClip's QK-clip
    (``dew.training.optim.muonclip``).

    ``query`` and ``key`` are the "/"-joined paths of the leaves that carry the heads (the kernel,
    and the bias if there is one). Their heads are on the trailing axes: the last axes are
    (heads, head_dim), either as two axes or flattened into one of heads·head_dim (head-major, as a
    reshape of (..., heads, head_dim) gives). Any leading axes before the input axis — a scanned
    stack of layers — must match the leading axes of this layer's max logits.
    """

    query: tuple[str, ...]
    """Paths of the query projection's kernel (…, d_model, heads·head_dim) and bias, if any."""
    key: tuple[str, ...]
    """Paths of the key projection's kernel (…, d_model, kv_heads·head_dim) and bias, if any."""
    num_heads: int
    """Query heads."""
    num_kv_heads: int | None = None
    """Key heads under grouped-query attention; unset is ``num_heads``."""
    split_heads: bool = False
    """True when the leaves end in two axes (heads, head_dim); False when they end in one axis of
    heads·head_dim."""


class Architecture:
    """Base of the registered architectures. An instance is the architecture with its fields.

    A subclass sets ``Fields`` (and ``data_fields``, ``role``) and implements ``build``; the other
    methods have defaults an architecture overrides when it can say more.
    """

    name: ClassVar[str]
    """The name it is registered under (``model.architecture``); set by the registry."""
    Fields: ClassVar[type]
    """A frozen dataclass of the fields, with their types and defaults (its docstrings are the
    documentation of ``model.config``). ``__post_init__`` checks the fields by themselves."""
    data_fields: ClassVar[tuple[str, ...]] = ()
    """Fields that follow from the data; the recipe fills them in from the dataset and the
    objective."""
    padded_fields: ClassVar[tuple[str, ...]] = ()
    """Those of ``data_fields`` the model may hold more of than the data gives: an explicit value at
    least the data's is the model's (rows no id of the data uses: a vocabulary padded to a multiple
    of 128 for the matmuls, as a checkpoint's may be); a smaller one is refused."""
    role: ClassVar[str]
    """The call the built module answers, which objectives train through: ``denoiser``
    (``model(x_t, t[, labels])`` -> a prediction shaped like ``x_t``) or ``causal_lm``
    (``model(tokens)`` -> next-token logits)."""

    def __init__(self, fields: Any) -> None:
        self.fields = fields
        """This architecture's fields record (an instance of ``Fields``)."""

    @classmethod
    def declared(cls) -> tuple[str, ...]:
        """The field names, the architecture's own first and the inherited precision ones last."""
        names = [f.name for f in dataclasses.fields(cls.Fields)]
        return tuple([n for n in names if n not in PRECISION_FIELDS] + [n for n in names if n in PRECISION_FIELDS])

    @classmethod
    def precision(cls) -> tuple[str, ...]:
        """The run's precision settings this architecture declares as fields."""
        return tuple(n for n in PRECISION_FIELDS if n in cls.declared())

    def check_data(self) -> None:
        """Checks that need the fields that follow from the data, which the recipe fills in after
        the config is read; raise ``ValueError``."""

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        """The module (a ``flax.nnx.Module``), initialised from ``rngs`` (a ``flax.nnx.Rngs``)."""
        raise NotImplementedError(f"architecture {self.name!r} must implement build")

    def flops_per_example(self) -> float | None:
        """Training FLOPs (forward and backward) of one example (``dew.models.flops`` states the
        convention); None reports no MFU."""
        return None

    def qk_clip_layers(self) -> dict[str, QKClipLayer]:
        """Where the attention's query and key projections are, for MuonClip; raise ``ValueError``
        where QK-clip cannot work."""
        raise ValueError(
            f"QK-clip (optim.optimizer=muonclip): architecture {self.name!r} describes no "
            "attention layers to clip; choose another optimizer"
        )

    def call_shapes(self, batch: int, length: int | None = None) -> tuple[Shape, ...]:
        """The positional arguments of one call on ``batch`` examples, as shapes and dtypes; a
        sequence is ``length`` long (unset: the longest the fields allow)."""
        raise NotImplementedError(f"architecture {self.name!r} must implement call_shapes")

    def data_kind(self) -> str | None:
        """What the model, with these fields, reads, as the datasets declare it (``image``,
        ``tokens``, ...); None where the fields do not say (the dataset decides)."""
        return None

    def mup_width_multiplier(self) -> float | None:
        """muP's width multiplier (the model's width over the base width its multipliers are
        relative to) when these fields turn muP on; None when they do not, or the architecture has
        no muP. The optimizer's muP groups (``dew.training.optim.mup``) divide the hidden matrices' rate
        by it, so the model and the optimizer read one number."""
        return None


architectures: Registry[type[Architecture]] = Registry(
    "architecture", builtins=("dew.models.simple_dit", "dew.models.transformer")
)
"""Architecture name -> its class."""


def architecture(name: str) -> type[Architecture]:
    return architectures[name]


def resolve_fields(name: str, values: Mapping[str, object]) -> Any:
    """Check ``values`` against the architecture's fields and return its fields record.

    An unknown field, or a value of the wrong type, raises naming the architecture, the field and
    the fields it takes.
    """
    arch = architecture(name)
    declared = arch.declared()
    unknown = sorted(set(values) - set(declared))
    if "mup" in unknown:
        with_mup = [n for n, a in architectures.items() if "mup" in a.declared()]
        raise ConfigError(
            f"model.config.mup: architecture {name!r} has no muP parametrization; muP is "
            f"available on {', '.join(with_mup) or 'no registered architecture'}"
        )
    if unknown:
        raise ConfigError(
            f"model.config: architecture {name!r} takes no field "
            f"{', '.join(map(repr, unknown))}; it takes {', '.join(declared)}"
        )
    types_ = hints(arch.Fields)
    kwargs = {}
    for key, value in values.items():
        try:
            # a nested record (transformer's rope_scaling) may leave out the fields it has defaults for
            kwargs[key] = from_json(types_[key], with_defaults(optional_of(types_[key]), value), f"model.config.{key}")
        except ConfigError as err:
            raise ConfigError(f"{err} (architecture {name!r}; it takes {', '.join(declared)})") from None
    try:
        return arch.Fields(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"model.config ({name}): {err}") from None


def of(name: str, values: Mapping[str, object]) -> Architecture:
    """Architecture ``name`` with its fields resolved from ``values`` (merged over the defaults)."""
    return architecture(name)(resolve_fields(name, values))


def with_data_fields(name: str, values: Mapping[str, object], from_data: Mapping[str, object]) -> dict[str, object]:
    """Return ``values`` with the fields that follow from the data filled in from ``from_data``.

    ``from_data`` is what the dataset (and the objective) say (``input_size``, ``vocab_size``,
    ``seq_len``, ...); only the architecture's data fields are taken from it. An explicit value that
    differs from the data's raises naming both, instead of being overridden; one of its
    ``padded_fields`` may be larger than the data's, and stays.
    """
    arch = architecture(name)
    merged = dict(values)
    for key in arch.data_fields:
        if key not in from_data:
            continue
        given, data = merged.get(key), from_data[key]
        padded = key in arch.padded_fields and isinstance(given, int) and isinstance(data, int) and given > data
        if key in merged and given != data and not padded:
            larger = f", or set it >= {data!r} (rows past the data's are padding)" if key in arch.padded_fields else ""
            raise ConfigError(
                f"model.config.{key}={given!r} conflicts with the data's {key}={data!r} "
                f"(architecture {name!r}); drop the field and it follows the data{larger}"
            )
        merged[key] = given if padded else data
    return merged


def build(name: str, values: Mapping[str, object], rngs: nnx.Rngs) -> nnx.Module:
    """Build architecture ``name`` from its fields (merged over its defaults), initialised from
    ``rngs`` (a ``flax.nnx.Rngs``): the ``flax.nnx.Module`` its ``build`` returns."""
    arch = of(name, values)
    try:
        arch.check_data()
    except ValueError as err:
        raise ConfigError(f"model.config ({name}): {err}") from None
    return arch.build(rngs)


def check_positive(record: object, *names: str) -> None:
    """Raise naming the first of ``names`` whose value on ``record`` is below 1."""
    for name in names:
        if getattr(record, name) < 1:
            raise ValueError(f"{name}={getattr(record, name)} must be >= 1")


def check_divides(record: object, divisor: str, name: str) -> None:
    """Raise unless field ``divisor`` divides field ``name``."""
    if getattr(record, name) % getattr(record, divisor):
        raise ValueError(f"{name}={getattr(record, name)} is not a multiple of {divisor}={getattr(record, divisor)}")
