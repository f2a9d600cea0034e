"""Training metrics fetched one step late: the metrics of a logged step are held as device arrays
and fetched after the next step is dispatched, so logging never makes the host wait for the step it
just queued."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax

from dew.training.step import NONFINITE


class Reporter:
    """Hold a logged step's metrics (``hold``), fetch and report them later (``flush``)."""

    def __init__(self, report: Callable[[int, Mapping[str, float]], None], *,
                 derive: Callable[[Mapping[str, float]], dict], measure: Callable[[int], dict],
                 on_nonfinite: Callable[[Any], None]) -> None:
        self.report = report
        """Where the fetched values go: (step, values), the tracker's ``metrics``."""
        self.derive = derive
        """The objective's derived metrics from the fetched ones."""
        self.measure = measure
        """Throughput up to a count of records (``tracking.Throughput.measure``)."""
        self.on_nonfinite = on_nonfinite
        """Called with the current state when a fetched step says the run went non-finite; raises."""
        self.pending: tuple[int, int, Mapping[str, jax.Array]] | None = None
        """(step, records consumed after it, its metrics on the devices), not fetched yet."""

    def hold(self, step: int, records: int, metrics: Mapping[str, jax.Array]) -> None:
        self.pending = (step, records, metrics)

    def flush(self, state: Any) -> None:
        """Fetch the held metrics, if any (waiting for their step), and report them."""
        if self.pending is None:
            return
        step, records, values = self.pending
        self.pending = None
        fetched = {k: float(v) for k, v in jax.device_get(values).items()}
        if fetched.pop(NONFINITE) >= 0:
            self.on_nonfinite(state)
        self.report(step, {**fetched, **self.derive(fetched), **self.measure(records)})
