"""Architecture name -> the fields it takes (a dataclass with their types and defaults) and its builder.

The fields dataclasses import no JAX, so ``ModelConfig.fields()`` can validate and merge a model's
fields on a login node; ``build`` imports the architecture's module only when it builds.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dew.registry import AttentionImpl, DtypeName, MatmulPrecision, RematPolicy, unknown_name

if TYPE_CHECKING:
    from flax import nnx

PRECISION_FIELDS = ("dtype", "param_dtype", "matmul_precision", "attention_impl")
"""The run's precision settings (``ModelConfig``) an architecture may declare as fields."""


@dataclasses.dataclass(frozen=True)
class SimpleDiTFields:
    """Fields of ``simple_dit`` (Peebles & Xie 2023). Defaults are DiT-S/2 on 32x32x4 latents."""

    input_size: int = 32
    """Image side in pixels (or latents); for token data, the sequence length. From the data."""
    in_channels: int = 4
    """Image channels. From the data; ignored for token data."""
    patch_size: int = 2
    """Side of a square patch (images only)."""
    hidden_size: int = 384
    """Width of the transformer."""
    depth: int = 12
    """Number of DiT blocks."""
    num_heads: int = 6
    """Attention heads per block."""
    mlp_ratio: float = 4.0
    """MLP hidden width as a multiple of ``hidden_size``."""
    num_classes: int = 1000
    """Classes of the label embedding (one more "null" class is added for guidance). From the data;
    0 builds an unconditional model."""
    vocab_size: int | None = None
    """For token data: the vocabulary (mask token included); a token embedding replaces the patch
    embedding and the output is vocabulary-sized. From the data."""
    learn_sigma: bool = False
    """Double the output channels to predict a variance as well (DiT's learned-sigma variant)."""
    scan_layers: bool = True
    """Stack the blocks and scan over them (compile time flat in depth); False unrolls."""
    remat: RematPolicy = "minimal_with_context"
    """What each block's backward pass keeps of its forward pass, the rest recomputed: none, full,
    dots, minimal or minimal_with_context (``dew.models.stack``; measured in docs/performance.md)."""
    dtype: DtypeName = "float32"
    """Compute dtype of every layer."""
    param_dtype: DtypeName = "float32"
    """Storage dtype of the parameters."""
    matmul_precision: MatmulPrecision = "default"
    """What every matmul asks XLA for: default, high or highest."""
    attention_impl: AttentionImpl = "auto"
    """Attention kernel; see ``ModelConfig.attention_impl``."""

    def __post_init__(self) -> None:
        _positive(self, "input_size", "in_channels", "patch_size", "hidden_size", "depth", "num_heads")
        _divides(self, "num_heads", "hidden_size")
        if self.mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio={self.mlp_ratio} must be > 0")
        if self.num_classes < 0:
            raise ValueError(f"num_classes={self.num_classes} must be >= 0 (0 is unconditional)")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"vocab_size={self.vocab_size} must be >= 1")
        if self.vocab_size is not None and self.learn_sigma:
            raise ValueError("learn_sigma=True predicts image variances; token data "
                             f"(vocab_size={self.vocab_size}) has none")
        if (self.hidden_size // 2) % 2:
            raise ValueError(f"hidden_size={self.hidden_size} must be a multiple of 4 "
                             "(the 2-D sin-cos position embedding splits it in four)")

    def check_data(self) -> None:
        """Checks that need the data's fields, which the recipe fills in after the config is read."""
        if self.vocab_size is None and self.input_size % self.patch_size:
            raise ValueError(f"simple_dit: input_size={self.input_size} is not a multiple of "
                             f"patch_size={self.patch_size}")


@dataclasses.dataclass(frozen=True)
class TransformerFields:
    """Fields of ``transformer``: a decoder-only causal LM (RMSNorm, RoPE, SwiGLU, GQA)."""

    vocab_size: int = 50304
    """Vocabulary size. From the data."""
    seq_len: int = 1024
    """Longest sequence (RoPE is computed up to it). From the data."""
    hidden_size: int = 768
    """Model width."""
    depth: int = 12
    """Number of decoder blocks."""
    num_heads: int = 12
    """Query heads per block."""
    num_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); unset is ``num_heads`` (multi-head)."""
    head_dim: int | None = None
    """Features per head; unset is ``hidden_size // num_heads``."""
    mlp_hidden: int | None = None
    """SwiGLU hidden width; unset is 8/3·hidden_size rounded up to a multiple of 128."""
    qk_norm: bool = False
    """RMS-normalise queries and keys per head before RoPE."""
    tie_embeddings: bool = False
    """Share the token embedding with the output head."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding's frequencies."""
    norm_eps: float = 1e-6
    """Epsilon of every RMSNorm."""
    mup: bool = False
    """Apply lm-engine's muP multipliers: logits / width multiplier, attention scaled by 1/head_dim,
    hidden matrices initialised with ``init_std / sqrt(width multiplier)``."""
    mup_base_width: int = 256
    """The width the muP multipliers are relative to (width multiplier = hidden_size / this)."""
    embedding_multiplier: float = 1.0
    """Scale of the token embedding's output."""
    residual_multiplier: float = 1.0
    """Scale of each block's branch before it joins the residual stream."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of every matrix."""
    scan_layers: bool = True
    """Stack the blocks and scan over them (compile time flat in depth); False unrolls."""
    remat: RematPolicy = "minimal_with_context"
    """What each block's backward pass keeps of its forward pass, the rest recomputed: none, full,
    dots, minimal or minimal_with_context (``dew.models.stack``; measured in docs/performance.md)."""
    dtype: DtypeName = "float32"
    """Compute dtype of every layer."""
    param_dtype: DtypeName = "float32"
    """Storage dtype of the parameters."""
    matmul_precision: MatmulPrecision = "default"
    """What every matmul asks XLA for: default, high or highest."""
    attention_impl: AttentionImpl = "auto"
    """Attention kernel; see ``ModelConfig.attention_impl``."""

    def __post_init__(self) -> None:
        _positive(self, "vocab_size", "seq_len", "hidden_size", "depth", "num_heads", "mup_base_width")
        if self.head_dim is None:
            _divides(self, "num_heads", "hidden_size")
        head_dim = self.head_dim or self.hidden_size // self.num_heads
        if head_dim < 2 or head_dim % 2:
            raise ValueError(f"head_dim={head_dim} must be even (rotary embeddings rotate pairs)")
        if self.num_kv_heads is not None:
            _positive(self, "num_kv_heads")
            _divides(self, "num_kv_heads", "num_heads")
        if self.mlp_hidden is not None:
            _positive(self, "mlp_hidden")
        if self.norm_eps <= 0 or self.init_std <= 0 or self.rope_theta <= 0:
            raise ValueError(f"norm_eps={self.norm_eps}, init_std={self.init_std} and "
                             f"rope_theta={self.rope_theta} must be > 0")

    def check_data(self) -> None:
        """Checks that need the data's fields; every field check of ``transformer`` is above."""


def _positive(record: object, *names: str) -> None:
    for name in names:
        if getattr(record, name) < 1:
            raise ValueError(f"{name}={getattr(record, name)} must be >= 1")


def _divides(record: object, divisor: str, name: str) -> None:
    if getattr(record, name) % getattr(record, divisor):
        raise ValueError(f"{name}={getattr(record, name)} is not a multiple of "
                         f"{divisor}={getattr(record, divisor)}")


@dataclasses.dataclass(frozen=True)
class Architecture:
    """A registered architecture: the fields it takes and where its builder lives."""

    fields: type
    """A frozen dataclass of the fields, with their types and defaults."""
    builder: str
    """``module:function``; the function takes the fields record and ``nnx.Rngs``."""
    data_fields: tuple[str, ...] = ()
    """Fields that follow from the data; the recipe fills them in from the dataset."""

    def declared(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.fields))

    def precision(self) -> tuple[str, ...]:
        """The run's precision settings this architecture declares as fields."""
        return tuple(n for n in PRECISION_FIELDS if n in self.declared())


architectures: dict[str, Architecture] = {
    "simple_dit": Architecture(
        SimpleDiTFields, "dew.models.dit:build",
        data_fields=("input_size", "in_channels", "num_classes", "vocab_size"),
    ),
    "transformer": Architecture(
        TransformerFields, "dew.models.transformer:build", data_fields=("vocab_size", "seq_len"),
    ),
}
"""Architecture name -> its fields and builder."""


def architecture(name: str) -> Architecture:
    if name not in architectures:
        raise unknown_name("architecture", name, architectures)
    return architectures[name]


def resolve_fields(name: str, values: Mapping[str, object]) -> Any:
    """Check ``values`` against the architecture's fields and return its fields record.

    An unknown field, or a value of the wrong type, raises naming the architecture, the field and
    the fields it takes.
    """
    from dew.typed import ConfigError, from_json, hints

    arch = architecture(name)
    declared = arch.declared()
    unknown = sorted(set(values) - set(declared))
    if unknown:
        raise ConfigError(f"model.config: architecture {name!r} takes no field "
                          f"{', '.join(map(repr, unknown))}; it takes {', '.join(declared)}")
    types_ = hints(arch.fields)
    kwargs = {}
    for key, value in values.items():
        try:
            kwargs[key] = from_json(types_[key], value, f"model.config.{key}")
        except ConfigError as err:
            raise ConfigError(f"{err} (architecture {name!r}; it takes {', '.join(declared)})") from None
    try:
        return arch.fields(**kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"model.config ({name}): {err}") from None


def with_data_fields(name: str, values: Mapping[str, object],
                     from_data: Mapping[str, object]) -> dict[str, object]:
    """Return ``values`` with the fields that follow from the data filled in from ``from_data``.

    ``from_data`` is what the dataset says (``input_size``, ``in_channels``, ``num_classes``,
    ``vocab_size``, ``seq_len``, ...); only the architecture's data fields are taken from it. An
    explicit value that differs from the data's raises naming both, instead of being overridden.
    """
    from dew.typed import ConfigError

    arch = architecture(name)
    merged = dict(values)
    for key in arch.data_fields:
        if key not in from_data:
            continue
        if key in merged and merged[key] != from_data[key]:
            raise ConfigError(f"model.config.{key}={merged[key]!r} conflicts with the data's "
                              f"{key}={from_data[key]!r} (architecture {name!r}); drop the field "
                              "and it follows the data")
        merged[key] = from_data[key]
    return merged


def build(name: str, values: Mapping[str, object], rngs: nnx.Rngs) -> nnx.Module:
    """Build architecture ``name`` from its fields (merged over its defaults)."""
    from dew.typed import ConfigError

    record = resolve_fields(name, values)
    try:
        record.check_data()
    except ValueError as err:
        raise ConfigError(f"model.config ({name}): {err}") from None
    module_name, function = architecture(name).builder.split(":")
    return getattr(importlib.import_module(module_name), function)(record, rngs)
