"""The optimizer registry: ``UpdateRule``, the class each registered optimizer subclasses.

An optimizer is one registered class (``@optimizers.register("name")``) that knows its
``optimizer_opts`` and their defaults, its default weight decay, the update rule it applies to one
parameter group (with the group's rate and decay), and, where it has one, a transform applied after
the update to the whole parameter tree with what the forward pass measured (MuonClip's QK-clip).
``dew.training.optim.build.build_optimizer`` assembles the run's chain from it: clipping, the groups, the
rule in each group, then the post-update transform. ``OptimConfig.optimizer`` names one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import jax
import optax

from dew.contract.registry import Registry
from dew.training.optim.schedules import Rate

if TYPE_CHECKING:
    from dew.contract.models import Architecture


class UpdateRule:
    """Base of the registered optimizers. An instance holds the run's resolved ``optimizer_opts``."""

    name: ClassVar[str]
    """The name it is registered under (``optim.optimizer``)."""
    options: ClassVar[Mapping[str, Any]] = {}
    """The ``optimizer_opts`` it takes, with their defaults (docs/optimizers.md)."""
    weight_decay: ClassVar[float] = 0.0
    """Its decoupled weight decay when ``OptimConfig.weight_decay`` is unset."""
    traceable: ClassVar[bool] = False
    """Whether ``rule`` uses ``decay`` only through optax or JAX (no Python ``if`` on it): then a
    nonzero decay is handed over as the compiled step's input (a weakly typed float32 array, which
    keeps the updates in the parameters' dtype as a Python float does), and runs that differ only
    in it (a search over the decay) share one compiled step. False: each value is another program."""
    extra_args: ClassVar[tuple[str, ...]] = ()
    """What its update needs from the step besides the gradients, passed by name to
    ``tx.update``: ``max_logits``, each attention head's largest logit of the forward pass
    (``(depth, heads)``; the trainer then asks the loss for it)."""

    def __init__(self, opts: Mapping[str, Any]) -> None:
        self.opts = dict(opts)

    @classmethod
    def resolve(cls, given: Mapping[str, Any]) -> UpdateRule:
        """The rule with ``given`` merged over its defaults; an option it does not take, or a value
        outside an option's range, raises naming both."""
        unknown = sorted(set(given) - set(cls.options))
        if unknown:
            raise ValueError(
                f"optim.optimizer_opts: {cls.name} does not take {', '.join(unknown)}; "
                f"it takes {', '.join(sorted(cls.options)) or 'no options'}"
            )
        opts = {**cls.options, **given}
        for key, value in opts.items():
            check_option(key, value)
        return cls(opts)

    def rule(self, rate: Rate, decay: float | jax.Array, state_dtype: str) -> optax.GradientTransformation:
        """One parameter group's update: the rule, its decoupled weight decay ``decay`` and the rate
        ``rate`` (the group's multiplier already in it). ``state_dtype`` is ``OptimConfig``'s."""
        raise NotImplementedError(f"optimizer {self.name!r} must implement rule")

    def after_update(self, architecture: Architecture | None) -> optax.GradientTransformationExtraArgs | None:
        """A transform of the whole update after every group's rule (it sees every parameter), fed
        ``extra_args``; None for most optimizers. ``architecture`` is the run's model."""
        return None


optimizers: Registry[type[UpdateRule]] = Registry(
    "optimizer",
    builtins=(
        "dew.training.optim.adam",
        "dew.training.optim.lamb",
        "dew.training.optim.muon",
        "dew.training.optim.muonclip",
    ),
)
"""Optimizer name -> its class."""


def _unit(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value < 1.0


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


OPTION_CHECKS: dict[str, tuple[Callable[[object], bool], str]] = {
    "b1": (_unit, "must lie in [0, 1)"),
    "b2": (_unit, "must lie in [0, 1)"),
    "adam_b1": (_unit, "must lie in [0, 1)"),
    "adam_b2": (_unit, "must lie in [0, 1)"),
    "momentum": (_unit, "must lie in [0, 1)"),
    "eps": (_positive, "must be positive and finite"),
    "adam_eps": (_positive, "must be positive and finite"),
    "tau": (_positive, "must be positive and finite"),
    "rms_ratio": (_positive, "must be positive and finite"),
    "ns_steps": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "must be an integer >= 1"),
    "update_scale": (lambda v: v in ("moonlight", "keller"), "takes 'moonlight' or 'keller'"),
    "nesterov": (lambda v: isinstance(v, bool), "must be true or false"),
    "adam_patterns": (
        lambda v: isinstance(v, (list, tuple)) and all(isinstance(p, str) for p in v),
        "must be a list of regular expressions",
    ),
    "matrix_axes": (lambda v: isinstance(v, Mapping), "must map path patterns to [reduction axes, output axes]"),
}
"""The range of each option name the optimizers share; an option not listed is taken as given."""


def check_option(key: str, value: object) -> None:
    """Raise naming ``optim.optimizer_opts.<key>`` and its value if it is outside its range."""
    if key in OPTION_CHECKS:
        ok, allowed = OPTION_CHECKS[key]
        if not ok(value):
            raise ValueError(f"optim.optimizer_opts.{key}={value!r} {allowed}")


def path_str(path: jax.tree_util.KeyPath) -> str:
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
