"""Adam's moments stored in bfloat16, written with stochastic rounding.

Round-to-nearest into bfloat16 keeps 8 bits of mantissa and is biased whenever an update is smaller
than half a unit in the last place: the second moment of a slowly varying gradient then never
moves (``0.999·v + 0.001·g²`` rounds back to ``v``). Stochastic rounding rounds up with probability
equal to the discarded fraction, so the stored value is unbiased, E[round(x)] = x, and the moment
tracks its float32 trajectory in expectation (Gupta et al. 2015, "Deep Learning with Limited
Numerical Precision"; Zamirai et al. 2020, "Revisiting BFloat16 Training").

The update of each step is computed in float32 from the float32 moments of that step, so only the
stored state is rounded. The random bits come from a key folded with the step count and the leaf
index, so a resumed run draws exactly what an uninterrupted one does.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

__all__ = ["Bf16AdamState", "bf16_moments", "round_to_bf16_nearest", "round_to_bf16_stochastic"]


def round_to_bf16_stochastic(x: jax.Array, key: jax.Array) -> jax.Array:
    """Round float32 ``x`` to bfloat16, up with probability equal to the dropped fraction.

    bfloat16 is the top 16 bits of a float32. Adding a uniform integer in [0, 2^16) to the bit
    pattern and truncating the low 16 bits carries into the kept bits with probability
    (low bits) / 2^16, the fraction of a bfloat16 ulp that truncation drops; the bit pattern is
    sign-magnitude, so this rounds the magnitude and is unbiased for negative values too.
    Non-finite values pass through.
    """
    x = x.astype(jnp.float32)
    bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
    noise = jax.random.bits(key, x.shape, jnp.uint32) & jnp.uint32(0xFFFF)
    rounded = (bits + noise) & jnp.uint32(0xFFFF0000)
    out = jax.lax.bitcast_convert_type(rounded, jnp.float32).astype(jnp.bfloat16)  # exact: low bits are 0
    return jnp.where(jnp.isfinite(x), out, x.astype(jnp.bfloat16))


def round_to_bf16_nearest(x: jax.Array) -> jax.Array:
    """Round float32 ``x`` to the nearest bfloat16 (ties to even): XLA's cast, for comparison."""
    return x.astype(jnp.float32).astype(jnp.bfloat16)


class Bf16AdamState(NamedTuple):
    """Adam's state with both moments in bfloat16."""

    count: jax.Array  # type: ignore[assignment]  # shadows tuple.count, as optax's ScaleByAdamState does
    """Completed updates, int32."""
    mu: optax.Updates
    """First moment, bfloat16."""
    nu: optax.Updates
    """Second moment, bfloat16."""


def bf16_moments(
    b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, eps_root: float = 0.0, seed: int = 0
) -> optax.GradientTransformation:
    """``optax.scale_by_adam`` (Kingma & Ba 2015, Algorithm 1) with both moments stored in bfloat16.

    Each step upcasts the stored moments, updates them in float32, returns
    m̂ / (sqrt(v̂ + eps_root) + eps) from those float32 values and stores them stochastically rounded.
    ``seed`` seeds the rounding draws (a fixed default: they are part of the optimizer, not the run).
    """
    base_key = jax.random.key(seed)

    def init_fn(params: optax.Params) -> Bf16AdamState:
        zeros = lambda p: jnp.zeros(jnp.shape(p), jnp.bfloat16)  # noqa: E731
        return Bf16AdamState(jnp.zeros([], jnp.int32), jax.tree.map(zeros, params), jax.tree.map(zeros, params))

    def update_fn(updates: optax.Updates, state: Bf16AdamState, params: optax.Params | None = None):
        del params
        count = optax.safe_increment(state.count)
        step_key = jax.random.fold_in(base_key, count)
        leaves, treedef = jax.tree.flatten(updates)
        # jaxlib's PyTreeDef is opaque to mypy (its methods are unknown to it): the ignores below
        mus, nus = treedef.flatten_up_to(state.mu), treedef.flatten_up_to(state.nu)  # type: ignore[attr-defined]
        new_updates, new_mu, new_nu = [], [], []
        t = count.astype(jnp.float32)
        for i, (g, m, v) in enumerate(zip(leaves, mus, nus, strict=True)):
            g = g.astype(jnp.float32)
            m = b1 * m.astype(jnp.float32) + (1.0 - b1) * g
            v = b2 * v.astype(jnp.float32) + (1.0 - b2) * jnp.square(g)
            m_hat = m / (1.0 - b1**t)
            v_hat = v / (1.0 - b2**t)
            new_updates.append(m_hat / (jnp.sqrt(v_hat + eps_root) + eps))
            key_m, key_v = jax.random.split(jax.random.fold_in(step_key, i))
            new_mu.append(round_to_bf16_stochastic(m, key_m))
            new_nu.append(round_to_bf16_stochastic(v, key_v))
        return (
            treedef.unflatten(new_updates),  # type: ignore[attr-defined]
            Bf16AdamState(count, treedef.unflatten(new_mu), treedef.unflatten(new_nu)),  # type: ignore[attr-defined]
        )

    return optax.GradientTransformation(init_fn, update_fn)
