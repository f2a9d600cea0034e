"""How far the host runs ahead of the devices: one step, or none once steps are long.

The loop dispatches a step without waiting for it, then waits for an earlier one before it goes on.
Waiting for the step before the one just dispatched (a lead of one step) keeps the next step queued
behind the running one, so the devices never wait for the host's work between steps (fetching the
batch, placing it, the progress line); a stop then lands within two steps: the rest of the running
one and the one queued. Once a step takes ``LONG_STEP_S`` or more, that work is a small part of it
(a few milliseconds against half a second or more), and the loop waits for the step it just
dispatched: no lead, and a stop lands within the rest of one step (docs/performance.md, "Stopping").
"""

from __future__ import annotations

import time

import jax

LONG_STEP_S = 0.5
"""A step at least this long (wall time between two steps' ends) runs with no host lead."""


class Pace:
    """Waits, after each dispatch, for the step the lead allows to be still running."""

    def __init__(self) -> None:
        self.previous: dict[str, jax.Array] | None = None
        """The metrics of the step before the one just dispatched."""
        self.step_s = 0.0
        """The wall time between the last two waits' ends: a step, at steady state."""
        self._ended: float | None = None

    @property
    def long(self) -> bool:
        """Whether steps are long: the loop waits for each step it dispatches, so the metrics of the
        step just dispatched are fetched at its end without holding the host any longer."""
        return self.step_s >= LONG_STEP_S

    def wait(self, dispatched: dict[str, jax.Array]) -> None:
        """Wait after dispatching the step whose metrics are ``dispatched``: for the step before it,
        or, once steps are long, for it."""
        jax.block_until_ready(dispatched if self.step_s >= LONG_STEP_S else self.previous)
        self.previous = dispatched
        now = time.perf_counter()
        if self._ended is not None:
            self.step_s = now - self._ended
        self._ended = now
