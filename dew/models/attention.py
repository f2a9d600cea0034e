"""Self-attention shared by ``simple_dit`` and ``transformer``, and the choice of its kernel.

The layer projects to per-head queries, keys and values, calls ``jax.nn.dot_product_attention`` with
the implementation ``attention_impl`` chooses, and projects back:

- ``q``: ``LinearGeneral`` with kernel ``(hidden, num_heads, head_dim)``
- ``k``, ``v``: kernels ``(hidden, num_kv_heads, head_dim)``; query head ``n`` reads key/value head
  ``n // (num_heads // num_kv_heads)`` (grouped-query attention, as ``jax.nn.dot_product_attention``
  groups them)
- ``o``: kernel ``(num_heads, head_dim, hidden)``

**Kernel.** ``xla`` runs anywhere; ``cudnn`` is cuDNN's fused flash attention, which needs a CUDA GPU,
bfloat16 or float16 inputs and a head dim that is a multiple of 8 and at most 128 (256 from Hopper on).
``auto`` takes cudnn exactly when all of that holds and xla otherwise, and logs its choice (logger
``dew.models.attention``, once per distinct choice). An explicit ``cudnn`` that cannot run raises a
ValueError that says why, instead of falling back.

**Maximum logits (MuonClip).** ``Attention(x, return_max_logits=True)`` also returns, per query head,
the largest pre-softmax logit ``scale · q·k`` over the batch and every query/key pair the mask lets
through (causal and padded entries excluded), as float32 of shape ``(num_heads,)`` and outside the
gradient. It is computed by a separate ``QKᵀ`` under ``stop_gradient`` (XLA usually shares it with
the xla kernel's own), since the fused cuDNN kernel does not expose its logits.

**Documents.** ``segment_ids`` (int32, ``(B, T)``; one id per document packed into the row, 0 for
padding) keeps attention within a document: a query attends to a key only where both carry the
same id (and, causal, only to earlier ones). It reaches ``jax.nn.dot_product_attention`` as its
boolean ``mask`` of shape ``(B, 1, T, T)``, which both kernels take: xla applies it to the logits;
cudnn turns it into an additive bias it reads beside its causal mask (jax's public
``dot_product_attention`` hands cuDNN no segment ids or packed offsets, so the mask is materialised
per batch row, ``T²`` booleans). The maximum logits exclude the pairs it masks, and padding.

**Sliding window.** ``window`` (causal self-attention only) lets query ``t`` see keys
``t - window + 1 .. t`` (Mistral's ``sliding_window``). Both kernels take it as
``jax.nn.dot_product_attention``'s ``local_window_size=(window - 1, 0)`` (xla as a mask; cudnn as
its causal sliding window); the cached decoding path (``dew.models.kv_cache.attend_cached``) and the
maximum logits apply it in their own masks.

**Precision.** ``jax.nn.dot_product_attention`` takes no ``precision=``; its matmuls are traced under
``jax.default_matmul_precision(matmul_precision)``, which is the same request.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Literal

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name
from jax.typing import DTypeLike

from dew.models.axes import constrain, param
from dew.models.kv_cache import attend_cached, write
from dew.models.precision import LAX_PRECISION, Precision

if TYPE_CHECKING:
    from dew.models.rope_scaling import RopeScaling

logger = logging.getLogger(__name__)
_logged: set[tuple[str, str]] = set()


# -------------------------------------------------------------------------------------- kernel choice


def cudnn_obstacles(dtype: DTypeLike, head_dim: int) -> list[str]:
    """Why cuDNN flash attention cannot run for ``dtype`` and ``head_dim`` here; empty when it can."""
    obstacles = []
    device = jax.devices()[0]
    capability = getattr(device, "compute_capability", None)
    if jax.default_backend() != "gpu" or capability is None:
        obstacles.append(f"the backend is {jax.default_backend()!r}, not a CUDA GPU")
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        obstacles.append(f"dtype is {jnp.dtype(dtype).name}, and cuDNN takes bfloat16 or float16")
    hopper = capability is not None and float(capability) >= 9.0
    most = 256 if hopper else 128
    if head_dim % 8 or head_dim > most:
        obstacles.append(f"head_dim={head_dim} is not a multiple of 8 at most {most}")
    return obstacles


def mup_scale(head_dim: int, width_multiplier: float, base_head_dim: int | None) -> float:
    """muP's attention scale ``sqrt(base)/head_dim``, ``base`` the head_dim at the base width:
    ``base_head_dim``, unset ``head_dim / width_multiplier`` (the heads' width grows with the model).
    muP scales by ``1/head_dim`` because trained queries and keys correlate, so their dot product
    grows with head_dim rather than its square root; measured from the base, the scale is the
    standard ``1/sqrt(head_dim)`` there, as every other muP multiplier is (docs/mup.md)."""
    base = base_head_dim if base_head_dim is not None else head_dim / width_multiplier
    if base == head_dim:  # the standard scale, to the last bit
        return 1.0 / math.sqrt(head_dim)
    return math.sqrt(base) / head_dim


def choose_implementation(impl: str, dtype: DTypeLike, head_dim: int) -> Literal["xla", "cudnn"]:
    """Resolve ``attention_impl`` (``auto``, ``xla``, ``cudnn``) to the kernel that will run."""
    if impl == "xla":
        return "xla"
    obstacles = cudnn_obstacles(dtype, head_dim)
    if impl == "cudnn":
        if obstacles:
            raise ValueError(
                f"attention_impl='cudnn' cannot run: {'; '.join(obstacles)}. "
                "Use attention_impl='auto' (cudnn where it can run, xla elsewhere) or 'xla'."
            )
        return "cudnn"
    if impl != "auto":
        raise ValueError(f"attention_impl={impl!r}; known: auto, cudnn, xla")
    chosen: Literal["xla", "cudnn"]
    chosen, why = ("xla", "; ".join(obstacles)) if obstacles else ("cudnn", "cuDNN supports this shape")
    if (chosen, why) not in _logged:
        _logged.add((chosen, why))
        logger.info("attention_impl=auto chose %s (%s)", chosen, why)
    return chosen


# ------------------------------------------------------------------------------------------- the math


def same_document(segment_ids_BxT: jax.Array) -> jax.Array:
    """Boolean ``(B, 1, T, T)``: query ``t`` and key ``s`` belong to one document (one segment id)."""
    return (segment_ids_BxT[:, :, None] == segment_ids_BxT[:, None, :])[:, None]


def max_logits(
    q_BxTxNxH: jax.Array,
    k_BxSxKxH: jax.Array,
    *,
    scale: float,
    causal: bool = False,
    kv_lengths: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    window: int | None = None,
    matmul_precision: str = "default",
) -> jax.Array:
    """The largest pre-softmax logit of each query head over the batch and the unmasked pairs.

    Float32 of shape ``(N,)``, outside the gradient.
    """
    q, k = jax.lax.stop_gradient(q_BxTxNxH), jax.lax.stop_gradient(k_BxSxKxH)
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    q_BxTxKxGxH = q.reshape(B, T, K, N // K, H)
    logits_BxKxGxTxS = (
        jnp.einsum(
            "btkgh,bskh->bkgts",
            q_BxTxKxGxH,
            k,
            preferred_element_type=jnp.float32,
            precision=LAX_PRECISION[matmul_precision],
        )
        * scale
    )
    allowed_BxTxS = jnp.ones((B, T, S), bool)
    if causal:
        allowed_BxTxS &= jnp.tril(jnp.ones((T, S), bool))[None]
    if window is not None:
        allowed_BxTxS &= jnp.triu(jnp.ones((T, S), bool), 1 - window)[None]
    if kv_lengths is not None:
        allowed_BxTxS &= (jnp.arange(S)[None, :] < kv_lengths[:, None])[:, None, :]
    if segment_ids is not None:  # within a document, padding (segment 0) left out
        allowed_BxTxS &= same_document(segment_ids)[:, 0] & (segment_ids != 0)[:, :, None]
    logits_BxKxGxTxS = jnp.where(allowed_BxTxS[:, None, None], logits_BxKxGxTxS, -jnp.inf)
    return logits_BxKxGxTxS.max(axis=(0, 3, 4)).reshape(N)


def attend(
    q_BxTxNxH: jax.Array,
    k_BxSxKxH: jax.Array,
    v_BxSxKxH: jax.Array,
    *,
    scale: float,
    causal: bool = False,
    kv_lengths: jax.Array | None = None,
    segment_ids: jax.Array | None = None,
    window: int | None = None,
    impl: str = "auto",
    matmul_precision: str = "default",
) -> jax.Array:
    """``softmax(scale · QKᵀ + mask) V`` per head with the kernel ``impl`` resolves to.

    ``kv_lengths`` (int32, ``(B,)``) marks each sequence's valid keys ``[0, length)`` (right padding);
    ``segment_ids`` (int, ``(B, T)``, self-attention) keeps each query within its document;
    ``window`` (with ``causal``) keeps it to the ``window`` latest positions, its own included.
    """
    implementation = choose_implementation(impl, q_BxTxNxH.dtype, q_BxTxNxH.shape[-1])
    with jax.default_matmul_precision(matmul_precision):
        # "context" is what remat="minimal_with_context" keeps for the backward pass (dew.models.stack).
        return checkpoint_name(
            jax.nn.dot_product_attention(
                q_BxTxNxH,
                k_BxSxKxH,
                v_BxSxKxH,
                scale=scale,
                mask=None if segment_ids is None else same_document(segment_ids),
                is_causal=causal,
                key_value_seq_lengths=None if kv_lengths is None else kv_lengths.astype(jnp.int32),
                local_window_size=None if window is None else (window - 1, 0),
                implementation=implementation,
            ),
            "context",
        )


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> jax.Array:
    """The rotary embedding's angular frequencies, ``(head_dim // 2,)`` float32: ``theta**(-2i/head_dim)``,
    rescaled as ``scaling`` says (``dew.models.rope_scaling.RopeScaling``), in the order of operations
    Hugging Face's ``ROPE_INIT_FUNCTIONS`` use, so a Llama checkpoint rotates as transformers rotates it.

    ``llama3`` (Llama 3.1's ``apply_scaling``): with ``L = original_max_position_embeddings``, a
    frequency whose wavelength ``2π/f`` is above ``L / low_freq_factor`` is divided by ``factor``, one
    below ``L / high_freq_factor`` is kept, and one between is ``(1 - s)·f/factor + s·f`` with
    ``s = (L/wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)``."""
    inv_freq = 1.0 / theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    if scaling is None:
        return inv_freq
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old_context = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelength > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= old_context / high) & (wavelength <= old_context / low)
    return jnp.where(medium, smoothed, scaled)


def rope_tables(
    positions_T: jax.Array, head_dim: int, theta: float, scaling: RopeScaling | None = None
) -> tuple[jax.Array, jax.Array]:
    """Sine and cosine of rotary position embeddings (Su et al. 2021), ``(T, head_dim // 2)`` each,
    at the frequencies ``rope_frequencies`` gives; ``(B, T, head_dim // 2)`` for positions ``(B, T)``
    (packed documents, each counting from 0)."""
    inv_freq = rope_frequencies(head_dim, theta, scaling)
    angles_xH2 = positions_T.astype(jnp.float32)[..., None] * inv_freq
    return jnp.sin(angles_xH2), jnp.cos(angles_xH2)


def apply_rope(x_BxTxNxH: jax.Array, sin_cos: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Rotate each (first half, second half) pair of features by its position's angle (float32); the
    tables are ``(T, head_dim // 2)``, shared by the batch, or ``(B, T, head_dim // 2)``."""
    sin, cos = (a[None, :, None, :] if a.ndim == 2 else a[:, :, None, :] for a in sin_cos)
    x1, x2 = jnp.split(x_BxTxNxH.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x_BxTxNxH.dtype)


# ----------------------------------------------------------------------------------------- the layer


class Attention(nnx.Module):
    """Multi-head (or grouped-query) self-attention with optional QK-norm and rotary embeddings."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        *,
        precision: Precision,
        rngs: nnx.Rngs,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        use_bias: bool = True,
        out_bias: bool | None = None,
        qk_norm: bool = False,
        window: int | None = None,
        norm_eps: float = 1e-6,
        scale: float | None = None,
        impl: str = "auto",
        kernel_init: nnx.Initializer = nnx.initializers.xavier_uniform(),  # noqa: B008 - a pure function, shared safely
        out_init: nnx.Initializer | None = None,
    ) -> None:
        num_kv_heads = num_kv_heads or num_heads
        head_dim = head_dim or hidden_size // num_heads
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
        self.impl, self.matmul_precision, self.window = impl, precision.matmul, window
        kw = dict(use_bias=use_bias, rngs=rngs, **precision.linear_kwargs)
        # Megatron's split: q, k, v by heads (column parallel), o by heads (row parallel).
        zeros = nnx.initializers.zeros_init()
        self.q = nnx.LinearGeneral(
            hidden_size,
            (num_heads, head_dim),
            **kw,
            kernel_init=param(kernel_init, "embed", "heads", "kv"),
            bias_init=param(zeros, "heads", "kv"),
        )
        self.k = nnx.LinearGeneral(
            hidden_size,
            (num_kv_heads, head_dim),
            **kw,
            kernel_init=param(kernel_init, "embed", "kv_heads", "kv"),
            bias_init=param(zeros, "kv_heads", "kv"),
        )
        self.v = nnx.LinearGeneral(
            hidden_size,
            (num_kv_heads, head_dim),
            **kw,
            kernel_init=param(kernel_init, "embed", "kv_heads", "kv"),
            bias_init=param(zeros, "kv_heads", "kv"),
        )
        self.o = nnx.LinearGeneral(
            (num_heads, head_dim),
            hidden_size,
            axis=(-2, -1),
            **(kw | {"use_bias": use_bias if out_bias is None else out_bias}),
            kernel_init=param(out_init or kernel_init, "heads", "kv", "embed"),
            bias_init=param(zeros, "embed"),
        )
        if qk_norm:
            norm = dict(
                epsilon=norm_eps, rngs=rngs, scale_init=param(nnx.initializers.ones_init(), "kv"), **precision.dtypes
            )
            self.q_norm: nnx.RMSNorm | None = nnx.RMSNorm(head_dim, **norm)
            self.k_norm: nnx.RMSNorm | None = nnx.RMSNorm(head_dim, **norm)
        else:
            self.q_norm = self.k_norm = None

    def __call__(
        self,
        x_BxTxD: jax.Array,
        *,
        causal: bool = False,
        rope: tuple[jax.Array, jax.Array] | None = None,
        kv_lengths: jax.Array | None = None,
        segment_ids: jax.Array | None = None,
        return_max_logits: bool = False,
    ) -> jax.Array | tuple[jax.Array, jax.Array]:
        q_BxTxNxH = constrain(self.q(x_BxTxD), "batch", "length", "heads", "kv")
        k_BxTxKxH = constrain(self.k(x_BxTxD), "batch", "length", "kv_heads", "kv")
        v_BxTxKxH = constrain(self.v(x_BxTxD), "batch", "length", "kv_heads", "kv")
        if self.q_norm is not None and self.k_norm is not None:  # both or neither (qk_norm)
            q_BxTxNxH, k_BxTxKxH = self.q_norm(q_BxTxNxH), self.k_norm(k_BxTxKxH)
        if rope is not None:
            q_BxTxNxH, k_BxTxKxH = apply_rope(q_BxTxNxH, rope), apply_rope(k_BxTxKxH, rope)
        out_BxTxNxH = attend(
            q_BxTxNxH,
            k_BxTxKxH,
            v_BxTxKxH,
            scale=self.scale,
            causal=causal,
            kv_lengths=kv_lengths,
            segment_ids=segment_ids,
            window=self.window if causal else None,
            impl=self.impl,
            matmul_precision=self.matmul_precision,
        )
        out_BxTxNxH = constrain(out_BxTxNxH, "batch", "length", "heads", "kv")
        out_BxTxD = constrain(self.o(out_BxTxNxH), "batch", "length", "embed")
        if not return_max_logits:
            return out_BxTxD
        return out_BxTxD, max_logits(
            q_BxTxNxH,
            k_BxTxKxH,
            scale=self.scale,
            causal=causal,
            kv_lengths=kv_lengths,
            segment_ids=segment_ids,
            window=self.window if causal else None,
            matmul_precision=self.matmul_precision,
        )

    def extend(
        self,
        x_BxTxD: jax.Array,
        kv: tuple[jax.Array, jax.Array],
        *,
        start: jax.Array,
        rope: tuple[jax.Array, jax.Array] | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """Causal attention of ``T`` new tokens at positions ``[start, start + T)`` over a key/value
        cache (``dew.models.kv_cache``): their keys and values are written into ``kv`` (each
        ``(B, size, num_kv_heads, head_dim)``) and every query attends to the positions up to its own.
        ``rope`` holds the tables of those ``T`` positions. Returns the output and the updated cache."""
        q_BxTxNxH, k_BxTxKxH, v_BxTxKxH = self.q(x_BxTxD), self.k(x_BxTxD), self.v(x_BxTxD)
        if self.q_norm is not None and self.k_norm is not None:  # both or neither (qk_norm)
            q_BxTxNxH, k_BxTxKxH = self.q_norm(q_BxTxNxH), self.k_norm(k_BxTxKxH)
        if rope is not None:
            q_BxTxNxH, k_BxTxKxH = apply_rope(q_BxTxNxH, rope), apply_rope(k_BxTxKxH, rope)
        k_BxSxKxH, v_BxSxKxH = write(kv[0], k_BxTxKxH, start), write(kv[1], v_BxTxKxH, start)
        out_BxTxNxH = attend_cached(
            q_BxTxNxH,
            k_BxSxKxH,
            v_BxSxKxH,
            start=start,
            scale=self.scale,
            window=self.window,
            matmul_precision=self.matmul_precision,
        )
        return self.o(out_BxTxNxH), (k_BxSxKxH, v_BxSxKxH)
