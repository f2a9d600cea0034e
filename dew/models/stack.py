"""Stacks of identical blocks: created at once with ``nnx.vmap``, run with ``jax.lax.scan``.

A stack holds every block's parameters with a leading ``depth`` axis (``blocks/attn/q/kernel`` is
``(depth, hidden, heads, head_dim)``, its logical axes ``("layers", "embed", "heads", "kv")``), whether the forward
pass is scanned or unrolled: the layout of
parameters, checkpoints and optimizer state does not depend on ``scan_layers``. Scanning compiles one
block whatever the depth (docs/architecture.md: 16 layers compiled in 2.7 s scanned against 18.4 s unrolled);
unrolling (``jax.lax.scan(unroll=True)``) lets XLA schedule across blocks, and gives the same outputs.

**Rematerialisation.** ``remat`` wraps each block in ``jax.checkpoint`` with a policy that says which
of its forward values the backward pass keeps; the rest it recomputes from the block's input. The
same wrap applies scanned or unrolled, and changes memory and time, never the values
(tests/models/test_remat.py). The names follow MaxText's ``remat_policy`` where one matches:

- ``none``: no wrap; every intermediate is kept, attention probabilities included.
- ``full``: only the block's input is kept (``nothing_saveable``); the forward runs twice.
- ``dots``: every matmul output is kept (``dots_saveable``), attention's ``QKᵀ`` and ``PV`` too.
- ``minimal``: the weight matmuls' outputs (``dots_with_no_batch_dims_saveable``), not attention's.
- ``minimal_with_context``: ``minimal`` and attention's output (named ``context`` by
  ``dew.models.attention.attend``), so the backward pass does not redo the attention kernel.

docs/performance.md has the time and memory each one measured and why the default is what it is.

**Recording the residual stream.** Within ``recording()``, ``run`` also computes the mean square of
each block's output (its carry: the residual stream) in the same scan, and sows the ``(depth,)``
values on the stack as ``nnx.Intermediate`` ``output_ms``: the train step's dynamics
(``trainer.dynamics_every``, dew.training.dynamics) pop them from the model after its forward pass.
Outside it, the scan computes nothing more.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TypeVar

import jax
import jax.numpy as jnp
from flax import nnx

from dew.contract.registry import RematPolicy

M = TypeVar("M", bound=nnx.Module)

OUTPUT_MS = "output_ms"
"""The name of the sown mean squares of the blocks' outputs (module docstring)."""

_RECORDING = contextvars.ContextVar("dew_stack_recording", default=False)


@contextlib.contextmanager
def recording(on: bool = True) -> Iterator[None]:
    """Within (when ``on``): every ``run`` sows its blocks' output mean squares (module docstring).
    A switch read while the step is traced, so a program traced outside it computes none of them."""
    token = _RECORDING.set(on)
    try:
        yield
    finally:
        _RECORDING.reset(token)


def mean_square(carry: object) -> jax.Array:
    """The mean square, in float32, of a block's output: the carry, or its first array where the
    carry is a tuple of them."""
    x = jax.tree.leaves(carry)[0]
    return jnp.mean(jnp.square(x.astype(jnp.float32)))


def stack(make_block: Callable[[nnx.Rngs], M], depth: int, rngs: nnx.Rngs) -> M:
    """Build ``depth`` blocks as one module whose parameters are stacked on a leading axis."""

    @nnx.split_rngs(splits=depth)
    @nnx.vmap(in_axes=(0,), out_axes=0, axis_size=depth, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def make(rngs: nnx.Rngs) -> M:
        return make_block(rngs)

    return make(rngs)


def checkpoint_policy(remat: RematPolicy) -> Callable[..., bool] | None:
    """The ``jax.checkpoint`` policy of ``remat``; None for ``none``, which does not wrap the block."""
    policies = jax.checkpoint_policies
    minimal = policies.dots_with_no_batch_dims_saveable
    table: dict[str, Callable[..., bool] | None] = {
        "none": None,
        "full": policies.nothing_saveable,
        "dots": policies.dots_saveable,
        "minimal": minimal,
        "minimal_with_context": policies.save_from_both_policies(minimal, policies.save_only_these_names("context")),
    }
    if remat not in table:
        raise ValueError(f"remat={remat!r}; known: {', '.join(table)}")
    return table[remat]


def run[B: nnx.Module, C, Y](
    blocks: B,
    body: Callable[[B, C], tuple[C, Y]],
    carry: C,
    *,
    scan: bool,
    remat: RematPolicy = "none",
) -> tuple[C, Y]:
    """Thread ``carry`` through the stacked ``blocks`` in order: ``body(block, carry) -> (carry, y)``.

    Returns the last carry and every block's ``y`` stacked on a leading ``depth`` axis. ``scan=False``
    unrolls the loop at trace time; the result is the same. ``remat`` is the block's
    rematerialisation policy (module docstring).
    """
    graphdef, state = nnx.split(blocks)
    record = _RECORDING.get()

    def step(carry: C, block_state: nnx.State) -> tuple[C, Y | tuple[Y, jax.Array]]:
        carry, y = body(nnx.merge(graphdef, block_state), carry)
        return (carry, (y, mean_square(carry))) if record else (carry, y)

    policy = checkpoint_policy(remat)
    if remat != "none":
        # Unrolled, the blocks are straight-line code in which XLA's CSE would merge the backward
        # pass's recomputation with the forward pass and undo the remat; a scan's body cannot be.
        step = jax.checkpoint(step, policy=policy, prevent_cse=not scan)
    carry, ys = jax.lax.scan(step, carry, state, unroll=not scan)
    if not record:
        return carry, ys  # type: ignore[return-value]  # a Y: step returned no mean squares
    ys, ms_L = ys  # type: ignore[misc]
    blocks.sow(nnx.Intermediate, OUTPUT_MS, jax.lax.stop_gradient(ms_L))
    return carry, ys


def run_with[B: nnx.Module, C, X, Y](
    blocks: B, body: Callable[[B, C, X], tuple[C, Y]], carry: C, xs: X, *, scan: bool
) -> tuple[C, Y]:
    """``run`` with a per-block input: ``body(block, carry, x) -> (carry, y)``, ``x`` the block's slice
    of ``xs`` (leaves stacked on a leading ``depth`` axis, like a key/value cache)."""
    graphdef, state = nnx.split(blocks)

    def step(carry: C, block_state_and_x: tuple[nnx.State, X]) -> tuple[C, Y]:
        block_state, x = block_state_and_x
        return body(nnx.merge(graphdef, block_state), carry, x)

    return jax.lax.scan(step, carry, (state, xs), unroll=not scan)
