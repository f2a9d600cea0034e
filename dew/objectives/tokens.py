"""What the token objectives share: a batch's next-token inputs and weights, shaping logits before a
draw, and samples as text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dew.data.tokenizer import from_record


def target_weights[A: (np.ndarray, jax.Array)](batch: Mapping[str, A]) -> A:
    """Each target's weight in the loss, ``(B, L)`` float32 0 or 1, of a batch of ``tokens`` ``(B, L + 1)``
    (``next_token_inputs`` says which count). NumPy arrays in, NumPy out (what dew-eval counts bytes
    over, on the host); JAX arrays in, JAX out."""
    xp: Any = np if isinstance(batch["tokens"], np.ndarray) else jnp
    weight = xp.ones(batch["tokens"][:, 1:].shape, xp.float32)
    if "segment_ids" in batch:
        seg = batch["segment_ids"].astype(xp.int32)
        weight = weight * ((seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)).astype(xp.float32)
    if "loss_mask" in batch:
        weight = weight * batch["loss_mask"][:, 1:].astype(xp.float32)
    return weight


def next_token_inputs(batch: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array, dict[str, Any]]:
    """``(inputs_BxL, targets_BxL, weight_BxL, model keywords)`` of a batch of ``tokens`` ``(B, L + 1)``:
    the inputs ``tokens[:, :-1]``, the targets ``tokens[:, 1:]``, and each target's weight in the
    loss (float32, 0 or 1), from the batch's optional fields (docs/data.md):

    - ``segment_ids`` ``(B, L + 1)`` (packed documents; 0 is padding): a target counts only inside
      the document of its input, so neither padding nor the first token of the next document
      predicted from the last of the one before is trained (a document run alone has no such
      target); the model gets ``segment_ids`` and ``positions`` of the inputs;
    - ``loss_mask`` ``(B, L + 1)``: token ``i`` counts as a target only where it is 1 (a chat's
      response tokens, not its prompt's).
    """
    tokens = batch["tokens"].astype(jnp.int32)
    inputs_BxL, targets_BxL = tokens[:, :-1], tokens[:, 1:]
    kwargs: dict[str, Any] = {}
    if "segment_ids" in batch:
        kwargs["segment_ids"] = batch["segment_ids"][:, :-1].astype(jnp.int32)
    if "positions" in batch:
        kwargs["positions"] = batch["positions"][:, :-1].astype(jnp.int32)
    return inputs_BxL, targets_BxL, target_weights(batch), kwargs


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
