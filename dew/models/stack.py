"""Stacks of identical blocks: created at once with ``nnx.vmap``, run with ``jax.lax.scan``.

A stack holds every block's parameters with a leading ``depth`` axis (``blocks/attn/q/kernel`` is
``(depth, hidden, heads, head_dim)``), whether the forward pass is scanned or unrolled: the layout of
parameters, checkpoints and optimizer state does not depend on ``scan_layers``. Scanning compiles one
block whatever the depth (design.md: 16 layers compiled in 2.7 s scanned against 18.4 s unrolled);
unrolling (``jax.lax.scan(unroll=True)``) lets XLA schedule across blocks, and gives the same outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax
from flax import nnx

M = TypeVar("M", bound=nnx.Module)


def stack(make_block: Callable[[nnx.Rngs], M], depth: int, rngs: nnx.Rngs) -> M:
    """Build ``depth`` blocks as one module whose parameters are stacked on a leading axis."""

    @nnx.split_rngs(splits=depth)
    @nnx.vmap(in_axes=(0,), out_axes=0, axis_size=depth)
    def make(rngs: nnx.Rngs) -> M:
        return make_block(rngs)

    return make(rngs)


def run(blocks: nnx.Module, body: Callable[[Any, Any], tuple[Any, Any]], carry: Any, *,
        scan: bool) -> tuple[Any, Any]:
    """Thread ``carry`` through the stacked ``blocks`` in order: ``body(block, carry) -> (carry, y)``.

    Returns the last carry and every block's ``y`` stacked on a leading ``depth`` axis. ``scan=False``
    unrolls the loop at trace time; the result is the same.
    """
    graphdef, state = nnx.split(blocks)

    def step(carry: Any, block_state: Any) -> tuple[Any, Any]:
        return body(nnx.merge(graphdef, block_state), carry)

    return jax.lax.scan(step, carry, state, unroll=not scan)


def run_with(blocks: nnx.Module, body: Callable[[Any, Any, Any], tuple[Any, Any]], carry: Any, xs: Any, *,
             scan: bool) -> tuple[Any, Any]:
    """``run`` with a per-block input: ``body(block, carry, x) -> (carry, y)``, ``x`` the block's slice
    of ``xs`` (leaves stacked on a leading ``depth`` axis, like a key/value cache)."""
    graphdef, state = nnx.split(blocks)

    def step(carry: Any, block_state_and_x: Any) -> tuple[Any, Any]:
        block_state, x = block_state_and_x
        return body(nnx.merge(graphdef, block_state), carry, x)

    return jax.lax.scan(step, carry, (state, xs), unroll=not scan)
