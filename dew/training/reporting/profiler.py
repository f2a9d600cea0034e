"""The profiling window (``trainer.profile``): a JAX trace of ``steps`` steps after ``warmup``,
written where TensorBoard's profile plugin and Perfetto read it. A hook of the loop
(``dew.training.hooks``), every step while the run has a window."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import jax

from dew.training.hooks import At, Hook

if TYPE_CHECKING:
    from dew.contract.config import ProfileWindow
    from dew.training.step import TrainState


class Profiler(Hook):
    """Start the trace before step ``warmup``, stop it once ``warmup + steps`` steps have run."""

    def __init__(self, profile: ProfileWindow | None) -> None:
        super().__init__(every=1)
        self.profile = profile
        """``trainer.profile``: None profiles nothing."""
        self.tracing = False

    def before(self, step: int) -> None:
        """Called before step ``step`` is dispatched."""
        if self.profile is not None and step == self.profile.warmup and not self.tracing:
            jax.profiler.start_trace(os.path.expanduser(self.profile.directory))
            self.tracing = True

    def on_step(self, at: At) -> None:
        self.after(at.step, at.state)

    def after(self, step: int, state: TrainState) -> None:
        """Called once ``step`` steps are dispatched: the window's last step is waited for, so the
        trace holds its device time."""
        if self.tracing and self.profile is not None and step >= self.profile.warmup + self.profile.steps:
            jax.block_until_ready(state)
            self.close()

    def close(self) -> None:
        if self.tracing:
            jax.profiler.stop_trace()
            self.tracing = False
