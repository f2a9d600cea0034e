"""What the token objectives share: shaping logits before a draw, and samples as text."""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from dew.data.tokenizer import from_record


def shape_logits(logits_BxLxV: jax.Array, temperature: float | jax.Array, top_k: int) -> jax.Array:
    """Logits divided by ``temperature``, with every token outside the ``top_k`` most likely at
    -inf (``top_k`` 0 keeps them all); float32."""
    logits = logits_BxLxV.astype(jnp.float32) / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return logits


def decode(ids_NxL: np.ndarray, tokenizer: Mapping[str, object] | None) -> list[str]:
    """Each sequence as text, with the tokenizer the dataset recorded; without one (the vocabulary
    came from ``data.vocab_size`` alone), the ids separated by spaces."""
    if tokenizer is None:
        return [" ".join(str(int(i)) for i in row) for row in ids_NxL]
    tok = from_record(tokenizer)
    return [tok.decode([int(i) for i in row]) for row in np.asarray(ids_NxL)]
