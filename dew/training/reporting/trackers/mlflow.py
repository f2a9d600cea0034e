"""MLflow (``trainer.trackers.mlflow``): one MLflow run per dew run, through mlflow's client
(mlflow-skinny, ``pip install 'dew[trackers]'``), imported only when a run turns it on."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from dew.contract.config import MLflow
from dew.contract.trackers import trackers
from dew.training.reporting.trackers import Sink, TrackedRun

if TYPE_CHECKING:
    from etils import epath

PARAM_VALUE_MAX = 6000
"""The longest param value an MLflow server takes; a longer one (a long list of layout rules) is
cut there, ending with ``...``."""


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """MLflow params from a nested config: dotted keys, each value as its JSON (a string as itself;
    a list whole)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= flatten(value, path + ".")
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        out[path] = text if len(text) <= PARAM_VALUE_MAX else text[: PARAM_VALUE_MAX - 3] + "..."
    return out


@trackers.register("mlflow")
class MLflowSink(Sink):
    """One MLflow run: params from the config (flattened), the metrics by step, ``run.json`` and the
    samples as artifacts. With the run's id from the checkpoint (a resume) the same run continues:
    params it lacks are added (an MLflow param never changes), and only steps past the last it holds
    are logged."""

    Options = MLflow
    libraries = ("mlflow",)
    install = "pip install 'dew[trackers]'"

    STATUS: ClassVar[dict[str, str]] = {"finished": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}
    """MLflow's run status for each way a run ends."""

    def __init__(self, options: MLflow, run: TrackedRun) -> None:
        from mlflow import MlflowClient  # heavy: only a run that turns MLflow on loads it
        from mlflow.entities import Param

        self.client = MlflowClient(tracking_uri=options.tracking_uri)  # None: MLFLOW_TRACKING_URI, else MLflow's
        self.logged_to = -1
        """The last step the MLflow run holds: a resumed run logs the steps past it."""
        if run.resume_id is not None:
            held_run = self.client.get_run(run.resume_id)
            self.client.update_run(run.resume_id, status="RUNNING")
            held = set(held_run.data.params)
            for key in held_run.data.metrics:
                steps = (m.step for m in self.client.get_metric_history(run.resume_id, key))
                self.logged_to = max([self.logged_to, *steps])
        else:
            held_run = self.client.create_run(self._experiment(options), run_name=run.name, tags={"dew.run": run.name})
            held = set()
        self.run_id: str = held_run.info.run_id
        # The record's fields by their dotted paths (``trainer.steps``), the summary and the length beside them.
        config = run.config
        flat = flatten(config.get("run", {})) | flatten({k: v for k, v in config.items() if k != "run"})
        params = [Param(k, v) for k, v in flat.items() if k not in held]
        for i in range(0, len(params), 100):  # the most params one request takes
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        if run.run_record is not None and run.run_record.exists():
            self.client.log_text(self.run_id, run.run_record.read_text(), run.run_record.name)

    def _experiment(self, options: MLflow) -> str:
        """The id of the experiment the run joins (created if new): ``experiment``, else
        MLFLOW_EXPERIMENT_NAME, else MLFLOW_EXPERIMENT_ID or MLflow's default experiment."""
        name = options.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if name is None:
            return os.environ.get("MLFLOW_EXPERIMENT_ID", "0")
        found = self.client.get_experiment_by_name(name)
        return found.experiment_id if found is not None else self.client.create_experiment(name)

    @classmethod
    def destination(cls, options: MLflow, name: str, tracking: epath.Path) -> str:
        experiment = options.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "its default experiment"
        return f"MLflow at {options.tracking_uri or _default_uri()} ({experiment})"

    @property
    def resume_id(self) -> str | None:
        return self.run_id

    def metrics(self, record: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        step = int(record["step"])
        if step <= self.logged_to:
            return
        stamp = int(record["time"] * 1000)
        values = [Metric(k, _number(v), stamp, step) for k, v in record.items() if k not in ("step", "time")]
        self.client.log_batch(self.run_id, metrics=values)

    def image(self, step: int, path: str) -> None:
        self.client.log_artifact(self.run_id, path, "samples")

    def texts(self, step: int, texts: Sequence[str]) -> None:
        self.client.log_text(self.run_id, "\n\n".join(texts), f"samples/{step}.txt")

    def close(self, ended: str) -> None:
        self.client.set_terminated(self.run_id, self.STATUS[ended])


def _default_uri() -> str:
    """MLflow's store where ``tracking_uri`` is unset: ``MLFLOW_TRACKING_URI``, else MLflow's own
    default (mlflow is imported by then: the run's tracker did)."""
    import mlflow

    return str(mlflow.get_tracking_uri())


def _number(value: object) -> float:
    """A metric value; the journal's non-finite strings ("nan") back to floats."""
    return float(value) if isinstance(value, (int, float, str)) else math.nan
