"""muP as one switch: the model's ``mup`` field brings the optimizer's muP groups.

muP is one decision with two halves: the model's multipliers and initialisation
(``model.config.mup``, ``dew.models.decoder``) and the optimizer's per-group rates
(``dew.training.optim.build.mup_param_groups``: hidden matrices at the rate over the width multiplier,
norms and biases without weight decay, embeddings and the head at the run's rate and decay). Half of
it is a different, untuned parametrization, so the switch brings both: with muP on, the run's
``optim.param_groups`` are the muP split of the parameters the optimizer moves, at the width
multiplier the model itself reads (``Architecture.mup_width_multiplier``).

The groups are resolved into the run where it is built (``dew.build.build_run``, which dew-train and
dew-sample build through, and ``dew.training.trainer.train`` for a run built in Python), so run.json lists the
groups the optimizer actually uses, each by its exact parameter paths, and a resume compares them.
Resolving a run that already holds them changes nothing.

Groups the user also typed may only restate muP's: a typed group that gives any parameter it takes
another rate multiplier or another effective weight decay than muP gives it is refused, naming the
group, the parameter and both settings. A typed group that agrees is subsumed by muP's listing.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

import jax
import optax
from flax import nnx

from dew.contract.config import OptimConfig, ParamGroup, RunConfig
from dew.contract.models import of
from dew.contract.typed import ConfigError
from dew.training import adapt
from dew.training.optim.build import group_labels, mup_param_groups
from dew.training.optim.registry import optimizers, path_str

if TYPE_CHECKING:
    from dew.objectives.base import Objective

__all__ = ["mup_groups", "width_multiplier", "with_mup_groups"]


def width_multiplier(run: RunConfig) -> float | None:
    """The run's muP width multiplier, None when its model has muP off. An architecture that takes
    a ``mup`` field but states no multiplier cannot give the optimizer its half: refused."""
    arch = of(run.model.architecture, run.model.fields())
    multiplier = arch.mup_width_multiplier()
    if multiplier is None and getattr(arch.fields, "mup", False):
        raise ConfigError(
            f"model.config.mup=true: architecture {run.model.architecture!r} states no muP width "
            "multiplier (Architecture.mup_width_multiplier), so the optimizer's muP groups "
            "cannot be computed"
        )
    return multiplier


def with_mup_groups[R: RunConfig](run: R, objective: Objective) -> R:
    """``run`` with muP's parameter groups in ``optim.param_groups`` when its model has muP on;
    ``run`` itself otherwise. ``objective`` builds the module (abstractly: nothing is allocated)."""
    multiplier = width_multiplier(run)
    if multiplier is None:
        return run
    abstract = nnx.eval_shape(lambda: adapt.build_model(run, objective))
    groups = mup_groups(run.optim, nnx.state(abstract, adapt.trainable(run.lora)), multiplier)
    return dataclasses.replace(run, optim=dataclasses.replace(run.optim, param_groups=groups))


def mup_groups(optim: OptimConfig, params: optax.Params, multiplier: float) -> tuple[ParamGroup, ...]:
    """muP's groups of ``params`` at ``multiplier``, after checking that the groups ``optim``
    already holds agree with them (see the module's docstring)."""
    groups = mup_param_groups(params, multiplier)
    if optim.param_groups and optim.param_groups != groups:
        _check_agree(optim, params, groups, multiplier)
    return groups


def _check_agree(optim: OptimConfig, params: optax.Params, mup: tuple[ParamGroup, ...], multiplier: float) -> None:
    group_labels(params, optim.param_groups)  # a typed pattern that matches nothing is named as ever
    default_decay = optim.weight_decay if optim.weight_decay is not None else optimizers[optim.optimizer].weight_decay

    def setting(group: ParamGroup | None) -> tuple[float, float]:
        if group is None:
            return 1.0, default_decay
        return group.lr_multiplier, group.weight_decay if group.weight_decay is not None else default_decay

    for path in (path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]):
        index, typed = _first_match(optim.param_groups, path)
        if typed is None:
            continue
        _, ours = _first_match(mup, path)
        if setting(typed) != setting(ours):
            (lr, decay), (mup_lr, mup_decay) = setting(typed), setting(ours)
            raise ConfigError(
                f"model.config.mup=true sets the optimizer's muP groups, and optim.param_groups[{index}] "
                f"(pattern {typed.pattern!r}) conflicts with them: it gives {path} lr_multiplier={lr:g}, "
                f"weight_decay={decay:g} where muP gives lr_multiplier={mup_lr:g}, weight_decay={mup_decay:g} "
                f"({_role(ours, multiplier)}). Drop optim.param_groups (muP sets every group) or turn "
                "muP off"
            )


def _first_match(groups: tuple[ParamGroup, ...], path: str) -> tuple[int, ParamGroup | None]:
    return next(((i, g) for i, g in enumerate(groups) if re.search(g.pattern, path)), (-1, None))


def _role(group: ParamGroup | None, multiplier: float) -> str:
    """Which of muP's three groups ``group`` is, in words (``mup_param_groups`` sets decay only on
    the norms' and biases' group)."""
    if group is None:
        return "embeddings and the output head move at the run's rate and decay"
    if group.weight_decay == 0.0:
        return "norms and biases take no weight decay"
    return f"hidden matrices move at the rate / width multiplier {multiplier:g}"
