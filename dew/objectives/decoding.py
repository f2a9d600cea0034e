"""Autoregressive decoding of a causal language model: a prompt, then one token drawn at a time.

**With the key/value cache** (the default): the prompt but its last token runs through the model in
one call (``model.extend``, prefill), then each step runs the single newest token against the cache
(``dew.models.kv_cache``), starting with the prompt's last: a step costs one token's forward plus
reading the cache, not a forward of the whole prefix. (Feeding the prompt's last token as a step
means a one-token prompt, the default start id, compiles no prefill at all: compiling dominates a
short sample.) **Without** (``cached=False``), each step runs the model over the sequence so far
(the window below, padded to a fixed length so the loop compiles once); it is the reference the
cache is tested and benchmarked against.

**Beyond the trained context.** The model was trained on windows of ``seq_len`` tokens at positions
``0 .. seq_len - 1``, each window a slice of the token stream that starts anywhere in a document. A
sequence longer than ``seq_len`` is therefore decoded over a window that jumps: once the window is
full, its last ``keep = seq_len // 2`` tokens are run again from position 0 (one prefill) and
decoding continues after them. Every token is thus drawn from the model's output on a window of
``keep + 1`` to ``seq_len`` real tokens at positions from 0, exactly the computation training
optimised. A cache rolled one position per token (StreamingLLM-style) would be cheaper, but its keys
and values were computed with context the window no longer holds, and its queries would sit at
positions the model never saw; neither happens in training. The price is one prefill of ``keep``
tokens per ``seq_len - keep`` new tokens. The context start of the token at index ``i`` is
``context_start(i, window)``; both paths use it, so they draw the same tokens.

Token ``j`` is drawn with the key ``fold_in(key, j)`` (``j`` its index in the sequence), from the
logits shaped by temperature and top-k: the same seed gives the same samples. Only the data's ids
are drawn: a model whose vocabulary is padded past the data's (``vocab`` < its rows, as Qwen2.5's
151,936 rows for 151,665 tokens) has logits for ids no tokenizer decodes, which are left out.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dew.objectives.tokens import shape_logits


def keep_of(window: int) -> int:
    """Tokens a full window keeps when it moves on (at least 1)."""
    return max(window // 2, 1)


def context_start(i: jax.Array | int, window: int) -> jax.Array | int:
    """The index of the first token the model sees when it is fed the token at index ``i``: 0 while
    the sequence fits the window, then ``keep`` tokens before ``i`` at each move, every
    ``window - keep`` tokens."""
    keep = keep_of(window)
    stride = window - keep
    moved = window - keep + (i - window) // stride * stride
    return jnp.where(i < window, 0, moved) if isinstance(i, jax.Array) else (0 if i < window else moved)


@functools.partial(jax.jit, static_argnames=("graphdef", "new", "window", "top_k", "cached", "vocab"))
def generate(
    graphdef: nnx.GraphDef,
    state: nnx.State,
    prompt_BxP: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    *,
    new: int,
    window: int,
    top_k: int,
    cached: bool,
    vocab: int | None = None,
) -> jax.Array:
    """The prompt followed by ``new`` drawn tokens, ``(B, P + new)`` int32, from the model
    ``nnx.merge(graphdef, state)`` whose context is ``window`` tokens, each among the ids below
    ``vocab`` (None: every row of the logits).

    Compiled once per model structure, batch, prompt length, ``new``, ``top_k`` and path; the
    parameters, the prompt's ids, the key and the temperature are arguments.
    """
    model = nnx.merge(graphdef, state)
    B, P = prompt_BxP.shape
    total = P + new
    span = min(window, total)  # the cache size, or the uncached buffer's length

    def draw(logits_BxV: jax.Array, j: jax.Array | int) -> jax.Array:
        logits_BxV = logits_BxV[:, :vocab]  # a padded vocabulary's rows past the data's are never drawn
        return jax.random.categorical(jax.random.fold_in(key, j), shape_logits(logits_BxV, temperature, top_k))

    # Padded by ``span`` so the uncached path's window slice never runs off the end (a dynamic slice
    # past the end would be moved back, silently shifting the window).
    ids = jnp.zeros((B, total + span), jnp.int32).at[:, :P].set(prompt_BxP.astype(jnp.int32))

    if cached:
        cache = model.init_cache(B, span)
        if P > 1:  # prefill all but the prompt's last token in one call; the loop feeds that one
            cache = model.extend(ids[:, : P - 1], cache, last_only=True)[1]
        keep = keep_of(window)

        def refill(i: jax.Array, ids: jax.Array) -> Any:
            context = jax.lax.dynamic_slice_in_dim(ids, i - keep, keep, axis=1)
            return model.extend(context, model.init_cache(B, span), last_only=True)[1]

        def step(i: jax.Array, carry: tuple[jax.Array, Any]) -> tuple[jax.Array, Any]:
            ids, cache = carry  # feed the token at i, draw the one at i + 1
            if total > window:
                cache = jax.lax.cond(cache.length == span, lambda c: refill(i, ids), lambda c: c, cache)
            logits, cache = model.extend(jax.lax.dynamic_slice_in_dim(ids, i, 1, axis=1), cache)
            return ids.at[:, i + 1].set(draw(logits[:, 0], i + 1)), cache

        ids, _ = jax.lax.fori_loop(P - 1, total - 1, step, (ids, cache))
    else:

        def uncached_step(i: jax.Array, ids: jax.Array) -> jax.Array:
            # Causal: the logits at i see only the window's tokens up to i, whatever follows them.
            start = context_start(i, window)
            logits_BxSxV = model(jax.lax.dynamic_slice_in_dim(ids, start, span, axis=1))
            logits_BxV = jax.lax.dynamic_index_in_dim(logits_BxSxV, i - start, axis=1, keepdims=False)
            return ids.at[:, i + 1].set(draw(logits_BxV, i + 1))

        ids = jax.lax.fori_loop(P - 1, total - 1, uncached_step, ids)
    return ids[:, :total]
