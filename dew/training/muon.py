"""Muon (Keller Jordan 2024) and MuonClip's QK-clip (Kimi K2, 2025).

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

QK-clip is not a gradient transformation: it rescales weights after the update from the maximum
attention logits of the forward pass, so it is the pure function ``qk_clip`` the trainer applies.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

__all__ = [
    "DEFAULT_ADAM_PATTERNS", "DEFAULT_MATRIX_AXES", "EMBEDDING_PATTERNS", "NON_MATRIX_PATTERNS", "NS_COEFFS", "MatrixAxes", "QKClipLayer", "muon", "muon_route",
    "newton_schulz", "orthogonalize", "path_str", "qk_clip", "scale_by_muon",
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

CLIP_RTOL = 1e-5
"""QK-clip leaves a head whose max logit is within this relative margin above τ (float32 rounding)."""

Schedule = Callable[[jax.Array], jax.Array]


def path_str(path: Sequence[Any]) -> str:
    """Join a jax key path with "/", leaving out an ``nnx.Variable``'s ``value`` attribute."""
    parts = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            if key.name != "value":
                parts.append(key.name)
        elif isinstance(key, jax.tree_util.FlattenedIndexKey):
            parts.append(str(key.key))
        else:
            parts.append(str(key))
    return "/".join(parts)


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
    momentum: float = 0.95,
    nesterov: bool = True,
    ns_steps: int = 5,
    update_scale: str = "moonlight",
    rms_ratio: float = 0.2,
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

    def direction(path: Any, g: jax.Array, buf: jax.Array) -> tuple[jax.Array, jax.Array]:
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
        bufs = treedef.flatten_up_to(state.mu)
        pairs = [direction(path, g, buf) for (path, g), buf in zip(flat, bufs, strict=True)]
        return (treedef.unflatten([o for o, _ in pairs]),
                MuonState(treedef.unflatten([b for _, b in pairs])))

    return optax.GradientTransformation(init_fn, update_fn)


def muon(
    learning_rate: Schedule,
    *,
    weight_decay: float,
    momentum: float = 0.95,
    nesterov: bool = True,
    ns_steps: int = 5,
    update_scale: str = "moonlight",
    rms_ratio: float = 0.2,
    adam_b1: float = 0.9,
    adam_b2: float = 0.95,
    adam_eps: float = 1e-8,
    adam_patterns: Sequence[str] = DEFAULT_ADAM_PATTERNS,
    matrix_axes: Mapping[str, Sequence[Sequence[int]]] | None = None,
) -> optax.GradientTransformation:
    """Muon on the hidden matrices and AdamW on the rest, one rate and decoupled weight decay for both.

    Both parts step W <- W - lr·(update + λ·W) (Keller's and Moonlight's decay, times the rate).
    """
    axes = dict(matrix_axes or {})
    for pattern, value in axes.items():
        if len(value) != 2:
            raise ValueError(f"optim.optimizer_opts.matrix_axes[{pattern!r}]={value!r}: want [reduction axes, output axes]")

    def route(path: str, shape: Sequence[int]) -> MatrixAxes | None:
        return muon_route(path, shape, adam_patterns, axes)

    def dims(path: str, shape: Sequence[int]) -> MatrixAxes:
        d = route(path, shape)
        assert d is not None, path
        return d

    def labels(tree: Any) -> Any:
        return jax.tree_util.tree_map_with_path(
            lambda p, x: "adam" if route(path_str(p), jnp.shape(x)) is None else "muon", tree)

    decay = optax.add_decayed_weights(weight_decay)
    rate = optax.scale_by_learning_rate(learning_rate)
    return optax.partition(
        {
            "muon": optax.chain(
                scale_by_muon(dims, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                              update_scale=update_scale, rms_ratio=rms_ratio),
                decay, rate),
            "adam": optax.chain(optax.scale_by_adam(adam_b1, adam_b2, adam_eps), decay, rate),
        },
        labels,
    )


# ---------------------------------------------------------------------------------------- QK-clip


@dataclasses.dataclass(frozen=True)
class QKClipLayer:
    """Where one attention layer keeps its query and key projections.

    ``query`` and ``key`` are the "/"-joined paths of the leaves that carry the heads (the kernel,
    and the bias if there is one). Their heads are on the trailing axes: the last axes are
    (heads, head_dim), either as two axes or flattened into one of heads·head_dim (head-major, as a
    reshape of (..., heads, head_dim) gives). Any leading axes before the input axis — a scanned
    stack of layers — must match the leading axes of this layer's max logits.
    """

    query: tuple[str, ...]
    """Paths of the query projection's kernel (…, d_model, heads·head_dim) and bias, if any."""
    key: tuple[str, ...]
    """Paths of the key projection's kernel (…, d_model, kv_heads·head_dim) and bias, if any."""
    num_heads: int
    """Query heads."""
    num_kv_heads: int | None = None
    """Key heads under grouped-query attention; unset is ``num_heads``."""
    split_heads: bool = False
    """True when the leaves end in two axes (heads, head_dim); False when they end in one axis of
    heads·head_dim."""


def qk_clip(
    params: Any,
    max_logits: Mapping[str, jax.Array],
    tau: float,
    *,
    layers: Mapping[str, QKClipLayer],
) -> Any:
    """Kimi K2's QK-clip: cap every attention head's largest pre-softmax logit at ``tau``.

    ``max_logits[name]`` is the largest logit q·k (after the 1/sqrt(head_dim) scale) each query
    head of layer ``layers[name]`` produced in the step's forward pass, shape (…, num_heads) with
    leading axes for stacked layers, already reduced (max) over the batch and the devices. For each
    head with S = max_logit > τ, γ = τ / S:

    - multi-head attention: the head's query and key projections are both scaled by sqrt(γ), so
      its logits scale by γ and the largest becomes τ (K2 tech report, section 2.1);
    - grouped-query attention: a key head is shared by num_heads / num_kv_heads query heads, and
      scaling it would change heads that did not exceed τ. Each offending query head's projection
      is scaled by γ alone and the shared keys are left as they are: the logits of exactly the
      offending heads scale by γ, every other head is untouched.

    Heads at or under τ are bit-identical (their factor is exactly 1). A head within a relative
    ``CLIP_RTOL`` above τ counts as at τ: a clipped head's next maximum is τ up to float32 rounding,
    and clipping it again would only move it by that rounding. A rotary embedding commutes with the
    per-head scale, so all of this holds with RoPE too. QK-norm (an RMSNorm on each head's queries
    and keys) normalises the scale of the projection away, so there the clip has no effect: do not
    combine muonclip with QK-norm. Returns new params; ``params`` is not changed.

    For dew's models (``dew.models.attention``) a layer is
    ``QKClipLayer(query=("blocks/attn/q/kernel",), key=("blocks/attn/k/kernel",), num_heads=N,
    num_kv_heads=K, split_heads=True)`` with the model's ``(depth, num_heads)`` max logits.
    """
    scales: dict[str, tuple[jax.Array, bool]] = {}
    for name, layer in layers.items():
        if name not in max_logits:
            raise KeyError(f"qk_clip: no max logits for layer {name!r}; have {sorted(max_logits)}")
        s = jnp.asarray(max_logits[name], jnp.float32)
        if s.shape[-1] != layer.num_heads:
            raise ValueError(f"qk_clip: layer {name!r} max logits {s.shape} do not end in {layer.num_heads} heads")
        over = s > tau * (1.0 + CLIP_RTOL)
        gamma = jnp.where(over, tau / s, 1.0)
        kv = layer.num_kv_heads or layer.num_heads
        if layer.num_heads % kv:
            raise ValueError(f"qk_clip: {layer.num_heads} query heads do not group over {kv} key heads")
        if kv == layer.num_heads:
            root = jnp.where(over, jnp.sqrt(gamma), 1.0)
            q_scale, k_scale = root, root
        else:
            q_scale, k_scale = gamma, None
        for path in layer.query:
            _set_scale(scales, path, (q_scale, layer.split_heads))
        if k_scale is not None:
            for path in layer.key:
                _set_scale(scales, path, (k_scale, layer.split_heads))

    found: set[str] = set()

    def apply(path: Any, leaf: Any) -> Any:
        text = path_str(path)
        if text not in scales:
            return leaf
        found.add(text)
        return _scale_heads(leaf, *scales[text])

    out = jax.tree_util.tree_map_with_path(apply, params)
    missing = sorted(set(scales) - found)
    if missing:
        raise KeyError(f"qk_clip: no parameter at {missing}")
    return out


def _set_scale(scales: dict[str, tuple[jax.Array, bool]], path: str, scale: tuple[jax.Array, bool]) -> None:
    if path in scales:
        raise ValueError(f"qk_clip: {path} is named by two layers")
    scales[path] = scale


def _scale_heads(leaf: jax.Array, scale_LxH: jax.Array, split_heads: bool) -> jax.Array:
    """Multiply each head's slice of ``leaf`` by its factor (exactly 1 leaves it bit-identical)."""
    heads = scale_LxH.shape[-1]
    lead = scale_LxH.shape[:-1]
    shape = leaf.shape
    if split_heads:
        if len(shape) < 2 or shape[-2] != heads:
            raise ValueError(f"qk_clip: a leaf of shape {shape} does not end in ({heads} heads, head_dim)")
        split = leaf
    else:
        if shape[-1] % heads:
            raise ValueError(f"qk_clip: a leaf of shape {shape} does not split into {heads} heads")
        split = leaf.reshape(shape[:-1] + (heads, shape[-1] // heads))
    if split.shape[: len(lead)] != lead:
        raise ValueError(f"qk_clip: a leaf of shape {shape} does not lead with the max logits' {lead}")
    factor = scale_LxH.reshape(lead + (1,) * (split.ndim - 2 - len(lead)) + (heads, 1))
    return (split * factor.astype(leaf.dtype)).astype(leaf.dtype).reshape(shape)
