"""trainer.trackers: TensorBoard, MLflow and CSV get what the journal gets, read back with each
tool's own reader (TensorBoard's EventAccumulator, an ``mlflow server`` this module starts, the csv
module), for a run that fails at step 5 and the run that resumes it from its checkpoint at step 3."""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dew.contract.journal import read
from dew.training.hooks import At, Hook, hooks
from dew.training.reporting.trackers.csv import read_csv
from tests.training.conftest import compose, train_tiny

FAILED: set[int] = set()
"""The steps ``fail_once_at`` has failed at, in this process."""


@hooks.register("fail_once_at")
class FailOnceAt(Hook):
    """Raise at ``step`` the first time a run reaches it: a run that fails after logging past its
    last checkpoint, which the same command resumes."""

    def __init__(self, every: int | None = 1, step: int = 0) -> None:
        super().__init__(every)
        self.step = step

    def on_step(self, at: At) -> None:
        if at.step == self.step and self.step not in FAILED:
            FAILED.add(self.step)
            raise RuntimeError(f"failing at step {at.step}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An ``mlflow server`` on 127.0.0.1 with a SQLite backend, killed (its whole group) at the end."""
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "art")]
    with open(root / "server.log", "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=1).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()}") from None
                time.sleep(0.2)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


RUN = [
    "trainer.steps=6",
    "trainer.eval_every=3",
    "trainer.checkpoint_every=3",
    "trainer.hooks=[{name: fail_once_at, options: {step: 5}}]",
    "trainer/trackers=[tensorboard,mlflow,csv]",
    "trainer.trackers.mlflow.experiment=dew-tests",
]


@pytest.mark.slow
def test_a_failed_run_and_its_resume_reach_tensorboard_mlflow_and_csv_as_the_journal(
    tmp_path: Path, mlflow_server: str, monkeypatch: pytest.MonkeyPatch
):
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = tmp_path / "board"
    first = [
        *RUN,
        f"trainer.trackers.tensorboard.directory={board}",
        f"trainer.trackers.mlflow.tracking_uri={mlflow_server}",
    ]
    with pytest.raises(RuntimeError, match="failing at step 5"):
        train_tiny(tmp_path, *first)
    client = MlflowClient(mlflow_server)
    [failed] = client.search_runs([client.get_experiment_by_name("dew-tests").experiment_id])
    assert failed.info.status == "FAILED" and failed.info.run_name == "run"
    # The resume takes the server from MLFLOW_TRACKING_URI (a tracker's settings may change on resume).
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    _, run_dir, _ = train_tiny(tmp_path, *RUN, f"trainer.trackers.tensorboard.directory={board}")

    view = read(tmp_path / "tracking" / "run" / "journal.jsonl")
    history = [r for r in view.history() if "event" not in r]
    assert [r["event"] for r in view.written if r.get("event") in ("start", "stop", "resume", "end")] == [
        "start",
        "stop",
        "resume",
        "end",
    ]
    written = [r for r in view.written if "event" not in r]
    assert len(written) > len(history)  # the failed run logged step 4 past its checkpoint at 3: dropped

    # CSV: the journal's history, row for row.
    rows = read_csv(tmp_path / "tracking" / "run" / "metrics.csv")
    assert rows == [{k: float(v) if k != "step" else v for k, v in r.items()} for r in history]

    # TensorBoard: every scalar of the history, by its own reader (the failed run's step 4 dropped).
    events = EventAccumulator(str(board / "run"))
    events.Reload()
    series = {key: view.series(key) for key in view.metric_names()}
    assert set(events.Tags()["scalars"]) == set(series)
    for key, (steps, values) in series.items():
        scalars = events.Scalars(key)
        assert [s.step for s in scalars] == steps, key
        assert [s.value for s in scalars] == pytest.approx(values, rel=1e-6), key
    assert [e.step for e in events.Images("samples")] == [3, 6]
    assert events.Tensors("config/text_summary")

    # MLflow: the same run, resumed: params, the metrics of every step, run.json and the samples.
    [run] = client.search_runs([failed.info.experiment_id])
    assert run.info.run_id == failed.info.run_id and run.info.status == "FINISHED"
    recipe = compose()
    assert (
        run.data.params["trainer.steps"] == "6" and run.data.params["model.architecture"] == recipe.model.architecture
    )
    assert run.data.params["trainer.trackers.mlflow.experiment"] == "dew-tests"
    # MLflow cannot take back what the failed run logged past its checkpoint (step 4): the resumed
    # run logs the steps past the last one MLflow holds, so each step is there once, as first logged.
    first: dict[str, dict[int, float]] = {}
    for r in written:
        for key, value in r.items():
            if key not in ("step", "time"):
                first.setdefault(key, {}).setdefault(r["step"], value)
    assert set(first) == set(series)
    for key, kept in first.items():
        logged = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        assert logged == sorted(kept.items()), key
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"run.json", "samples"}
    assert {a.path for a in client.list_artifacts(run.info.run_id, "samples")} == {"samples/3.png", "samples/6.png"}
    record = client.download_artifacts(run.info.run_id, "run.json", str(tmp_path / "dl"))
    assert Path(record).read_text() == (run_dir / "run.json").read_text()


def test_a_tracker_that_fails_is_warned_about_once_and_the_journal_keeps_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    import wandb

    from dew.training.reporting.tracker import Tracker

    def no_network(**kwargs: object) -> None:
        raise ConnectionError("wandb.init: no network")

    monkeypatch.setattr(wandb, "init", no_network)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    trainer = compose(
        f"trainer.checkpoint_dir={tmp_path / 'ck'}",
        "trainer/trackers=[mlflow,csv,wandb]",
        f"trainer.trackers.mlflow.tracking_uri=http://127.0.0.1:{_free_port()}",  # nothing listens there
    ).trainer
    with caplog.at_level(logging.WARNING, logger="dew"):
        tracker = Tracker(
            trainer, "r", record={}, summary={}, total_steps=3, resume_step=None, wandb_id=None, is_main=True
        )
        for step in (1, 2, 3):
            tracker.metrics(step, {"train/loss": 1.0 / step, "train/lr": math.nan})
        tracker.event("end", step=3)
        tracker.close()
    warnings = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert len(warnings) == 2, warnings  # one for each tracker that failed, however often it was called
    assert warnings[0].startswith("trainer.trackers.mlflow failed (MlflowException: ")
    assert warnings[1].startswith("trainer.wandb failed (ConnectionError: wandb.init: no network)")
    history = read(tmp_path / "tracking" / "r" / "journal.jsonl").history()
    assert [r["step"] for r in history if "event" not in r] == [1, 2, 3]
    rows = read_csv(tmp_path / "tracking" / "r" / "metrics.csv")
    assert [(r["step"], r["train/loss"]) for r in rows] == [(1, 1.0), (2, 0.5), (3, 1 / 3)]
    assert all(math.isnan(r["train/lr"]) for r in rows)


def test_a_tracker_that_cannot_work_is_refused_before_the_run_starts(monkeypatch: pytest.MonkeyPatch):
    from etils import epath

    from dew.training.reporting import trackers
    from dew.training.reporting.trackers.mlflow import MLflowSink

    trainer = compose("trainer/trackers=[tensorboard,mlflow]").trainer
    trackers.check(trainer, epath.Path("/tmp/tracking"))  # both installed (the test extra), a local folder
    with pytest.raises(ValueError, match=r"^trainer.trackers.tensorboard writes .* gs://b/tracking is not local: set"):
        trackers.check(trainer, epath.Path("gs://b/tracking"))
    monkeypatch.setattr(MLflowSink, "libraries", ("dew_not_a_library",))
    with pytest.raises(
        ValueError, match=r"^trainer.trackers.mlflow needs the dew_not_a_library package, .*dew\[trackers\]"
    ):
        trackers.check(trainer, epath.Path("/tmp/tracking"))
