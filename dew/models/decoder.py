"""The layers of ``transformer`` (``dew.models.transformer``): a decoder-only causal language model in the style
current LM trainers use.

``model(tokens) -> logits``: ``tokens`` int ``(B, L)`` with ``L <= seq_len``, ``logits``
``(B, L, vocab_size)`` in the compute dtype (objectives upcast to float32 for the loss).
``model(tokens, return_max_logits=True) -> (logits, max_logits)``, ``max_logits`` float32
``(depth, num_heads)``: each block's largest pre-softmax attention logit per query head over the batch
and the causal pairs, outside the gradient (``dew.models.attention``), for MuonClip's QK-clip.
``model(tokens, segment_ids=..., positions=...)`` runs documents packed into each row (both int
``(B, L)``, from the data's ``segment_ids`` and ``positions``, docs/data.md): attention stays within
a document (segment id; 0 is padding) and each document's rotary positions count from 0, so a
document's logits are the ones it has run alone.
``model.extend(tokens, cache) -> (logits, cache)`` runs new tokens against a key/value cache from
``model.init_cache(batch, size)`` (``dew.models.kv_cache``): the prompt in one call, then one token per
call, with the logits ``model(all tokens so far)`` gives at the same positions.

Each block is pre-norm: ``x + r · Attention(RMSNorm(x))`` then ``x + r · SwiGLU(RMSNorm(x))``, with
rotary position embeddings on queries and keys, optional QK-norm (RMSNorm over each head's features,
before RoPE; Qwen3's), grouped-query attention (``num_kv_heads``), optional biases on the query, key
and value projections (``qkv_bias``; Qwen2's), an optional sliding window (``sliding_window``;
Mistral's) and an optional tied output head.

**muP (lm-engine's multipliers).** With ``mup``, the width multiplier is
``m = hidden_size / mup_base_width``: logits are divided by ``m``, attention is scaled by
``sqrt(b)/head_dim`` instead of ``1/sqrt(head_dim)`` (``b`` the head_dim at the base width,
``mup_base_head_dim``; ``attention_scale``), and hidden matrices are initialised with
standard deviation ``init_std / sqrt(m)``: at the base width every multiplier is the standard
model's. ``embedding_multiplier`` scales the token embedding's output and
``residual_multiplier`` (``r``) each branch before it joins the residual stream, with or without muP.
Output projections (``attn/o``, ``mlp_down``) are further divided by ``sqrt(2 · depth)`` (GPT-2).
The matching per-group learning rates are the optimizer's (``dew.training.optim.build.mup_param_groups``).

**Parameters** (``blocks`` stacked on a leading ``depth`` axis, ``dew.models.stack``):
``embed/embedding`` ``(vocab, hidden)``; ``blocks/attn_norm/scale``; ``blocks/attn/q/kernel``
``(depth, hidden, num_heads, head_dim)``; ``blocks/attn/k/kernel`` and ``blocks/attn/v/kernel``
``(depth, hidden, num_kv_heads, head_dim)`` (query head ``n`` reads key head
``n // (num_heads // num_kv_heads)``); ``blocks/attn/o/kernel`` ``(depth, num_heads, head_dim, hidden)``;
with QK-norm ``blocks/attn/q_norm/scale`` and ``blocks/attn/k_norm/scale`` ``(depth, head_dim)``;
with ``qkv_bias`` ``blocks/attn/q/bias`` ``(depth, num_heads, head_dim)``, ``blocks/attn/k/bias`` and
``blocks/attn/v/bias`` ``(depth, num_kv_heads, head_dim)``;
``blocks/mlp_norm/scale``; ``blocks/mlp_gate/kernel``, ``blocks/mlp_up/kernel``
``(depth, hidden, mlp_hidden)``; ``blocks/mlp_down/kernel`` ``(depth, mlp_hidden, hidden)``;
``final_norm/scale``; ``lm_head/kernel`` ``(hidden, vocab)`` unless the embeddings are tied. No
other biases.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from flax import nnx

from dew.models import stack
from dew.models.attention import Attention, mup_scale, rope_tables
from dew.models.axes import constrain, param
from dew.models.kv_cache import KVCache
from dew.models.precision import Precision

if TYPE_CHECKING:
    from dew.models.transformer_fields import TransformerFields


def head_dim(f: TransformerFields) -> int:
    return f.head_dim or f.hidden_size // f.num_heads


def mlp_hidden(f: TransformerFields) -> int:
    """The SwiGLU width: ``mlp_hidden``, or 8/3 · hidden_size rounded up to a multiple of 128."""
    return f.mlp_hidden or 128 * math.ceil(8 * f.hidden_size / 3 / 128)


def width_multiplier(f: TransformerFields) -> float:
    """muP's ``m``; ``Transformer.mup_width_multiplier`` (``dew.models.transformer``) gives the
    optimizer's groups the same number."""
    return f.hidden_size / f.mup_base_width if f.mup else 1.0


def attention_scale(f: TransformerFields) -> float:
    """The attention logits' scale: ``1/sqrt(head_dim)``, and under muP ``sqrt(base)/head_dim``
    with ``base`` the head_dim at the base width (``mup_base_head_dim``). muP scales by
    ``1/head_dim`` because trained queries and keys correlate, so their dot product grows with
    head_dim rather than its square root; measured from the base, the scale equals the standard one
    there, as every other muP multiplier does. Plain ``1/head_dim`` is ``sqrt(head_dim)`` times
    cooler than the standard model at every width, the base included (docs/mup.md)."""
    head = head_dim(f)
    if not f.mup:
        return 1.0 / head**0.5
    return mup_scale(head, width_multiplier(f), f.mup_base_head_dim)


class DecoderBlock(nnx.Module):
    """Pre-norm causal self-attention and SwiGLU MLP."""

    def __init__(self, f: TransformerFields, precision: Precision, rngs: nnx.Rngs):
        D, H = f.hidden_size, mlp_hidden(f)
        std = f.init_std / math.sqrt(width_multiplier(f))
        init = nnx.initializers.normal(std)
        out_init = nnx.initializers.normal(std / math.sqrt(2 * f.depth))
        norm = dict(
            epsilon=f.norm_eps, rngs=rngs, scale_init=param(nnx.initializers.ones_init(), "embed"), **precision.dtypes
        )
        self.attn_norm = nnx.RMSNorm(D, **norm)
        self.attn = Attention(
            D,
            f.num_heads,
            num_kv_heads=f.num_kv_heads,
            head_dim=head_dim(f),
            use_bias=f.qkv_bias,
            out_bias=False,
            qk_norm=f.qk_norm,
            window=f.sliding_window,
            norm_eps=f.norm_eps,
            scale=attention_scale(f),
            impl=f.attention_impl,
            precision=precision,
            kernel_init=init,
            out_init=out_init,
            rngs=rngs,
        )
        self.mlp_norm = nnx.RMSNorm(D, **norm)
        linear = dict(use_bias=False, rngs=rngs, **precision.linear_kwargs)
        # Megatron's MLP split: gate and up by the hidden width (column parallel), down by it (row).
        self.mlp_gate = nnx.Linear(D, H, kernel_init=param(init, "embed", "mlp"), **linear)
        self.mlp_up = nnx.Linear(D, H, kernel_init=param(init, "embed", "mlp"), **linear)
        self.mlp_down = nnx.Linear(H, D, kernel_init=param(out_init, "mlp", "embed"), **linear)
        self.residual_multiplier = f.residual_multiplier

    def __call__(
        self,
        x_BxTxD: jax.Array,
        rope: tuple[jax.Array, jax.Array],
        return_max_logits: bool,
        segment_ids_BxT: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array | None]:
        r = self.residual_multiplier
        attn = self.attn(
            self.attn_norm(x_BxTxD),
            causal=True,
            rope=rope,
            segment_ids=segment_ids_BxT,
            return_max_logits=return_max_logits,
        )
        attn_BxTxD, max_logits_N = attn if isinstance(attn, tuple) else (attn, None)  # a pair when asked for
        x_BxTxD = constrain(x_BxTxD + r * attn_BxTxD, "batch", "length", "embed")
        h_BxTxD = self.mlp_norm(x_BxTxD)
        hidden_BxTxH = constrain(jax.nn.silu(self.mlp_gate(h_BxTxD)) * self.mlp_up(h_BxTxD), "batch", "length", "mlp")
        mlp_BxTxD = self.mlp_down(hidden_BxTxH)
        return constrain(x_BxTxD + r * mlp_BxTxD, "batch", "length", "embed"), max_logits_N

    def extend(
        self, x_BxTxD: jax.Array, rope: tuple[jax.Array, jax.Array], kv: tuple[jax.Array, jax.Array], start: jax.Array
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        """The block over ``T`` new positions from ``start`` with this block's key/value cache ``kv``."""
        r = self.residual_multiplier
        attn_BxTxD, kv = self.attn.extend(self.attn_norm(x_BxTxD), kv, start=start, rope=rope)
        x_BxTxD = x_BxTxD + r * attn_BxTxD
        h_BxTxD = self.mlp_norm(x_BxTxD)
        mlp_BxTxD = self.mlp_down(jax.nn.silu(self.mlp_gate(h_BxTxD)) * self.mlp_up(h_BxTxD))
        return x_BxTxD + r * mlp_BxTxD, kv


class Transformer(nnx.Module):
    """Token embedding, a stack of decoder blocks, final RMSNorm and the output head."""

    def __init__(self, f: TransformerFields, rngs: nnx.Rngs):
        self.fields = f
        precision = Precision.of(f)
        self.precision = precision
        self.embed = nnx.Embed(
            f.vocab_size,
            f.hidden_size,
            rngs=rngs,
            **precision.dtypes,
            embedding_init=param(nnx.initializers.normal(f.init_std), "vocab", "embed"),
        )
        self.blocks = stack.stack(lambda r: DecoderBlock(f, precision, r), f.depth, rngs)
        self.final_norm = nnx.RMSNorm(
            f.hidden_size,
            epsilon=f.norm_eps,
            rngs=rngs,
            **precision.dtypes,
            scale_init=param(nnx.initializers.ones_init(), "embed"),
        )
        self.lm_head = (
            None
            if f.tie_embeddings
            else nnx.Linear(
                f.hidden_size,
                f.vocab_size,
                use_bias=False,
                rngs=rngs,
                **precision.linear_kwargs,
                kernel_init=param(nnx.initializers.normal(f.init_std), "embed", "vocab"),
            )
        )

    def __call__(
        self,
        tokens_BxT: jax.Array,
        *,
        segment_ids: jax.Array | None = None,
        positions: jax.Array | None = None,
        return_max_logits: bool = False,
    ) -> Any:
        f, p = self.fields, self.precision
        if tokens_BxT.ndim != 2 or tokens_BxT.shape[1] > f.seq_len:
            raise ValueError(
                f"transformer takes (batch, length <= seq_len={f.seq_len}) token ids, got shape {tokens_BxT.shape}"
            )
        for name, given in (("segment_ids", segment_ids), ("positions", positions)):
            if given is not None and given.shape != tokens_BxT.shape:
                raise ValueError(f"transformer: {name} of shape {given.shape}, the tokens' is {tokens_BxT.shape}")
        x_BxTxD = self.embed(tokens_BxT) * jnp.asarray(f.embedding_multiplier, p.dtype)
        x_BxTxD = constrain(x_BxTxD, "batch", "length", "embed")
        positions_T = jnp.arange(tokens_BxT.shape[1]) if positions is None else positions
        rope = rope_tables(positions_T, head_dim(f), f.rope_theta, f.rope_scaling)

        x_BxTxD, max_logits_LxN = stack.run(
            self.blocks,
            lambda block, x: block(x, rope, return_max_logits, segment_ids),
            x_BxTxD,
            scan=f.scan_layers,
            remat=f.remat,
        )

        logits_BxTxV = self.head(x_BxTxD)
        return (logits_BxTxV, max_logits_LxN) if return_max_logits else logits_BxTxV

    def head(self, x_BxTxD: jax.Array) -> jax.Array:
        """The residual stream's logits: the final norm, the output projection (or the tied
        embedding) and muP's logit multiplier."""
        f, p = self.fields, self.precision
        x_BxTxD = self.final_norm(x_BxTxD)
        if self.lm_head is None:
            table_VxD = self.embed.embedding[...].astype(p.dtype)
            logits_BxTxV = jnp.einsum("btd,vd->btv", x_BxTxD, table_VxD, precision=p.lax)
        else:
            logits_BxTxV = self.lm_head(x_BxTxD)
        logits_BxTxV = constrain(logits_BxTxV, "batch", "length", "vocab")
        if f.mup:
            logits_BxTxV = logits_BxTxV / jnp.asarray(width_multiplier(f), p.dtype)
        return logits_BxTxV

    # ------------------------------------------------------------------------- cached decoding

    def init_cache(self, batch: int, size: int | None = None) -> KVCache:
        """An empty key/value cache of ``size`` positions (default and at most ``seq_len``: the
        positions the model was trained at) for ``batch`` sequences."""
        f = self.fields
        size = f.seq_len if size is None else size
        if not 0 < size <= f.seq_len:
            raise ValueError(f"a key/value cache of {size} positions: it holds 1 to seq_len={f.seq_len}")
        return KVCache.zeros(f.depth, batch, size, f.num_kv_heads or f.num_heads, head_dim(f), self.precision.dtype)

    def extend(self, tokens_BxT: jax.Array, cache: KVCache, *, last_only: bool = False) -> tuple[jax.Array, KVCache]:
        """Run ``T`` new tokens at positions ``[cache.length, cache.length + T)`` against ``cache``:
        the whole prompt in one call (prefill), then one token per call. Returns their logits
        (only the last position's with ``last_only``, ``(B, 1, V)``) and the cache holding them.

        The logits equal ``model(all tokens so far)``'s at the same positions. The caller keeps
        ``cache.length + T <= cache.size`` (the length is traced, so it cannot be checked here).
        """
        f, p = self.fields, self.precision
        if tokens_BxT.ndim != 2 or tokens_BxT.shape[1] > cache.size:
            raise ValueError(
                f"transformer.extend takes (batch, length <= cache size {cache.size}) token "
                f"ids, got shape {tokens_BxT.shape}"
            )
        start = cache.length
        x_BxTxD = self.embed(tokens_BxT) * jnp.asarray(f.embedding_multiplier, p.dtype)
        rope = rope_tables(start + jnp.arange(tokens_BxT.shape[1]), head_dim(f), f.rope_theta, f.rope_scaling)

        x_BxTxD, (k, v) = stack.run_with(
            self.blocks,
            lambda block, x, kv: block.extend(x, rope, kv, start),
            x_BxTxD,
            (cache.k, cache.v),
            scan=f.scan_layers,
        )

        if last_only:
            x_BxTxD = x_BxTxD[:, -1:]
        return self.head(x_BxTxD), KVCache(k, v, start + tokens_BxT.shape[1])
