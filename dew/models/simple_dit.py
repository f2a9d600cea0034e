"""``simple_dit``: the diffusion transformer of Peebles & Xie (2023), registered. Its layers are in
``dew.models.dit``; this module holds what dew needs to know about it without JAX: its fields, the
fields the data sets, its FLOPs, its QK-clip layers and the shape of one call.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from dew.contract.models import (
    QK_LAYER,
    Architecture,
    PrecisionFields,
    QKClipLayer,
    Shape,
    architectures,
    check_divides,
    check_positive,
)
from dew.contract.registry import RematPolicy
from dew.models.flops import training_flops

if TYPE_CHECKING:
    from flax import nnx

TIMESTEP_FREQUENCIES = 256
"""Width of the sinusoidal timestep embedding (``dew.models.dit.TimestepEmbedder``)."""

_SIZES = {"S": (384, 12, 6), "B": (768, 12, 12), "L": (1024, 24, 16), "XL": (1152, 28, 16)}
DIT_PRESETS: dict[str, dict[str, int]] = {
    f"{size}/{patch}": {"hidden_size": hidden, "depth": depth, "num_heads": heads, "patch_size": patch}
    for size, (hidden, depth, heads) in _SIZES.items()
    for patch in (2, 4, 8)
}
"""The paper's configurations (Table 1): name -> the ``simple_dit`` fields it sets. The paper's
256x256 models add ``input_size=32, in_channels=4, num_classes=1000, learn_sigma=True``."""


@dataclasses.dataclass(frozen=True)
class SimpleDiTFields(PrecisionFields):
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

    def __post_init__(self) -> None:
        check_positive(self, "input_size", "in_channels", "patch_size", "hidden_size", "depth", "num_heads")
        check_divides(self, "num_heads", "hidden_size")
        if self.mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio={self.mlp_ratio} must be > 0")
        if self.num_classes < 0:
            raise ValueError(f"num_classes={self.num_classes} must be >= 0 (0 is unconditional)")
        if self.vocab_size is not None and self.vocab_size < 1:
            raise ValueError(f"vocab_size={self.vocab_size} must be >= 1")
        if self.vocab_size is not None and self.learn_sigma:
            raise ValueError(
                f"learn_sigma=True predicts image variances; token data (vocab_size={self.vocab_size}) has none"
            )
        if (self.hidden_size // 2) % 2:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a multiple of 4 "
                "(the 2-D sin-cos position embedding splits it in four)"
            )


@architectures.register("simple_dit")
class SimpleDiT(Architecture):
    """DiT with adaLN-Zero blocks: on images (NHWC patches) or, with ``vocab_size``, on token
    sequences (masked diffusion)."""

    Fields = SimpleDiTFields
    data_fields = ("input_size", "in_channels", "num_classes", "vocab_size")
    role = "denoiser"
    fields: SimpleDiTFields

    def check_data(self) -> None:
        f = self.fields
        if f.vocab_size is None and f.input_size % f.patch_size:
            raise ValueError(f"input_size={f.input_size} is not a multiple of patch_size={f.patch_size}")

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        from dew.models.dit import SimpleDiT as Layers  # heavy: Flax loads only when the model is built

        return Layers(self.fields, rngs)

    def data_kind(self) -> str:
        return "image" if self.fields.vocab_size is None else "tokens"

    def matmul_params(self) -> tuple[int, int, int]:
        """``(per-token weights, per-example weights, tokens)``: the timestep MLP and the adaLN
        modulations act once per example on the conditioning vector, not per token."""
        f = self.fields
        D, mlp = f.hidden_size, int(f.hidden_size * f.mlp_ratio)
        if f.vocab_size is not None:
            tokens, embed, out = f.input_size, 0, D * f.vocab_size
        else:
            tokens = (f.input_size // f.patch_size) ** 2
            channels = f.in_channels * (2 if f.learn_sigma else 1)
            embed, out = f.patch_size**2 * f.in_channels * D, D * f.patch_size**2 * channels
        per_token = embed + f.depth * (4 * D * D + 2 * D * mlp) + out
        per_example = TIMESTEP_FREQUENCIES * D + D * D + f.depth * 6 * D * D + 2 * D * D
        return per_token, per_example, tokens

    def flops_per_example(self) -> float:
        per_token, per_example, tokens = self.matmul_params()
        return training_flops(per_token, per_example, tokens, self.fields.depth, self.fields.hidden_size)

    def qk_clip_layers(self) -> dict[str, QKClipLayer]:
        return {
            QK_LAYER: QKClipLayer(
                query=("blocks/attn/q/kernel", "blocks/attn/q/bias"),
                key=("blocks/attn/k/kernel", "blocks/attn/k/bias"),
                num_heads=self.fields.num_heads,
                split_heads=True,
            )
        }

    def call_shapes(self, batch: int, length: int | None = None) -> tuple[Shape, ...]:
        f = self.fields
        if f.vocab_size is not None:
            return ((batch, length or f.input_size), "int32"), ((batch,), "float32")
        image = (batch, f.input_size, f.input_size, f.in_channels)
        return (image, "float32"), ((batch,), "float32"), ((batch,), "int32")
