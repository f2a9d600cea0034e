"""``muonclip``: Muon with Kimi K2's QK-clip (Kimi K2 tech report, 2025, section 2.1), registered.

QK-clip is a transform after the update: from the largest pre-softmax logit of each attention head
in the step's forward pass (``max_logits``, which the trainer asks the loss for because this rule
names it in ``extra_args``) it rescales the updated query and key projections of every head whose
logit passed τ. The architecture says where those projections are (``Architecture.qk_clip_layers``),
so neither the trainer nor this module knows a model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax

from dew.contract.models import QKClipLayer
from dew.training.optim.muon import Muon
from dew.training.optim.registry import optimizers, path_str

if TYPE_CHECKING:
    from dew.contract.models import Architecture

__all__ = ["CLIP_RTOL", "MuonClip", "QKClipLayer", "qk_clip", "qk_clip_after_update"]

CLIP_RTOL = 1e-5
"""QK-clip leaves a head whose max logit is within this relative margin above τ (float32 rounding)."""


@optimizers.register("muonclip")
class MuonClip(Muon):
    """Muon, then QK-clip at ``tau`` after every update."""

    options: ClassVar[Mapping[str, object]] = {**Muon.options, "tau": 100.0}
    weight_decay = 0.1  # Kimi K2 (2025)
    extra_args = ("max_logits",)

    def after_update(self, architecture: Architecture | None) -> optax.GradientTransformationExtraArgs:
        if architecture is None:
            raise ValueError(
                "optim.optimizer=muonclip needs the run's architecture for its attention layers "
                "(build_optimizer(..., architecture=...))"
            )
        return qk_clip_after_update(float(self.opts["tau"]), architecture.qk_clip_layers())


class QKClipState(NamedTuple):
    """QK-clip keeps no state."""


def qk_clip_after_update(tau: float, layers: Mapping[str, QKClipLayer]) -> optax.GradientTransformationExtraArgs:
    """The optax transform that makes ``params + updates`` the QK-clipped updated parameters.

    Its update takes ``max_logits``: one ``(…, num_heads)`` array when ``layers`` holds one layer
    (dew's architectures stack every block into one), or a mapping from layer name to array. Leaves
    and heads the clip leaves alone keep their update bit for bit; a clipped head's update becomes
    ``clipped - params`` (one rounding from the clipped value).
    """

    def init(params: optax.Params) -> QKClipState:
        del params
        return QKClipState()

    def update(
        updates: optax.Updates,
        state: QKClipState,
        params: optax.Params | None = None,
        *,
        max_logits: jax.Array | Mapping[str, jax.Array] | None = None,
        **extra: object,
    ) -> tuple[optax.Updates, QKClipState]:
        del extra
        if params is None or max_logits is None:
            raise ValueError("QK-clip needs the parameters and max_logits at every update")
        logits = max_logits if isinstance(max_logits, Mapping) else dict.fromkeys(layers, max_logits)
        updated = optax.apply_updates(params, updates)
        clipped = qk_clip(updated, logits, tau, layers=layers)
        updates = jax.tree.map(
            lambda u, p, n, c: jnp.where(c == n, u, (c - p).astype(u.dtype)), updates, params, updated, clipped
        )
        return updates, state

    return optax.GradientTransformationExtraArgs(init, update)


def qk_clip(
    params: optax.Params,
    max_logits: Mapping[str, jax.Array],
    tau: float,
    *,
    layers: Mapping[str, QKClipLayer],
) -> optax.Params:
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

    def apply(path: jax.tree_util.KeyPath, leaf: jax.Array) -> jax.Array:
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
