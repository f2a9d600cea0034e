"""The key/value cache of causal self-attention, for decoding one token per model call.

Without a cache, drawing token ``i`` runs the model over every earlier token again: the keys and
values of the prefix are recomputed at each step, so a sequence costs a quadratic number of token
forwards. With it, each call runs only the new tokens (the whole prompt at once, then one token),
writes their keys and values into a preallocated buffer and attends over the buffer.

The cache is explicit arrays passed in and returned (a pytree), not mutable module state: the
blocks' parameters are stacked on a leading ``depth`` axis and scanned (``dew.models.stack``), and
the cache is stacked the same way, so one ``jax.lax.scan`` hands each block its parameters and its
layer of the cache. Shapes are static whatever the position, so a decoding loop compiles once:

- ``k``, ``v``: ``(depth, batch, size, num_kv_heads, head_dim)`` in the compute dtype; key/value
  heads, not query heads, so grouped-query attention caches ``num_kv_heads / num_heads`` of what
  multi-head attention would;
- ``length``: int32 scalar, the positions ``[0, length)`` that hold keys and values. The next token
  goes to position ``length``, and its rotary embedding is that position's.

A position ``s`` of the buffer is attended from the query at position ``p`` when ``s <= p``: the
causal mask over the valid positions, so the zeros beyond ``length`` never take part.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class KVCache(NamedTuple):
    """Every block's keys and values so far, and how many positions hold them."""

    k: jax.Array
    """``(depth, batch, size, num_kv_heads, head_dim)``."""
    v: jax.Array
    """``(depth, batch, size, num_kv_heads, head_dim)``."""
    length: jax.Array
    """int32 scalar: positions ``[0, length)`` are filled."""

    @classmethod
    def zeros(cls, depth: int, batch: int, size: int, num_kv_heads: int, head_dim: int, dtype: jnp.dtype) -> KVCache:
        shape = (depth, batch, size, num_kv_heads, head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((), jnp.int32))

    @property
    def size(self) -> int:
        """Positions the buffer holds (static)."""
        return self.k.shape[2]


def write(cache_BxSxKxH: jax.Array, new_BxTxKxH: jax.Array, start: jax.Array) -> jax.Array:
    """``cache`` with positions ``[start, start + T)`` replaced by ``new``."""
    return jax.lax.dynamic_update_slice_in_dim(cache_BxSxKxH, new_BxTxKxH.astype(cache_BxSxKxH.dtype), start, axis=1)


def attend_cached(
    q_BxTxNxH: jax.Array,
    k_BxSxKxH: jax.Array,
    v_BxSxKxH: jax.Array,
    *,
    start: jax.Array,
    scale: float,
    window: int | None = None,
    matmul_precision: str = "default",
) -> jax.Array:
    """Attention of the queries at positions ``[start, start + T)`` over the cache's positions up to
    each query's own (and, with a sliding ``window``, no further back than ``window - 1`` before it).

    Always the xla kernel: the mask is an explicit ``(T, S)`` array (each query sees a different
    prefix of the buffer), which cuDNN's fused kernel does not take, and a one-token step reads the
    whole cache once, which is memory-bound whichever kernel runs it.
    """
    T, S = q_BxTxNxH.shape[1], k_BxSxKxH.shape[1]
    query_T1, key_1S = start + jnp.arange(T)[:, None], jnp.arange(S)[None, :]
    allowed_TxS = key_1S <= query_T1
    if window is not None:
        allowed_TxS &= key_1S > query_T1 - window
    with jax.default_matmul_precision(matmul_precision):
        return jax.nn.dot_product_attention(
            q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask=allowed_TxS[None, None], scale=scale, implementation="xla"
        )
