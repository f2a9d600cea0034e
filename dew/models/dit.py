"""``simple_dit``: the diffusion transformer of Peebles & Xie, "Scalable Diffusion Models with
Transformers" (2023), on images or on token sequences.

Image mode: ``model(x, t, y) -> out``

- ``x``: float ``(B, H, W, C)`` (NHWC), ``H = W = input_size``, ``C = in_channels``.
- ``t``: float ``(B,)`` flow-matching / diffusion time in ``[0, 1]``. The timestep embedder multiplies
  it by ``TIME_SCALE = 1000`` before the sinusoid, so its frequencies are those DiT uses for its
  integer timesteps 0..999.
- ``y``: int ``(B,)`` class labels in ``[0, num_classes]``; the value ``num_classes`` is the "null"
  class that classifier-free guidance trains with and samples from. ``y=None`` means all null. With
  ``num_classes=0`` the model is unconditional and ``y`` is ignored.
- ``out``: ``x``'s shape, or ``2C`` channels with ``learn_sigma`` (the first ``C`` the prediction),
  in the compute dtype.

Token mode (``vocab_size`` set): ``model(tokens, t, y=None) -> logits``, ``tokens`` int ``(B, L)`` with
``L <= input_size``, ``logits`` ``(B, L, vocab_size)``. A token embedding replaces the patch embedding,
attention is bidirectional; this is the network of the masked-diffusion language model. Documents
packed into a row (docs/data.md) come as ``segment_ids=`` and ``positions=`` (int ``(B, L)``): each
token attends to its own document alone (padding, id 0, to padding), and its position embedding is
its place in the document, so a document's outputs are the ones it has alone.

Both modes take ``return_max_logits=True`` and then return ``(out, max_logits)``, ``max_logits``
float32 ``(depth, num_heads)``: each block's largest pre-softmax attention logit per head over the
batch (``dew.models.attention``), outside the gradient, for MuonClip's QK-clip.

**Initialisation (adaLN-Zero, §3.2).** Every block's modulation (shift, scale, gate of attention and
MLP) comes from ``adaLN_modulation`` applied to the conditioning ``c = t_embedder(t) + y_embedder(y)``,
and that layer and the final layer start at zero, so every block is the identity and the model
outputs exactly zero at initialisation. Other matrices are Xavier-uniform, the embedding tables and
the timestep MLP normal(0.02), as in DiT's reference code.

**Parameters** (``blocks`` stacked on a leading ``depth`` axis, ``dew.models.stack``):
``x_embedder`` (image: ``Linear(p·p·C, hidden)``, the patch convolution as a matmul; tokens:
``Embed``), ``t_embedder/mlp_in``, ``t_embedder/mlp_out``, ``y_embedder/embedding`` of
``(num_classes + 1, hidden)``, ``blocks/adaLN_modulation``, ``blocks/attn/{q,k,v,o}``
(``blocks/attn/q/kernel`` is ``(depth, hidden, num_heads, head_dim)``, ``blocks/attn/k/kernel`` the
same, ``blocks/attn/o/kernel`` ``(depth, num_heads, head_dim, hidden)``), ``blocks/mlp_in``,
``blocks/mlp_out``, ``final_layer/adaLN_modulation``, ``final_layer/linear``. The 2-D sin-cos position
embedding is fixed and is not a parameter.

**muP** (``mup``; docs/mup.md has the reasoning and the coordinate check). With the width multiplier
``m = hidden_size / mup_base_width``: the output (``final_layer``'s) is divided by ``m``, attention is
scaled by ``sqrt(b)/head_dim`` (``b`` the head_dim at the base width, ``mup_base_head_dim``), the
timestep MLP's second matrix (``hidden x hidden``) starts at ``0.02 / sqrt(m)``, and the patch
embedding at the base width's Xavier scale (its fan-in is the patch's, which does not grow). The
other hidden matrices keep Xavier's initialisation, whose variance ``2 / (fan_in + fan_out)`` already
falls as ``1/m``, muP's law; the adaLN modulations and the final layer start at zero, which every
width shares. At the base width the model is the standard one.

``dew.models.simple_dit.DIT_PRESETS`` holds the paper's model sizes (Table 1) by name, ``S/2`` ...
``XL/8``; ``conf/model/dit_*.yaml`` are the patch-2 ones.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dew.models import stack
from dew.models.attention import Attention, mup_scale
from dew.models.axes import constrain, param
from dew.models.precision import Precision

if TYPE_CHECKING:
    from dew.models.simple_dit_fields import SimpleDiTFields

TIME_SCALE = 1000.0
"""``t`` in [0, 1] is multiplied by this before the sinusoidal embedding (DiT's timesteps are 0..999)."""

INIT_STD = 0.02
"""Standard deviation of the embedding tables and the timestep MLP (DiT's reference code)."""

_normal = nnx.initializers.normal(INIT_STD)
_zeros = nnx.initializers.zeros_init()


def width_multiplier(f: SimpleDiTFields) -> float:
    """muP's ``m``; ``SimpleDiT.mup_width_multiplier`` (``dew.models.simple_dit``) gives the optimizer's
    groups the same number."""
    return f.hidden_size / f.mup_base_width if f.mup else 1.0


def attention_scale(f: SimpleDiTFields) -> float:
    """``1/sqrt(head_dim)``, and under muP ``sqrt(base)/head_dim`` (``dew.models.attention.mup_scale``)."""
    head = f.hidden_size // f.num_heads
    return mup_scale(head, width_multiplier(f), f.mup_base_head_dim) if f.mup else 1.0 / math.sqrt(head)


def patch_init(f: SimpleDiTFields) -> nnx.Initializer:
    """The patch embedding's: Xavier-uniform, whose variance ``2 / (fan_in + hidden)`` falls with the
    width; under muP the base width's, since an input layer's fan-in (the patch) does not grow."""
    if not f.mup:
        return nnx.initializers.xavier_uniform()
    fan_in = f.patch_size**2 * f.in_channels
    scale = (fan_in + f.hidden_size) / (fan_in + f.mup_base_width)  # 1.0 exactly at the base width
    return nnx.initializers.variance_scaling(scale, "fan_avg", "uniform")


# ------------------------------------------------------------------------------------ embeddings


def patchify(x_BxHxWxC: jax.Array, p: int) -> jax.Array:
    """``(B, H, W, C)`` -> ``(B, H/p · W/p, p·p·C)``, patches in row-major order."""
    B, H, W, C = x_BxHxWxC.shape
    x = x_BxHxWxC.reshape(B, H // p, p, W // p, p, C).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(B, (H // p) * (W // p), p * p * C)


def unpatchify(x_BxNxP: jax.Array, p: int, channels: int) -> jax.Array:
    """The inverse of ``patchify`` for a square image of ``channels`` channels."""
    B, N, _ = x_BxNxP.shape
    side = math.isqrt(N)
    x = x_BxNxP.reshape(B, side, side, p, p, channels).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(B, side * p, side * p, channels)


def sincos_1d(dim: int, positions: np.ndarray) -> np.ndarray:
    """Sin-cos embedding of ``positions`` (MAE / DiT): ``(len, dim)``, sines then cosines."""
    omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
    angles = positions.reshape(-1)[:, None] * omega[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def sincos_2d(dim: int, side: int) -> np.ndarray:
    """DiT's fixed 2-D position embedding of a ``side`` x ``side`` grid: ``(side², dim)``."""
    grid_w, grid_h = np.meshgrid(np.arange(side, dtype=np.float64), np.arange(side, dtype=np.float64))
    return np.concatenate([sincos_1d(dim // 2, grid_w), sincos_1d(dim // 2, grid_h)], axis=1)


def timestep_embedding(t_B: jax.Array, dim: int, max_period: float = 10000.0) -> jax.Array:
    """DiT's sinusoidal timestep embedding: cosines then sines of ``t`` at geometric frequencies."""
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)
    args_BxF = t_B.astype(jnp.float32)[:, None] * freqs[None]
    return jnp.concatenate([jnp.cos(args_BxF), jnp.sin(args_BxF)], axis=-1)


class TimestepEmbedder(nnx.Module):
    """``t`` -> sinusoid of ``TIME_SCALE · t`` -> MLP (Linear, SiLU, Linear)."""

    def __init__(
        self, hidden: int, precision: Precision, rngs: nnx.Rngs, frequency_size: int = 256, out_std: float = INIT_STD
    ):
        self.frequency_size = frequency_size
        kw = dict(rngs=rngs, bias_init=param(_zeros, "embed"), **precision.linear_kwargs)
        self.mlp_in = nnx.Linear(frequency_size, hidden, kernel_init=param(_normal, "features", "embed"), **kw)
        out_init = nnx.initializers.normal(out_std)
        self.mlp_out = nnx.Linear(hidden, hidden, kernel_init=param(out_init, None, "embed"), **kw)

    def __call__(self, t_B: jax.Array) -> jax.Array:
        freq_BxF = timestep_embedding(TIME_SCALE * t_B, self.frequency_size)
        return self.mlp_out(jax.nn.silu(self.mlp_in(freq_BxF)))


# ------------------------------------------------------------------------------------------ blocks


def modulate(x_BxTxD: jax.Array, shift_BxD: jax.Array, scale_BxD: jax.Array) -> jax.Array:
    return x_BxTxD * (1 + scale_BxD[:, None]) + shift_BxD[:, None]


class DiTBlock(nnx.Module):
    """A transformer block whose LayerNorms are modulated by the conditioning, with zero-init gates."""

    def __init__(self, f: SimpleDiTFields, precision: Precision, rngs: nnx.Rngs):
        D, mlp_hidden = f.hidden_size, int(f.hidden_size * f.mlp_ratio)
        norm = dict(epsilon=1e-6, use_bias=False, use_scale=False, rngs=rngs, **precision.dtypes)
        self.norm1, self.norm2 = nnx.LayerNorm(D, **norm), nnx.LayerNorm(D, **norm)
        # LinearGeneral initialises its kernel flattened to (fan in, fan out): Xavier as in DiT.
        self.attn = Attention(
            D,
            f.num_heads,
            precision=precision,
            rngs=rngs,
            impl=f.attention_impl,
            scale=attention_scale(f),
            kernel_init=nnx.initializers.xavier_uniform(),
        )
        xavier = nnx.initializers.xavier_uniform()
        linear = dict(rngs=rngs, **precision.linear_kwargs)
        # Megatron's MLP split: mlp_in by the hidden width (column parallel), mlp_out by it (row).
        self.mlp_in = nnx.Linear(
            D, mlp_hidden, kernel_init=param(xavier, "embed", "mlp"), bias_init=param(_zeros, "mlp"), **linear
        )
        self.mlp_out = nnx.Linear(
            mlp_hidden, D, kernel_init=param(xavier, "mlp", "embed"), bias_init=param(_zeros, "embed"), **linear
        )
        self.adaLN_modulation = nnx.Linear(
            D, 6 * D, kernel_init=param(_zeros, "embed", "modulation"), bias_init=param(_zeros, "modulation"), **linear
        )

    def __call__(
        self, x_BxTxD: jax.Array, c_BxD: jax.Array, return_max_logits: bool, segment_ids: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array | None]:
        mod = jnp.split(self.adaLN_modulation(jax.nn.silu(c_BxD)), 6, axis=-1)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod
        attn = self.attn(
            modulate(self.norm1(x_BxTxD), shift_msa, scale_msa),
            segment_ids=segment_ids,
            return_max_logits=return_max_logits,
        )
        attn_BxTxD, max_logits_N = attn if isinstance(attn, tuple) else (attn, None)  # a tuple when asked for
        x_BxTxD = constrain(x_BxTxD + gate_msa[:, None] * attn_BxTxD, "batch", "length", "embed")
        h_BxTxH = constrain(self.mlp_in(modulate(self.norm2(x_BxTxD), shift_mlp, scale_mlp)), "batch", "length", "mlp")
        x_BxTxD = x_BxTxD + gate_mlp[:, None] * self.mlp_out(jax.nn.gelu(h_BxTxH, approximate=True))
        return constrain(x_BxTxD, "batch", "length", "embed"), max_logits_N


class FinalLayer(nnx.Module):
    """Modulated LayerNorm and a zero-initialised projection to each token's output."""

    def __init__(
        self, hidden: int, out_features: int, precision: Precision, rngs: nnx.Rngs, out_axis: str = "features"
    ):
        self.norm_final = nnx.LayerNorm(
            hidden, epsilon=1e-6, use_bias=False, use_scale=False, rngs=rngs, **precision.dtypes
        )
        zero = dict(rngs=rngs, **precision.linear_kwargs)
        self.linear = nnx.Linear(
            hidden,
            out_features,
            kernel_init=param(_zeros, "embed", out_axis),
            bias_init=param(_zeros, out_axis),
            **zero,
        )
        self.adaLN_modulation = nnx.Linear(
            hidden,
            2 * hidden,
            kernel_init=param(_zeros, "embed", "modulation"),
            bias_init=param(_zeros, "modulation"),
            **zero,
        )

    def __call__(self, x_BxTxD: jax.Array, c_BxD: jax.Array) -> jax.Array:
        shift, scale = jnp.split(self.adaLN_modulation(jax.nn.silu(c_BxD)), 2, axis=-1)
        return self.linear(modulate(self.norm_final(x_BxTxD), shift, scale))


# ------------------------------------------------------------------------------------------- model


class SimpleDiT(nnx.Module):
    """DiT with adaLN-Zero blocks, on images (NHWC) or, with ``vocab_size``, on token sequences."""

    def __init__(self, f: SimpleDiTFields, rngs: nnx.Rngs):
        self.fields = f
        precision = Precision.of(f)
        D = f.hidden_size
        self.tokens = f.vocab_size is not None
        if f.vocab_size is not None:  # self.tokens, as mypy narrows it
            self.x_embedder: nnx.Embed | nnx.Linear = nnx.Embed(
                f.vocab_size, D, embedding_init=param(_normal, "vocab", "embed"), rngs=rngs, **precision.dtypes
            )
            out_features = f.vocab_size
        else:
            self.x_embedder = nnx.Linear(
                f.patch_size**2 * f.in_channels,
                D,
                rngs=rngs,
                kernel_init=param(patch_init(f), "features", "embed"),
                bias_init=param(_zeros, "embed"),
                **precision.linear_kwargs,
            )
            self.out_channels = f.in_channels * (2 if f.learn_sigma else 1)
            out_features = f.patch_size**2 * self.out_channels
        self.t_embedder = TimestepEmbedder(D, precision, rngs, out_std=INIT_STD / math.sqrt(width_multiplier(f)))
        self.y_embedder = (
            nnx.Embed(
                f.num_classes + 1, D, embedding_init=param(_normal, "classes", "embed"), rngs=rngs, **precision.dtypes
            )
            if f.num_classes
            else None
        )
        self.blocks = stack.stack(lambda r: DiTBlock(f, precision, r), f.depth, rngs)
        self.final_layer = FinalLayer(D, out_features, precision, rngs, out_axis="vocab" if self.tokens else "features")
        self.dtype = precision.dtype

    def position_embedding(self, length: int) -> np.ndarray:
        if self.tokens:
            return sincos_1d(self.fields.hidden_size, np.arange(length, dtype=np.float64))
        return sincos_2d(self.fields.hidden_size, self.fields.input_size // self.fields.patch_size)

    def __call__(
        self,
        x: jax.Array,
        t_B: jax.Array,
        y_B: jax.Array | None = None,
        *,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        return_max_logits: bool = False,
    ) -> Any:
        f = self.fields
        if (segment_ids is not None or positions is not None) and not self.tokens:
            raise ValueError("simple_dit takes segment_ids and positions in token mode (vocab_size set) alone")
        if self.tokens:
            if x.ndim != 2 or x.shape[1] > f.input_size:
                raise ValueError(
                    f"simple_dit (tokens) takes (batch, length <= input_size="
                    f"{f.input_size}) token ids, got shape {x.shape}"
                )
            h_BxTxD = self.x_embedder(x)
        else:
            expected = (f.input_size, f.input_size, f.in_channels)
            if x.ndim != 4 or x.shape[1:] != expected:
                raise ValueError(
                    f"simple_dit takes images of shape (batch, {expected[0]}, "
                    f"{expected[1]}, {expected[2]}) (NHWC), got {x.shape}"
                )
            h_BxTxD = self.x_embedder(patchify(x, f.patch_size).astype(self.dtype))
        if positions is None:
            h_BxTxD = h_BxTxD + jnp.asarray(self.position_embedding(h_BxTxD.shape[1]), self.dtype)
        else:  # each token at its place in its document (the table's rows, 0 .. input_size - 1)
            table = jnp.asarray(self.position_embedding(f.input_size), self.dtype)
            h_BxTxD = h_BxTxD + table[positions.astype(jnp.int32)]
        h_BxTxD = constrain(h_BxTxD, "batch", "length", "embed")

        c_BxD = self.t_embedder(t_B)
        if self.y_embedder is not None:
            if y_B is None:
                y_B = jnp.full(t_B.shape, f.num_classes, jnp.int32)
            c_BxD = c_BxD + self.y_embedder(y_B)

        h_BxTxD, max_logits_LxN = stack.run(
            self.blocks,
            lambda block, h: block(h, c_BxD, return_max_logits, segment_ids),
            h_BxTxD,
            scan=f.scan_layers,
            remat=f.remat,
        )
        out = constrain(self.final_layer(h_BxTxD, c_BxD), "batch", "length", "vocab" if self.tokens else "features")
        if f.mup:  # muP's readout multiplier, 1/m
            out = out / jnp.asarray(width_multiplier(f), out.dtype)
        if not self.tokens:
            out = unpatchify(out, f.patch_size, self.out_channels)
        return (out, max_logits_LxN) if return_max_logits else out
