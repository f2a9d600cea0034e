"""The profiling window (``trainer.profile``): a JAX trace of ``steps`` steps after ``warmup``,
written where TensorBoard's profile plugin and Perfetto read it. A hook of the loop
(``dew.training.hooks``), every step while the run has a window."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import jax

from dew.training.hooks import At, Hook

if TYPE_CHECKING:
    from dew.contract.config import ProfileWindow
    from dew.training.step import TrainState

log = logging.getLogger("dew")


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
        if self.tracing and self.profile is not None:
            jax.profiler.stop_trace()
            self.tracing = False
            log.info("profile of steps %d-%d written to %s", *self.window(), trace_path(self.profile.directory))

    def window(self) -> tuple[int, int]:
        """The first and last steps traced (counted from 1)."""
        assert self.profile is not None
        return self.profile.warmup + 1, self.profile.warmup + self.profile.steps


def trace_path(directory: str) -> str:
    """Where the last trace under ``directory`` went: JAX writes each into a new
    ``plugins/profile/<time>/`` folder (TensorBoard's layout), which is what to open."""
    root = os.path.join(os.path.abspath(os.path.expanduser(directory)), "plugins", "profile")
    runs = sorted(os.listdir(root)) if os.path.isdir(root) else []
    return os.path.join(root, runs[-1]) if runs else os.path.abspath(directory)
