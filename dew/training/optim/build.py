"""The optimizer a run trains with: ``build_optimizer(OptimConfig, params)``.

One optax chain per run, read top to bottom:

1. global-norm clipping of the gradient (``clip_grads``; 0 disables),
2. the parameters split by group (``param_groups``, first match wins; unmatched leaves form the
   default group) and, for Muon, each group split again into Muon's matrices and AdamW's rest,
3. in each part, the published update rule, its decoupled weight decay, and the schedule's rate
   times the group's multiplier,
4. the rule's transform after the update, where it has one (MuonClip's QK-clip).

Each optimizer is a registered ``UpdateRule`` (``dew.training.optim.registry``) in its own module:
``dew.training.optim.adam`` (adam, adamw), ``dew.training.optim.lamb`` (LAMB, with its trust ratio per
layer of a stack), ``dew.training.optim.muon`` (Keller Jordan's Muon momentum and routing) and
``dew.training.optim.muonclip`` (QK-clip). The rules are optax's where optax has them exactly
(``scale_by_adam``, ``scale_by_trust_ratio``, Newton-Schulz orthogonalisation);
``dew.training.optim.bf16`` keeps Adam's moments in bfloat16 with stochastic rounding. Every option and
default is listed in docs/optimizers.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dew.contract.config import OptimConfig, ParamGroup
from dew.contract.models import QKClipLayer
from dew.training.optim.bf16 import bf16_moments
from dew.training.optim.muon import EMBEDDING_PATTERNS, NON_MATRIX_PATTERNS
from dew.training.optim.muonclip import qk_clip
from dew.training.optim.registry import UpdateRule, optimizers, path_str
from dew.training.optim.schedules import Rate, build_schedule, step_inputs

if TYPE_CHECKING:
    from dew.contract.models import Architecture

__all__ = [
    "Optimizer",
    "QKClipLayer",
    "bf16_moments",
    "build_optimizer",
    "group_labels",
    "mup_param_groups",
    "optimizers",
    "param_paths",
    "qk_clip",
]


# ----------------------------------------------------------------------------------- the optimizer


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """What the trainer steps with."""

    tx: optax.GradientTransformation
    """The whole chain: clipping, groups, update rules, weight decay, schedule and the rule's
    post-update transform."""
    learning_rate: Rate
    """The schedule's rate at a step (completed updates, int32), before group multipliers: train/lr."""
    extra_args: tuple[str, ...] = ()
    """What ``tx.update`` takes besides the gradients (``UpdateRule.extra_args``): ``max_logits``
    for MuonClip."""
    inputs: Mapping[str, np.ndarray | float] = dataclasses.field(default_factory=dict)
    """The numbers the compiled step takes as inputs instead of constants: the schedule's
    (``schedules.step_inputs``: the peak rate, the warmup and the run's length, where the schedule
    allows it) and a nonzero weight decay of the run (where the rule allows it:
    ``UpdateRule.traceable``; a group's own decay stays a constant)."""
    rebuild: Callable[[Mapping[str, jax.Array]], Optimizer] | None = None
    """This optimizer again with ``inputs`` (as traced arrays) in its schedule and decay: what the
    compiled step updates with, so that its program holds none of these numbers as constants."""


def build_optimizer(
    config: OptimConfig,
    params: optax.Params,
    *,
    total_steps: int,
    tokens_seen: Callable[[jax.Array], jax.Array] | None = None,
    architecture: Architecture | None = None,
    inputs: Mapping[str, jax.Array] | None = None,
) -> Optimizer:
    """Build the run's optimizer for ``params`` (an ``nnx.State`` of parameters or a nested dict).

    ``params`` is read for its paths only (group matching, Muon's routing), here and at every
    update, so the gradients may be either tree type as long as their paths are the parameters'.
    ``tokens_seen(step)`` is the tokens (or records) consumed before ``step``, batch ramp included,
    as a float array; the power schedule requires it. ``architecture`` is the run's model, for a
    rule that reads it after the update (MuonClip's attention layers). ``inputs``: ``Optimizer.inputs``
    as arrays (``Optimizer.rebuild``, inside the compiled step).
    """
    rule: UpdateRule = optimizers[config.optimizer].resolve(config.optimizer_opts)
    schedule = build_schedule(
        config.schedule, config.learning_rate, total_steps=total_steps, tokens_seen=tokens_seen, inputs=inputs
    )
    default_decay: float | jax.Array = config.weight_decay if config.weight_decay is not None else rule.weight_decay
    if inputs is not None and "weight_decay" in inputs:
        default_decay = inputs["weight_decay"]
    groups = config.param_groups
    group_labels(params, groups)  # raises on a pattern that matches nothing, before anything compiles

    def labels(tree: optax.Params) -> Any:
        return group_labels(tree, groups)

    parts: dict[str, optax.GradientTransformation] = {}
    for index, group in [(i, g) for i, g in enumerate(groups)] + [(len(groups), None)]:
        multiplier = group.lr_multiplier if group is not None else 1.0
        decay = group.weight_decay if group is not None and group.weight_decay is not None else default_decay
        parts[_label(index)] = rule.rule(_scaled(schedule, multiplier), decay, config.state_dtype)
    tx = optax.partition(parts, labels)
    if config.clip_grads > 0:
        tx = optax.chain(optax.clip_by_global_norm(config.clip_grads), tx)
    after = rule.after_update(architecture)
    if after is not None:
        tx = optax.chain(tx, after)
    if inputs is not None:
        return Optimizer(tx=tx, learning_rate=schedule, extra_args=rule.extra_args)
    numbers: dict[str, np.ndarray | float] = dict(step_inputs(config.schedule, config.learning_rate, total_steps))
    if rule.traceable and default_decay != 0:  # a zero decay stays a constant: optax then skips the term
        numbers["weight_decay"] = float(default_decay)  # weakly typed once on the devices, as a Python float is
    # Read again inside the trace for its paths and shapes only: abstract, so that the optimizer
    # holds no reference to the arrays it was built for.
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    again = functools.partial(
        build_optimizer, config, shapes, total_steps=total_steps, tokens_seen=tokens_seen, architecture=architecture
    )
    return Optimizer(
        tx=tx,
        learning_rate=schedule,
        extra_args=rule.extra_args,
        inputs=numbers,
        rebuild=lambda arrays: again(inputs=arrays),
    )


def _scaled(schedule: Rate, multiplier: float) -> Rate:
    if multiplier == 1.0:
        return schedule
    return lambda step: multiplier * schedule(step)


# ---------------------------------------------------------------------------------------- groups


def param_paths(tree: optax.Params) -> Any:
    """The tree with each leaf replaced by its path, keys joined with "/" (``blocks/attn/qkv/kernel``).

    An ``nnx.Param``'s own ``value`` attribute is not part of the path.
    """
    return jax.tree_util.tree_map_with_path(lambda path, _: path_str(path), tree)


def _label(index: int) -> str:
    return f"group{index}"


def group_labels(tree: optax.Params, groups: Sequence[ParamGroup]) -> Any:
    """Each leaf's group label, ``group{i}`` for the first group whose pattern its path matches
    (``re.search``) and ``group{len(groups)}`` for the rest. A pattern that matches no leaf raises."""
    compiled = [re.compile(g.pattern) for g in groups]
    used = [False] * len(groups)

    def label(path: jax.tree_util.KeyPath, _leaf: jax.Array) -> str:
        text = path_str(path)
        for i, pattern in enumerate(compiled):
            if pattern.search(text):
                used[i] = True
                return _label(i)
        return _label(len(groups))

    labels = jax.tree_util.tree_map_with_path(label, tree)
    leaves = jax.tree.leaves(tree)
    if leaves and not all(used):
        unmatched = [g.pattern for g, u in zip(groups, used, strict=True) if not u]
        first = [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]][:8]
        raise ValueError(
            f"optim.param_groups: pattern {unmatched[0]!r} matches no parameter (or only parameters an "
            f"earlier group took); unmatched: {unmatched}; parameter paths look like {first}"
        )
    return labels


MUP_HIDDEN_PATTERNS: tuple[str, ...] = (r"(^|/)t_embedder/mlp_out/kernel$",)
"""Matrices muP takes as hidden although ``EMBEDDING_PATTERNS`` names them: simple_dit's timestep MLP
reads a fixed 256-wide sinusoid (``mlp_in``, an input layer), but its second matrix is
``hidden x hidden``, whose fan-in grows with the width (docs/mup.md: the coordinate check)."""


def mup_param_groups(
    params: optax.Params,
    width_multiplier: float,
    *,
    embedding_patterns: Sequence[str] = EMBEDDING_PATTERNS,
    non_matrix_patterns: Sequence[str] = NON_MATRIX_PATTERNS,
    hidden_patterns: Sequence[str] = MUP_HIDDEN_PATTERNS,
) -> tuple[ParamGroup, ...]:
    """lm-engine's muP split of ``params`` into parameter groups (first match wins).

    - norms, biases and every other non-matrix parameter (rank < 2, or a path matching
      ``non_matrix_patterns``, since a scanned stack gives them a layer axis): weight decay 0 at the
      run's rate;
    - the hidden matrices (every other leaf not matching ``embedding_patterns``, or matching
      ``hidden_patterns``): the run's rate divided by ``width_multiplier`` (m_width, the model's
      width over its base width), the run's weight decay;
    - embeddings and the output head (``embedding_patterns``): the normal group, i.e. no group.

    Each group's pattern lists its exact paths (anchored, escaped), so the record in run.json is the
    split itself. Paths are in the tree's leaf order.
    """
    if width_multiplier <= 0:
        raise ValueError(f"width_multiplier={width_multiplier} must be positive")
    no_decay, hidden = [], []
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        text = path_str(path)
        if len(jnp.shape(leaf)) < 2 or any(re.search(p, text) for p in non_matrix_patterns):
            no_decay.append(text)
        elif any(re.search(p, text) for p in hidden_patterns) or not any(
            re.search(p, text) for p in embedding_patterns
        ):
            hidden.append(text)
    groups = []
    if no_decay:
        groups.append(ParamGroup(_exact(no_decay), lr_multiplier=1.0, weight_decay=0.0))
    if hidden:
        groups.append(ParamGroup(_exact(hidden), lr_multiplier=1.0 / width_multiplier))
    return tuple(groups)


def _exact(paths: Sequence[str]) -> str:
    return "^(?:" + "|".join(re.escape(p) for p in paths) + ")$"


def state_bytes(state: optax.OptState) -> int:
    """Bytes of the arrays in an optimizer state (or any tree)."""
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state) if hasattr(x, "dtype"))
