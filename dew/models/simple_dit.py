"""``simple_dit``: the diffusion transformer of Peebles & Xie (2023), registered. Its layers are in
``dew.models.dit``; this module holds what dew needs to know about it without JAX: its fields
(declared in ``dew.models.simple_dit_fields``), the fields the data sets, its FLOPs, its QK-clip
layers and the shape of one call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dew.contract.models import (
    QK_LAYER,
    Architecture,
    QKClipLayer,
    Shape,
    architectures,
)
from dew.models.flops import training_flops
from dew.models.simple_dit_fields import SimpleDiTFields

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

    def mup_width_multiplier(self) -> float | None:
        # the layers' m (dew.models.dit.width_multiplier), for the optimizer's groups
        return self.fields.hidden_size / self.fields.mup_base_width if self.fields.mup else None

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
