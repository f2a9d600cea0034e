"""The schedule registry: ``ScheduleSpec``, the record each learning-rate schedule subclasses.

A schedule record is a plain dataclass holding only its own fields (``optim.schedule`` holds one);
``build`` turns it into the rate as a function of the step. dew's own schedules, and the JAX that
builds them, are in ``dew.training.optim.schedules``; this module imports nothing from dew but the
contract package, and no JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from dew.contract.registry import Registry

if TYPE_CHECKING:
    import jax

    from dew.training.optim.schedules import Rate, WarmupDecay


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
    """Base of the schedule records; ``name`` is the kind it is registered under
    (``@schedules.register``). A record holds only its own fields and builds its rate."""

    name: ClassVar[str]
    traceable: ClassVar[bool] = False
    """Whether ``build`` computes with ``peak`` and ``ramp``'s numbers only through JAX (no Python
    ``if`` or ``round`` on them): then the trainer hands them over as the compiled step's inputs
    (int32 and float32 arrays), and runs that differ only in the rate, the warmup or their length
    share one compiled step. False: they are Python numbers, and each value is another program."""

    def build(self, peak: float, ramp: WarmupDecay, tokens_seen: Callable[[jax.Array], jax.Array] | None) -> Rate:
        """The rate at each step (a function of the step, ``dew.training.optim.schedules.Rate``), peaking at
        ``peak``; ``ramp`` is the warmup and decay progress (``dew.training.optim.schedules.WarmupDecay``) and
        ``tokens_seen`` as ``build_schedule`` says."""
        raise NotImplementedError(f"schedule {self.name!r} must implement build")


schedules: Registry[type[ScheduleSpec]] = Registry("schedule", builtins=("dew.training.optim.schedules",))
"""Schedule kind -> record class."""
