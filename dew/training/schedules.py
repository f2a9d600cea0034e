"""Learning-rate schedule records: one typed record per kind, each holding only its own fields.

These records are plain dataclasses (no JAX) so that ``dew.config`` can hold them; the optax
schedules they describe are built by ``dew.training.optim``. Every schedule warms up linearly from
0 over ``warmup_steps`` optimizer updates and peaks at ``OptimConfig.learning_rate``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class ScheduleSpec:
    """Base of the schedule records; ``name`` is the kind it is registered under."""

    name: ClassVar[str]


@dataclasses.dataclass(frozen=True)
class CosineSchedule(ScheduleSpec):
    """Linear warmup, then a cosine decay from the peak to ``floor_ratio``·peak at the last step."""

    name: ClassVar[str] = "cosine"
    warmup_steps: int = 0
    """Optimizer updates of linear warmup from 0 to the peak."""
    floor_ratio: float = 0.0
    """The rate at the last step, as a fraction of the peak."""

    def __post_init__(self) -> None:
        _check_warmup(self)
        if not 0.0 <= self.floor_ratio <= 1.0:
            raise ValueError(f"optim.schedule.floor_ratio={self.floor_ratio} must lie in [0, 1]")


@dataclasses.dataclass(frozen=True)
class LinearSchedule(ScheduleSpec):
    """Linear warmup, then a linear decay from the peak to ``end_ratio``·peak at the last step."""

    name: ClassVar[str] = "linear"
    warmup_steps: int = 0
    """Optimizer updates of linear warmup from 0 to the peak."""
    end_ratio: float = 0.0
    """The rate at the last step, as a fraction of the peak."""

    def __post_init__(self) -> None:
        _check_warmup(self)
        if not 0.0 <= self.end_ratio <= 1.0:
            raise ValueError(f"optim.schedule.end_ratio={self.end_ratio} must lie in [0, 1]")


@dataclasses.dataclass(frozen=True)
class PowerSchedule(ScheduleSpec):
    """lm-engine's power schedule (Shen et al. 2024, "Power Scheduler"): lr = min(lr_max, a·T^b).

    T is the number of tokens seen so far (records, for data without tokens), so a batch ramp
    changes the rate as it should. During warmup lr = (step / warmup_steps)·min(lr_max, a·T_w^b),
    with T_w the tokens seen at the end of warmup. An optional linear tail takes the rate to zero over
    the run's last ``decay_steps`` updates (or the last ``decay_fraction`` of the run).
    """

    name: ClassVar[str] = "power"
    warmup_steps: int = 0
    """Optimizer updates of linear warmup from 0."""
    a: float = 4.6
    """Amplitude of the power law (the paper's a = 4.6)."""
    b: float = -0.51
    """Exponent of the power law in tokens seen (the paper's b = -0.51)."""
    decay_steps: int | None = None
    """Length of the linear tail to zero, in optimizer updates; unset and no fraction: no tail."""
    decay_fraction: float | None = None
    """Length of the linear tail as a fraction of the run; exclusive with ``decay_steps``."""

    def __post_init__(self) -> None:
        _check_warmup(self)
        if self.a <= 0:
            raise ValueError(f"optim.schedule.a={self.a} must be positive")
        if self.decay_steps is not None and self.decay_fraction is not None:
            raise ValueError(
                "optim.schedule.decay_steps and optim.schedule.decay_fraction are exclusive; "
                f"got {self.decay_steps} and {self.decay_fraction}"
            )
        if self.decay_steps is not None and self.decay_steps < 0:
            raise ValueError(f"optim.schedule.decay_steps={self.decay_steps} must be >= 0")
        if self.decay_fraction is not None and not 0.0 <= self.decay_fraction <= 1.0:
            raise ValueError(f"optim.schedule.decay_fraction={self.decay_fraction} must lie in [0, 1]")


def _check_warmup(spec: ScheduleSpec) -> None:
    if spec.warmup_steps < 0:  # type: ignore[attr-defined]
        raise ValueError(f"optim.schedule.warmup_steps={spec.warmup_steps} must be >= 0")  # type: ignore[attr-defined]


schedules: dict[str, type[ScheduleSpec]] = {
    cls.name: cls for cls in (CosineSchedule, PowerSchedule, LinearSchedule)
}
"""Schedule kind -> record class."""
