"""The optimizer a run trains with: ``build_optimizer(OptimConfig, params)``.

One optax chain per run, read top to bottom:

1. global-norm clipping of the gradient (``clip_grads``; 0 disables),
2. the parameters split by group (``param_groups``, first match wins; unmatched leaves form the
   default group) and, for Muon, each group split again into Muon's matrices and AdamW's rest,
3. in each part, the published update rule, its decoupled weight decay, and the schedule's rate
   times the group's multiplier.

The update rules are optax's where optax has them exactly (``scale_by_adam``,
``scale_by_trust_ratio``, Newton-Schulz orthogonalisation); what it lacks lives beside this file:
``dew.training.layerwise`` (LAMB's trust ratio per layer of a stack),
``dew.training.muon`` (Keller Jordan's Muon momentum and routing, QK-clip) and
``dew.training.bf16`` (Adam moments in bfloat16 with stochastic rounding). Every option and default
is listed in docs/optimizers.md.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from dew.config import OptimConfig, ParamGroup
from dew.training import muon as muon_lib
from dew.training.bf16 import bf16_moments
from dew.training.layerwise import scale_by_layerwise_trust_ratio
from dew.training.muon import QKClipLayer, qk_clip
from dew.training.schedules import build_schedule

__all__ = [
    "DEFAULT_WEIGHT_DECAY", "OPTIONS", "Optimizer", "QKClipLayer", "bf16_moments", "build_optimizer",
    "group_labels", "mup_param_groups", "param_paths", "qk_clip",
]

Schedule = Callable[[jax.Array], jax.Array]

# ------------------------------------------------------------------------------------ the options

_ADAM = {"b1": 0.9, "b2": 0.999, "eps": 1e-8}
_MUON = {
    "momentum": 0.95,
    "nesterov": True,
    "ns_steps": 5,
    "update_scale": "moonlight",
    "rms_ratio": 0.2,
    "adam_b1": 0.9,
    "adam_b2": 0.95,
    "adam_eps": 1e-8,
    "adam_patterns": list(muon_lib.DEFAULT_ADAM_PATTERNS),
    "matrix_axes": dict(muon_lib.DEFAULT_MATRIX_AXES),
}
OPTIONS: dict[str, dict[str, Any]] = {
    "adam": dict(_ADAM),
    "adamw": dict(_ADAM),
    "lamb": {"b1": 0.9, "b2": 0.999, "eps": 1e-6},
    "muon": dict(_MUON),
    "muonclip": {**_MUON, "tau": 100.0},
}
"""Optimizer -> the ``optimizer_opts`` it takes, with their defaults (docs/optimizers.md)."""

DEFAULT_WEIGHT_DECAY: dict[str, float] = {
    "adam": 0.0,  # Adam has no decoupled decay; a value set is L2 in the gradient (torch's Adam)
    "adamw": 1e-4,  # optax.adamw's default
    "lamb": 0.0,  # optax.lamb's default
    "muon": 0.1,  # Moonlight (Liu et al. 2025), with its matched update RMS
    "muonclip": 0.1,  # Kimi K2 (2025)
}
"""Optimizer -> its weight decay when ``OptimConfig.weight_decay`` is unset."""


def _options(config: OptimConfig) -> dict[str, Any]:
    takes = OPTIONS[config.optimizer]
    unknown = sorted(set(config.optimizer_opts) - set(takes))
    if unknown:
        raise ValueError(
            f"optim.optimizer_opts: {config.optimizer} does not take {', '.join(unknown)}; "
            f"it takes {', '.join(sorted(takes))}"
        )
    opts = {**takes, **config.optimizer_opts}
    for key, value in opts.items():
        where = f"optim.optimizer_opts.{key}={value!r}"
        if key in ("b1", "b2", "adam_b1", "adam_b2", "momentum") and not (
                isinstance(value, (int, float)) and 0.0 <= value < 1.0):
            raise ValueError(f"{where} must lie in [0, 1)")
        if key in ("eps", "adam_eps", "tau", "rms_ratio") and not (
                isinstance(value, (int, float)) and 0 < value < math.inf):
            raise ValueError(f"{where} must be positive and finite")
        if key == "ns_steps" and not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{where} must be an integer >= 1")
        if key == "update_scale" and value not in ("moonlight", "keller"):
            raise ValueError(f"{where}: takes 'moonlight' or 'keller'")
        if key == "nesterov" and not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false")
        if key == "adam_patterns" and not (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)):
            raise ValueError(f"{where} must be a list of regular expressions")
        if key == "matrix_axes" and not isinstance(value, Mapping):
            raise ValueError(f"{where} must map path patterns to [reduction axes, output axes]")
    return opts


# ----------------------------------------------------------------------------------- the optimizer


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """What the trainer steps with."""

    tx: optax.GradientTransformation
    """The whole chain: clipping, groups, update rules, weight decay and schedule."""
    learning_rate: Schedule
    """The schedule's rate at a step (completed updates, int32), before group multipliers: train/lr."""
    qk_clip_tau: float | None = None
    """For muonclip, the logit cap τ the trainer passes to ``qk_clip`` after every update."""


def build_optimizer(
    config: OptimConfig,
    params: Any,
    *,
    total_steps: int,
    tokens_seen: Callable[[jax.Array], jax.Array] | None = None,
) -> Optimizer:
    """Build the run's optimizer for ``params`` (an ``nnx.State`` of parameters or a nested dict).

    ``params`` is read for its paths only (group matching, Muon's routing), here and at every
    update, so the gradients may be either tree type as long as their paths are the parameters'.
    ``tokens_seen(step)`` is the tokens (or records) consumed before ``step``, batch ramp included,
    as a float array; the power schedule requires it.
    """
    options = _options(config)
    schedule = build_schedule(config.schedule, config.learning_rate, total_steps=total_steps,
                              tokens_seen=tokens_seen)
    default_decay = config.weight_decay if config.weight_decay is not None else DEFAULT_WEIGHT_DECAY[config.optimizer]
    groups = config.param_groups
    group_labels(params, groups)  # raises on a pattern that matches nothing, before anything compiles

    def labels(tree: Any) -> Any:
        return group_labels(tree, groups)

    parts: dict[str, optax.GradientTransformation] = {}
    for index, group in [(i, g) for i, g in enumerate(groups)] + [(len(groups), None)]:
        multiplier = group.lr_multiplier if group is not None else 1.0
        decay = group.weight_decay if group is not None and group.weight_decay is not None else default_decay
        rate = _scaled(schedule, multiplier)
        parts[_label(index)] = _update_rule(config, options, rate, decay)
    tx = optax.partition(parts, labels)
    if config.clip_grads > 0:
        tx = optax.chain(optax.clip_by_global_norm(config.clip_grads), tx)
    tau = float(options["tau"]) if config.optimizer == "muonclip" else None
    return Optimizer(tx=tx, learning_rate=schedule, qk_clip_tau=tau)


def _scaled(schedule: Schedule, multiplier: float) -> Schedule:
    if multiplier == 1.0:
        return schedule
    return lambda step: multiplier * schedule(step)


def _update_rule(config: OptimConfig, opts: Mapping[str, Any], rate: Schedule, decay: float):
    """One group's update rule with its weight decay and rate."""
    name = config.optimizer
    if name in ("adam", "adamw"):
        scale = (bf16_moments(opts["b1"], opts["b2"], opts["eps"]) if config.state_dtype == "bfloat16"
                 else optax.scale_by_adam(opts["b1"], opts["b2"], opts["eps"]))
        decayed = optax.add_decayed_weights(decay)
        steps = [decayed, scale] if name == "adam" else [scale, decayed]  # L2 (Adam) vs decoupled (AdamW)
        return optax.chain(*steps, optax.scale_by_learning_rate(rate))
    if name == "lamb":
        # You et al. 2020, Algorithm 2: r = m̂/(sqrt(v̂)+eps); u = r + λx; x -= lr·(||x_l||/||u_l||)·u
        # with one trust ratio per layer l, also inside a stack of layers (dew.training.layerwise).
        return optax.chain(
            optax.scale_by_adam(opts["b1"], opts["b2"], opts["eps"]),
            optax.add_decayed_weights(decay),
            scale_by_layerwise_trust_ratio(),
            optax.scale_by_learning_rate(rate),
        )
    if name in ("muon", "muonclip"):
        return muon_lib.muon(
            rate,
            weight_decay=decay,
            momentum=opts["momentum"],
            nesterov=opts["nesterov"],
            ns_steps=opts["ns_steps"],
            update_scale=opts["update_scale"],
            rms_ratio=opts["rms_ratio"],
            adam_b1=opts["adam_b1"],
            adam_b2=opts["adam_b2"],
            adam_eps=opts["adam_eps"],
            adam_patterns=tuple(opts["adam_patterns"]),
            matrix_axes=dict(opts["matrix_axes"]),
        )
    raise ValueError(f"optim.optimizer={name!r}; known: {sorted(OPTIONS)}")


# ---------------------------------------------------------------------------------------- groups


def param_paths(tree: Any) -> Any:
    """The tree with each leaf replaced by its path, keys joined with "/" (``blocks/attn/qkv/kernel``).

    An ``nnx.Param``'s own ``value`` attribute is not part of the path.
    """
    return jax.tree_util.tree_map_with_path(lambda path, _: muon_lib.path_str(path), tree)


def _label(index: int) -> str:
    return f"group{index}"


def group_labels(tree: Any, groups: Sequence[ParamGroup]) -> Any:
    """Each leaf's group label, ``group{i}`` for the first group whose pattern its path matches
    (``re.search``) and ``group{len(groups)}`` for the rest. A pattern that matches no leaf raises."""
    compiled = [re.compile(g.pattern) for g in groups]
    used = [False] * len(groups)

    def label(path: Any, _leaf: Any) -> str:
        text = muon_lib.path_str(path)
        for i, pattern in enumerate(compiled):
            if pattern.search(text):
                used[i] = True
                return _label(i)
        return _label(len(groups))

    labels = jax.tree_util.tree_map_with_path(label, tree)
    leaves = jax.tree.leaves(tree)
    if leaves and not all(used):
        unmatched = [g.pattern for g, u in zip(groups, used, strict=True) if not u]
        first = [muon_lib.path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]][:8]
        raise ValueError(
            f"optim.param_groups: pattern {unmatched[0]!r} matches no parameter (or only parameters an "
            f"earlier group took); unmatched: {unmatched}; parameter paths look like {first}"
        )
    return labels


def mup_param_groups(
    params: Any,
    width_multiplier: float,
    *,
    embedding_patterns: Sequence[str] = muon_lib.EMBEDDING_PATTERNS,
    non_matrix_patterns: Sequence[str] = muon_lib.NON_MATRIX_PATTERNS,
) -> tuple[ParamGroup, ...]:
    """lm-engine's muP split of ``params`` into parameter groups (first match wins).

    - norms, biases and every other non-matrix parameter (rank < 2, or a path matching
      ``non_matrix_patterns``, since a scanned stack gives them a layer axis): weight decay 0 at the
      run's rate;
    - the hidden matrices (every other leaf not matching ``embedding_patterns``): the run's rate
      divided by ``width_multiplier`` (m_width, the model's width over its base width), the run's
      weight decay;
    - embeddings and the output head (``embedding_patterns``): the normal group, i.e. no group.

    Each group's pattern lists its exact paths (anchored, escaped), so the record in run.json is the
    split itself. Paths are in the tree's leaf order.
    """
    if width_multiplier <= 0:
        raise ValueError(f"width_multiplier={width_multiplier} must be positive")
    no_decay, hidden = [], []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        text = muon_lib.path_str(path)
        if len(jnp.shape(leaf)) < 2 or any(re.search(p, text) for p in non_matrix_patterns):
            no_decay.append(text)
        elif not any(re.search(p, text) for p in embedding_patterns):
            hidden.append(text)
    groups = []
    if no_decay:
        groups.append(ParamGroup(_exact(no_decay), lr_multiplier=1.0, weight_decay=0.0))
    if hidden:
        groups.append(ParamGroup(_exact(hidden), lr_multiplier=1.0 / width_multiplier))
    return tuple(groups)


def _exact(paths: Sequence[str]) -> str:
    return "^(?:" + "|".join(re.escape(p) for p in paths) + ")$"


def state_bytes(state: Any) -> int:
    """Bytes of the arrays in an optimizer state (or any tree)."""
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state) if hasattr(x, "dtype"))
