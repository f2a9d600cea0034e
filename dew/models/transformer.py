"""``transformer``: a decoder-only causal language model (RMSNorm, RoPE, SwiGLU, GQA), registered.
Its layers are in ``dew.models.decoder``; this module holds what dew needs to know about it without
JAX: its fields (declared in ``dew.models.transformer_fields``), the fields the data sets, its FLOPs,
its QK-clip layers and the shape of one call.
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
from dew.models.transformer_fields import TransformerFields

if TYPE_CHECKING:
    from flax import nnx


@architectures.register("transformer")
class Transformer(Architecture):
    """A decoder-only causal language model in the style current LM trainers use."""

    Fields = TransformerFields
    data_fields = ("vocab_size", "seq_len")
    padded_fields = ("vocab_size",)
    role = "causal_lm"
    fields: TransformerFields

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        from dew.models.decoder import Transformer as Layers  # heavy: Flax loads only when the model is built

        return Layers(self.fields, rngs)

    def data_kind(self) -> str:
        return "tokens"

    def head_dim(self) -> int:
        return self.fields.head_dim or self.fields.hidden_size // self.fields.num_heads

    def mup_width_multiplier(self) -> float | None:
        # the layers' m (dew.models.decoder.width_multiplier), for the optimizer's groups
        return self.fields.hidden_size / self.fields.mup_base_width if self.fields.mup else None

    def matmul_params(self) -> tuple[int, int, int]:
        """``(per-token weights, per-example weights, tokens)``; a tied head still multiplies."""
        f = self.fields
        D = f.hidden_size
        q_width, kv_width = f.num_heads * self.head_dim(), (f.num_kv_heads or f.num_heads) * self.head_dim()
        mlp = f.mlp_hidden or 128 * -(-8 * D // (3 * 128))
        per_block = D * q_width + 2 * D * kv_width + q_width * D + 3 * D * mlp
        return f.depth * per_block + D * f.vocab_size, 0, f.seq_len

    def flops_per_example(self) -> float:
        per_token, per_example, tokens = self.matmul_params()
        return training_flops(
            per_token, per_example, tokens, self.fields.depth, self.fields.num_heads * self.head_dim()
        )

    def qk_clip_layers(self) -> dict[str, QKClipLayer]:
        if self.fields.qk_norm:
            raise ValueError(
                "QK-clip (optim.optimizer=muonclip) with model.config.qk_norm=true: QK-norm "
                "normalises the query and key scale away, so QK-clip cannot cap the logits; use "
                "one of them"
            )
        if self.fields.qkv_bias:
            raise ValueError(
                "QK-clip (optim.optimizer=muonclip) with model.config.qkv_bias=true: QK-clip caps the "
                "logits by scaling the query and key kernels, which leaves their biases' part of the "
                "logits uncapped; use one of them"
            )
        return {
            QK_LAYER: QKClipLayer(
                query=("blocks/attn/q/kernel",),
                key=("blocks/attn/k/kernel",),
                num_heads=self.fields.num_heads,
                num_kv_heads=self.fields.num_kv_heads,
                split_heads=True,
            )
        }

    def call_shapes(self, batch: int, length: int | None = None) -> tuple[Shape, ...]:
        return (((batch, length or self.fields.seq_len), "int32"),)
