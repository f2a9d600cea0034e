"""The metric report (``trainer.log_every``): a late hook (``dew.training.hooks``), so the metrics
of a logged step stay on the devices until the next step is dispatched and logging never makes the
host wait for the step it just queued."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dew.training.hooks import At, Hook


class Reporter(Hook):
    """Every ``log_every`` steps (and at the last), the step's metrics and the throughput since the
    previous report, to the tracker."""

    late = True

    def __init__(
        self,
        report: Callable[[int, Mapping[str, float]], None],
        *,
        measure: Callable[[int], dict[str, float]],
        every: int,
    ) -> None:
        super().__init__(every)
        self.report = report
        """Where the fetched values go: (step, values), the tracker's ``metrics``."""
        self.measure = measure
        """Throughput up to a count of records (``tracking.Throughput.measure``)."""

    def on_step(self, at: At) -> None:
        self.report(at.step, {**at.metrics, **self.measure(at.records)})
