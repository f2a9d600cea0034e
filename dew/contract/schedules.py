"""The schedule registry: ``ScheduleSpec``, the record each learning-rate schedule subclasses.

A schedule record is a plain dataclass holding only its own fields (``optim.schedule`` holds one);
``build`` turns it into the rate as a function of the step. dew's own schedules, and the JAX that
builds them, are in ``dew.training.optim.schedules``; this module imports nothing from dew but the
contract package, and no JAX.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, Protocol

from dew.contract.registry import Registry

if TYPE_CHECKING:
    import jax


Rate = Callable[["jax.Array"], "jax.Array"]
"""The learning rate as a function of the step (int32 array -> float32 array): what a schedule
builds, what an update rule is handed and what the trainer logs as ``train/lr``. dew's one name for it."""


class WarmupDecay(Protocol):
    """What ``ScheduleSpec.build`` is handed: the parts every schedule shares, a linear warmup over
    ``warmup`` updates and the progress of the decay after it, 0 at the end of warmup and 1 at the
    run's end (``total_steps``). Both numbers are Python ints or, in a compiled step that takes them
    as inputs, int32 arrays. dew's is ``dew.training.optim.schedules.LinearWarmup``."""

    @property
    def warmup(self) -> int | jax.Array: ...

    @property
    def total_steps(self) -> int | jax.Array: ...

    def warming(self, step: jax.Array) -> jax.Array:
        """step / warmup, 1 once warmed up (and with no warmup at all)."""
        ...

    def progress(self, step: jax.Array) -> jax.Array:
        """The decay's progress at ``step``: 0 up to the end of warmup, 1 at ``total_steps``."""
        ...


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
    """Base of the schedule records; ``name`` is the kind it is registered under
    (``@schedules.register``). A record holds only its own fields and builds its rate; every
    schedule warms up, so ``warmup_steps`` is every record's first field."""

    name: ClassVar[str]
    traceable: ClassVar[bool] = False
    """Whether ``build`` computes with ``peak`` and ``ramp``'s numbers only through JAX (no Python
    ``if`` or ``round`` on them): then the trainer hands them over as the compiled step's inputs
    (int32 and float32 arrays), and runs that differ only in the rate, the warmup or their length
    share one compiled step. False: they are Python numbers, and each value is another program."""

    warmup_steps: int = 0
    """Optimizer updates of linear warmup from 0 to the peak."""

    def build(
        self, peak: float | jax.Array, ramp: WarmupDecay, tokens_seen: Callable[[jax.Array], jax.Array] | None
    ) -> Rate:
        """The rate at each step (``Rate``), peaking at ``peak`` (a Python number, or a float32 array
        for a ``traceable`` schedule in a compiled step); ``ramp`` is the warmup and decay progress
        and ``tokens_seen`` as ``dew.training.optim.schedules.build_schedule`` says."""
        raise NotImplementedError(f"schedule {self.name!r} must implement build")


schedules: Registry[type[ScheduleSpec]] = Registry("schedule", builtins=("dew.training.optim.schedules",))
"""Schedule kind -> record class."""
