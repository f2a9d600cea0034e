"""``muon``: Muon (Keller Jordan 2024), registered; MuonClip (``dew.training.optim.muonclip``) builds on it.

Muon keeps a momentum of each hidden weight matrix and steps along its orthogonalisation: the
nearest semi-orthogonal matrix U·Vᵀ of the momentum's SVD U·S·Vᵀ, approximated by five steps of a
quintic Newton-Schulz iteration X <- aX + b(XXᵀ)X + c(XXᵀ)²X with (a, b, c) = (3.4445, -4.7750,
2.0315), which takes the singular values into roughly [0.7, 1.2] rather than exactly to 1
(https://kellerjordan.github.io/posts/muon/). Embeddings, the output head, norms, biases and every
non-matrix parameter are trained by AdamW instead, in the same step.

Differences from ``optax.contrib.muon``, which this module does not use as a whole: Keller's
momentum has no bias correction (optax's Nesterov form corrects both terms); routing here is by
rank *and* path, so embeddings and the head go to AdamW (optax sends every 2-D leaf to Muon); the
AdamW half is plain AdamW (no Nesterov) with Moonlight's betas; weight decay follows the param groups.
The iteration itself is ``newton_schulz`` below (optax keeps its own private).

"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dew.training.optim.registry import UpdateRule, optimizers, path_str
from dew.training.optim.schedules import Rate

__all__ = [
    "DEFAULT_ADAM_PATTERNS",
    "DEFAULT_MATRIX_AXES",
    "EMBEDDING_PATTERNS",
    "NON_MATRIX_PATTERNS",
    "NS_COEFFS",
    "MatrixAxes",
    "Muon",
    "muon",
    "muon_route",
    "newton_schulz",
    "orthogonalize",
    "path_str",
    "scale_by_muon",
]

NS_COEFFS = (3.4445, -4.7750, 2.0315)
"""Keller Jordan's quintic Newton-Schulz coefficients (a, b, c)."""

NS_EPS = 1e-7
"""Added to the Frobenius norm before the iteration, as Keller's ``zeropower_via_newtonschulz5``."""

NON_MATRIX_PATTERNS: tuple[str, ...] = (r"(^|/)(bias|scale)$",)
"""Path patterns of norm scales and biases: a scanned stack gives them a leading layer axis, so
their rank alone does not tell them from matrices (``blocks/mlp_in/bias`` is (depth, width))."""

EMBEDDING_PATTERNS: tuple[str, ...] = ("embed", r"(^|/)(lm_|output_)?head(/|$)", r"final_layer/linear(/|$)")
"""Path patterns of the matrices that are not hidden: embeddings (dew's ``embed``, ``x_embedder``,
``t_embedder``, ``y_embedder``) and the output head (``lm_head``, simple_dit's ``final_layer/linear``)."""

DEFAULT_ADAM_PATTERNS: tuple[str, ...] = EMBEDDING_PATTERNS + NON_MATRIX_PATTERNS
"""Path patterns (``re.search``) that Muon leaves to AdamW, besides every leaf of rank < 2."""

DEFAULT_MATRIX_AXES: dict[str, list[list[int]]] = {
    r"attn/(q|k|v)/kernel$": [[-3], [-2, -1]],
    r"attn/o/kernel$": [[-3, -2], [-1]],
}
"""dew's attention kernels (``dew.models.attention``): q, k, v are (…, hidden, heads, head_dim),
one (hidden, heads·head_dim) matrix each; o is (…, heads, head_dim, hidden), one
(heads·head_dim, hidden) matrix. Every other matrix is its last two axes."""


# ------------------------------------------------------------------------------ Newton-Schulz


class MatrixAxes(NamedTuple):
    """Which axes of a parameter form Muon's matrix; every other axis is a batch axis."""

    reduction: tuple[int, ...]
    """The input (fan-in) axes, flattened into the matrix's rows."""
    output: tuple[int, ...]
    """The output (fan-out) axes, flattened into its columns."""


def newton_schulz(x_MxN: jax.Array, steps: int = 5, coeffs: Sequence[float] = NS_COEFFS) -> jax.Array:
    """Keller Jordan's ``zeropower_via_newtonschulz5`` on one matrix, in float32.

    X = G / (||G||_F + 1e-7), on the wide orientation (rows <= columns, so XXᵀ is the small
    Gram matrix); then ``steps`` times X <- aX + (bA + cA²)X with A = XXᵀ.
    """
    a, b, c = coeffs
    x = x_MxN.astype(jnp.float32)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (jnp.linalg.norm(x) + NS_EPS)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


def orthogonalize(x: jax.Array, axes: MatrixAxes, steps: int = 5) -> jax.Array:
    """``newton_schulz`` over ``axes`` of ``x``, independently for every index of the other axes."""
    batch = tuple(i for i in range(x.ndim) if i not in axes.reduction + axes.output)
    order = batch + axes.reduction + axes.output
    moved = jnp.transpose(x, order)
    rows = math.prod(x.shape[i] for i in axes.reduction)
    cols = math.prod(x.shape[i] for i in axes.output)
    flat_BxMxN = moved.reshape((-1, rows, cols))
    out = jax.vmap(lambda m: newton_schulz(m, steps))(flat_BxMxN)
    return jnp.transpose(out.reshape(moved.shape), tuple(order.index(i) for i in range(x.ndim)))


# --------------------------------------------------------------------------------------- routing


def muon_route(
    path: str, shape: Sequence[int], adam_patterns: Sequence[str], matrix_axes: Mapping[str, Sequence[Sequence[int]]]
) -> MatrixAxes | None:
    """The matrix axes Muon orthogonalises a parameter over, or None for AdamW.

    Rank < 2 and paths matching ``adam_patterns`` go to AdamW. The rest are hidden matrices: the
    first ``matrix_axes`` pattern the path matches gives (reduction axes, output axes); by default
    the last two axes are (fan_in, fan_out) as in ``nnx.Linear``'s kernel, and every leading axis
    (a scanned stack of layers) is a batch axis, so each layer's matrix is orthogonalised alone.
    """
    if len(shape) < 2 or any(re.search(p, path) for p in adam_patterns):
        return None
    for pattern, (reduction, output) in matrix_axes.items():
        if re.search(pattern, path):
            n = len(shape)
            return MatrixAxes(tuple(a % n for a in reduction), tuple(a % n for a in output))
    return MatrixAxes((len(shape) - 2,), (len(shape) - 1,))


def _fans(shape: Sequence[int], axes: MatrixAxes) -> tuple[int, int]:
    return math.prod(shape[a] for a in axes.reduction), math.prod(shape[a] for a in axes.output)


# ----------------------------------------------------------------------------------- the update


class MuonState(NamedTuple):
    """Muon's momentum buffer (float32)."""

    mu: optax.Updates


def scale_by_muon(
    dims: Callable[[str, Sequence[int]], MatrixAxes],
    *,
    momentum: float,
    nesterov: bool,
    ns_steps: int,
    update_scale: str,
    rms_ratio: float,
) -> optax.GradientTransformation:
    """Keller Jordan's Muon direction for matrices (``muon_update`` of github.com/KellerJordan/Muon).

    buf <- β·buf + (1-β)·g;  u = (1-β)·g + β·buf (Nesterov) or buf;  O = NewtonSchulz5(u);
    then O times the update-RMS factor ``update_scale``:

    - ``"moonlight"`` (default): rms_ratio·sqrt(max(fan_in, fan_out)) (Liu et al. 2025, eq. 4),
      which gives the update AdamW's typical RMS (0.2) so that one learning rate and one weight
      decay serve the Muon and the AdamW parts alike;
    - ``"keller"``: sqrt(max(1, fan_out / fan_in)), Keller's shape factor, tuned for a separate
      and larger Muon rate (0.02 in modded-nanogpt).

    ``dims(path, shape)`` names each leaf's matrix axes; leading batch axes are vmapped.
    """
    if update_scale not in ("moonlight", "keller"):
        raise ValueError(f"optim.optimizer_opts.update_scale={update_scale!r}; takes 'moonlight' or 'keller'")

    def init_fn(params: optax.Params) -> MuonState:
        return MuonState(jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params))

    def direction(path: jax.tree_util.KeyPath, g: jax.Array, buf: jax.Array) -> tuple[jax.Array, jax.Array]:
        g = g.astype(jnp.float32)
        buf = momentum * buf + (1.0 - momentum) * g
        u = (1.0 - momentum) * g + momentum * buf if nesterov else buf
        d = dims(path_str(path), g.shape)
        o = orthogonalize(u, d, ns_steps)
        fan_in, fan_out = _fans(g.shape, d)
        if update_scale == "moonlight":
            scale = rms_ratio * math.sqrt(max(fan_in, fan_out))
        else:
            scale = math.sqrt(max(1.0, fan_out / fan_in))
        return scale * o, buf

    def update_fn(updates: optax.Updates, state: MuonState, params: optax.Params | None = None):
        del params
        flat, treedef = jax.tree_util.tree_flatten_with_path(updates)
        # jaxlib's PyTreeDef is opaque to mypy (its methods are unknown to it): the ignores below
        bufs = treedef.flatten_up_to(state.mu)  # type: ignore[attr-defined]
        pairs = [direction(path, g, buf) for (path, g), buf in zip(flat, bufs, strict=True)]
        return (
            treedef.unflatten([o for o, _ in pairs]),  # type: ignore[attr-defined]
            MuonState(treedef.unflatten([b for _, b in pairs])),  # type: ignore[attr-defined]
        )

    return optax.GradientTransformation(init_fn, update_fn)


def muon(
    learning_rate: Rate,
    *,
    weight_decay: float | jax.Array,
    momentum: float,
    nesterov: bool,
    ns_steps: int,
    update_scale: str,
    rms_ratio: float,
    adam_b1: float,
    adam_b2: float,
    adam_eps: float,
    adam_patterns: Sequence[str],
    matrix_axes: Mapping[str, Sequence[Sequence[int]]],
) -> optax.GradientTransformation:
    """Muon on the hidden matrices and AdamW on the rest, one rate and decoupled weight decay for both.
    Every option is given: their defaults have one home, ``Muon.options`` below.

    Both parts step W <- W - lr·(update + λ·W) (Keller's and Moonlight's decay, times the rate).
    """
    axes = dict(matrix_axes or {})
    for pattern, value in axes.items():
        if len(value) != 2:
            raise ValueError(
                f"optim.optimizer_opts.matrix_axes[{pattern!r}]={value!r}: want [reduction axes, output axes]"
            )

    def route(path: str, shape: Sequence[int]) -> MatrixAxes | None:
        return muon_route(path, shape, adam_patterns, axes)

    def dims(path: str, shape: Sequence[int]) -> MatrixAxes:
        d = route(path, shape)
        assert d is not None, path
        return d

    def labels(tree: optax.Params) -> Any:
        return jax.tree_util.tree_map_with_path(
            lambda p, x: "adam" if route(path_str(p), jnp.shape(x)) is None else "muon", tree
        )

    decay = optax.add_decayed_weights(weight_decay)
    rate = optax.scale_by_learning_rate(learning_rate)
    return optax.partition(
        {
            "muon": optax.chain(
                scale_by_muon(
                    dims,
                    momentum=momentum,
                    nesterov=nesterov,
                    ns_steps=ns_steps,
                    update_scale=update_scale,
                    rms_ratio=rms_ratio,
                ),
                decay,
                rate,
            ),
            "adam": optax.chain(optax.scale_by_adam(adam_b1, adam_b2, adam_eps), decay, rate),
        },
        labels,
    )


@optimizers.register("muon")
class Muon(UpdateRule):
    """Muon on the hidden matrices and AdamW on the rest (``muon`` above)."""

    options: ClassVar[Mapping[str, object]] = {
        "momentum": 0.95,
        "nesterov": True,
        "ns_steps": 5,
        "update_scale": "moonlight",
        "rms_ratio": 0.2,
        "adam_b1": 0.9,
        "adam_b2": 0.95,
        "adam_eps": 1e-8,
        "adam_patterns": list(DEFAULT_ADAM_PATTERNS),
        "matrix_axes": dict(DEFAULT_MATRIX_AXES),
    }
    weight_decay = 0.1  # Moonlight (Liu et al. 2025), with its matched update RMS
    traceable = True

    def rule(self, rate: Rate, decay: float | jax.Array, state_dtype: str) -> optax.GradientTransformation:
        o = self.opts
        return muon(
            rate,
            weight_decay=decay,
            momentum=o["momentum"],
            nesterov=o["nesterov"],
            ns_steps=o["ns_steps"],
            update_scale=o["update_scale"],
            rms_ratio=o["rms_ratio"],
            adam_b1=o["adam_b1"],
            adam_b2=o["adam_b2"],
            adam_eps=o["adam_eps"],
            adam_patterns=tuple(o["adam_patterns"]),
            matrix_axes=dict(o["matrix_axes"]),
        )
