"""The trackers ``trainer.trackers`` turns on besides the journal and W&B: TensorBoard, MLflow, CSV.

Each is a ``Sink`` the ``Tracker`` hands what the journal gets (dew.training.reporting.tracker): the
metric records, the samples of each evaluation, the run's end. Only process 0 opens them, and only
this module imports tensorboardX and mlflow, each when a run turns it on (dew[trackers]).

A tracker that raises (a server down, a full disk, a network gone) is warned about once and turned
off for the rest of the run (``Guarded``): the run goes on and the journal keeps everything. A
missing library or a tracker that cannot work where the run writes is refused before the run starts
(``check``), like every other bad setting.

Resuming follows the journal's history (``dew.contract.journal``): a resumed run continues the
same MLflow run (its id travels in the checkpoint, as W&B's does) and logs only the steps past the
last one that run holds; TensorBoard is told that the run restarted at the resumed step (a
``SessionLog`` START, on which its reader drops what a killed process logged past it); the CSV is
written again from the journal's history and appended to.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from etils import epath

from dew.contract.rundir import FAILURES, METRICS_CSV
from dew.training.run_directory import is_local

if TYPE_CHECKING:
    from dew.contract.config import MLflow, TensorBoard, TrainerConfig

log = logging.getLogger("dew")

LIBRARIES = {"tensorboard": "tensorboardX", "mlflow": "mlflow"}
"""The library each tracker imports (installed by ``pip install 'dew[trackers]'``)."""


def check(trainer: TrainerConfig, tracking: epath.Path) -> None:
    """Refuse, before anything is written, a tracker whose library is missing or that cannot write
    where the run's tracking folder is (``tracking``)."""
    for field, library in LIBRARIES.items():
        if getattr(trainer.trackers, field) is not None and importlib.util.find_spec(library) is None:
            raise ValueError(
                f"trainer.trackers.{field} needs the {library} package, which is not installed: "
                "pip install 'dew[trackers]'"
            )
    board = trainer.trackers.tensorboard
    if board is not None and board.directory is None and not is_local(os.fspath(tracking)):
        raise ValueError(
            f"trainer.trackers.tensorboard writes event files on a local disk, and the tracking folder "
            f"{os.fspath(tracking)} is not local: set trainer.trackers.tensorboard.directory to a local folder"
        )


def destinations(trainer: TrainerConfig, name: str, tracking: epath.Path) -> list[str]:
    """Where each tracker of ``trainer.trackers`` writes run ``name`` (``tracking``: the run's
    tracking folder), a phrase each, for the line that says where the run went."""
    t, out = trainer.trackers, []
    if t.tensorboard is not None:
        board = t.tensorboard.directory
        out.append(f"TensorBoard in {os.path.join(board, name) if board is not None else tracking / 'tensorboard'}")
    if t.mlflow is not None:
        experiment = t.mlflow.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "its default experiment"
        out.append(f"MLflow at {t.mlflow.tracking_uri or _mlflow_default_uri()} ({experiment})")
    if t.csv is not None:
        out.append(f"CSV in {tracking / METRICS_CSV}")
    return out


def _mlflow_default_uri() -> str:
    """MLflow's store where ``tracking_uri`` is unset: ``MLFLOW_TRACKING_URI``, else MLflow's own
    default (mlflow is imported by then: the run's sink did)."""
    import mlflow

    return str(mlflow.get_tracking_uri())


class Sink:
    """One tracker: what the journal gets, as that tracker takes it."""

    def metrics(self, record: Mapping[str, Any]) -> None:
        """A metric record as the journal writes it: ``step``, ``time`` and the values."""

    def image(self, step: int, path: str) -> None:
        """A sample grid the run wrote at an evaluation."""

    def texts(self, step: int, texts: Sequence[str]) -> None:
        """Text samples drawn at an evaluation."""

    def close(self, ended: str) -> None:
        """The run is over: ``ended`` is ``finished``, ``failed`` or ``stopped`` (``outcome``)."""

    @property
    def resume_id(self) -> str | None:
        """What a resumed run needs to continue this tracker's run (kept in the checkpoint)."""
        return None


def outcome(last_event: Mapping[str, Any] | None) -> str:
    """How the run ended, from its last lifecycle event: ``finished`` (``end``), ``failed`` (a stop
    for a failure, or no event: an exception before the loop wrote one) or ``stopped`` (a signal)."""
    if last_event is None:
        return "failed"
    if last_event["event"] == "end":
        return "finished"
    return "failed" if last_event.get("reason") in FAILURES else "stopped"


def takes_samples(trainer: TrainerConfig) -> bool:
    """Whether a tracker the run turns on takes the samples of each evaluation (W&B, TensorBoard,
    MLflow): decided from the config, so every process agrees (sampling may span all of them)."""
    return trainer.wandb is not None or trainer.trackers.tensorboard is not None or trainer.trackers.mlflow is not None


class Guarded:
    """A sink whose failure turns it off with one warning instead of ending the run."""

    def __init__(self, field: str, sink: Sink | None, resume_id: str | None = None) -> None:
        self.field, self.sink = field, sink
        self.resume_id = resume_id
        """The tracker's run for a resume to continue: the one it opened, else the one it was given
        (a tracker down for a while is continued once it is back)."""

    def call(self, method: str, *args: Any) -> None:
        if self.sink is None:
            return
        try:
            getattr(self.sink, method)(*args)
        except Exception as err:  # any failure of a tracker: the run and its journal go on
            self.fail(err)

    def fail(self, err: BaseException) -> None:
        log.warning(
            "trainer.trackers.%s failed (%s: %s); it is off for the rest of this run, whose journal keeps every record",
            self.field,
            type(err).__name__,
            err,
        )
        self.sink = None


def open_sinks(
    trainer: TrainerConfig,
    name: str,
    directory: epath.Path,
    *,
    config: Mapping[str, Any],
    run_record: epath.Path | None,
    history: Sequence[Mapping[str, Any]],
    resume_step: int | None,
    mlflow_id: str | None,
) -> list[Guarded]:
    """The trackers ``trainer.trackers`` turns on, opened for run ``name`` whose tracking folder is
    ``directory``; ``config`` is what the run reports as its config (the record, the summary, the
    step count), ``history`` the journal's history before this segment. A tracker that fails to open
    is warned about and left off."""
    t = trainer.trackers
    opened: list[Guarded] = []
    openers: list[tuple[str, Any]] = []
    if t.csv is not None:
        openers.append(("csv", lambda: CsvSink(directory / METRICS_CSV, history, resume_step)))
    if t.tensorboard is not None:
        board = t.tensorboard
        openers.append(("tensorboard", lambda: TensorBoardSink(board, name, directory, config, resume_step)))
    if t.mlflow is not None:
        flow = t.mlflow
        openers.append(("mlflow", lambda: MLflowSink(flow, name, config, run_record, mlflow_id)))
    for field, opener in openers:
        guarded = Guarded(field, None, mlflow_id if field == "mlflow" else None)
        try:
            guarded.sink = opener()
            guarded.resume_id = guarded.sink.resume_id or guarded.resume_id
        except Exception as err:  # a tracker that cannot open: the run goes on without it
            guarded.fail(err)
        opened.append(guarded)
    return opened


# ------------------------------------------------------------------------------------------------ CSV


class CsvSink(Sink):
    """``metrics.csv``: one row per metric record of the journal's history (a step logged twice, the
    report and an evaluation, is two rows, as in the journal), a column per metric in the order
    they first appear. A new metric rewrites the file with its column; a resume rewrites it from the
    journal's history as the reader keeps it (steps past the resumed one dropped), then appends."""

    def __init__(self, path: epath.Path, history: Sequence[Mapping[str, Any]], resume_step: int | None) -> None:
        self.path = path
        # This segment's start event drops every earlier record; its resume event at s drops those past s.
        self.rows = [
            dict(r) for r in history if "event" not in r and resume_step is not None and r["step"] <= resume_step
        ]
        self.columns: list[str] = ["step", "time"]
        for row in self.rows:
            self._grow(row)
        self._file: Any = None
        self._rewrite()

    def _grow(self, row: Mapping[str, Any]) -> bool:
        new = [k for k in row if k not in self.columns]
        self.columns += new
        return bool(new)

    def _rewrite(self) -> None:
        """The whole file again (a new column, or the history at a resume), written beside it and
        renamed over it, so a reader never sees half of it."""
        if self._file is not None:
            self._file.close()
        text = io.StringIO()
        writer = csv.DictWriter(text, self.columns, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.parent / f".{self.path.name}.tmp"
        tmp.write_text(text.getvalue())
        tmp.replace(self.path)
        self._file = self.path.open("a", encoding="utf-8")

    def metrics(self, record: Mapping[str, Any]) -> None:
        row = dict(record)
        self.rows.append(row)
        if self._grow(row):
            self._rewrite()
            return
        writer = csv.DictWriter(self._file, self.columns, restval="", lineterminator="\n")
        writer.writerow(row)
        self._file.flush()

    def close(self, ended: str) -> None:
        self._file.close()


def read_csv(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """The rows of a ``metrics.csv`` as numbers (``step`` an int), a metric a row lacks left out."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = []
        for row in csv.DictReader(f):
            rows.append({k: (int(v) if k == "step" else float(v)) for k, v in row.items() if v != ""})
        return rows


# ---------------------------------------------------------------------------------------- TensorBoard


class TensorBoardSink(Sink):
    """Event files in ``<tracking folder>/tensorboard`` (or ``<directory>/<name>``): a scalar per
    metric, the config as text at the first step, each evaluation's samples as an image (or text)."""

    def __init__(
        self,
        board: TensorBoard,
        name: str,
        directory: epath.Path,
        config: Mapping[str, Any],
        resume_step: int | None,
    ) -> None:
        from tensorboardX import SummaryWriter  # heavy: only a run that turns TensorBoard on loads it

        folder = os.path.join(board.directory, name) if board.directory is not None else directory / "tensorboard"
        start = 0 if resume_step is None else resume_step + 1
        # purge_step: a SessionLog START event at ``start``, on which TensorBoard's reader drops every
        # event at or past it that came before: what a killed process logged past the resumed
        # checkpoint, or a whole earlier attempt.
        self.writer = SummaryWriter(logdir=os.fspath(folder), flush_secs=30, purge_step=start)
        text = json.dumps(config, indent=2, default=str)
        self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), global_step=start)

    def metrics(self, record: Mapping[str, Any]) -> None:
        for key, value in record.items():
            if key not in ("step", "time"):
                self.writer.add_scalar(key, float(value), global_step=record["step"], walltime=record["time"])

    def image(self, step: int, path: str) -> None:
        import numpy as np
        from PIL import Image

        with Image.open(path) as picture:
            pixels = np.asarray(picture.convert("RGB"))
        self.writer.add_image("samples", pixels, global_step=step, dataformats="HWC")

    def texts(self, step: int, texts: Sequence[str]) -> None:
        self.writer.add_text(
            "samples", "\n\n".join("    " + t.replace("\n", "\n    ") for t in texts), global_step=step
        )

    def close(self, ended: str) -> None:
        self.writer.close()


# --------------------------------------------------------------------------------------------- MLflow

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


class MLflowSink(Sink):
    """One MLflow run: params from the config (flattened), the metrics by step, ``run.json`` and the
    samples as artifacts. With ``run_id`` (a resume) the same run continues: params it lacks are
    added (an MLflow param never changes), and only steps past the last it holds are logged."""

    STATUS: ClassVar[dict[str, str]] = {"finished": "FINISHED", "failed": "FAILED", "stopped": "KILLED"}
    """MLflow's run status for each way a run ends."""

    def __init__(
        self,
        flow: MLflow,
        name: str,
        config: Mapping[str, Any],
        run_record: epath.Path | None,
        run_id: str | None,
    ) -> None:
        from mlflow import MlflowClient  # heavy: only a run that turns MLflow on loads it
        from mlflow.entities import Param

        self.client = MlflowClient(tracking_uri=flow.tracking_uri)  # None: MLFLOW_TRACKING_URI, else MLflow's
        self.logged_to = -1
        """The last step the MLflow run holds: a resumed run logs the steps past it."""
        if run_id is not None:
            run = self.client.get_run(run_id)
            self.client.update_run(run_id, status="RUNNING")
            held = set(run.data.params)
            for key in run.data.metrics:
                self.logged_to = max([self.logged_to, *(m.step for m in self.client.get_metric_history(run_id, key))])
        else:
            run = self.client.create_run(self._experiment(flow), run_name=name, tags={"dew.run": name})
            held = set()
        self.run_id: str = run.info.run_id
        # The record's fields by their dotted paths (``trainer.steps``), the summary and the length beside them.
        flat = flatten(config.get("run", {})) | flatten({k: v for k, v in config.items() if k != "run"})
        params = [Param(k, v) for k, v in flat.items() if k not in held]
        for i in range(0, len(params), 100):  # the most params one request takes
            self.client.log_batch(self.run_id, params=params[i : i + 100])
        if run_record is not None and run_record.exists():
            self.client.log_text(self.run_id, run_record.read_text(), run_record.name)

    def _experiment(self, flow: MLflow) -> str:
        """The id of the experiment the run joins (created if new): ``experiment``, else
        MLFLOW_EXPERIMENT_NAME, else MLFLOW_EXPERIMENT_ID or MLflow's default experiment."""
        name = flow.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if name is None:
            return os.environ.get("MLFLOW_EXPERIMENT_ID", "0")
        found = self.client.get_experiment_by_name(name)
        return found.experiment_id if found is not None else self.client.create_experiment(name)

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


def _number(value: object) -> float:
    """A metric value; the journal's non-finite strings ("nan") back to floats."""
    return float(value) if isinstance(value, (int, float, str)) else math.nan
