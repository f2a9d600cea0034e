"""The line a run ends with says where everything went: the run directory, and the output of each
tracker the run turned on (TensorBoard's event files, the MLflow store, the CSV)."""

from __future__ import annotations

from pathlib import Path

import pytest
from etils import epath

from dew.contract.config import CSV, MLflow, TensorBoard, Trackers, TrainerConfig
from dew.training.reporting.trackers import destinations
from tests.training.conftest import TINY, dew_train


def test_each_tracker_names_where_it_writes(tmp_path: Path):
    tracking = epath.Path(tmp_path / "tracking" / "r")
    assert destinations(TrainerConfig(), "r", tracking) == []
    trainer = TrainerConfig(
        trackers=Trackers(
            tensorboard=TensorBoard(directory="/boards"),
            mlflow=MLflow(tracking_uri="http://mlflow:5000", experiment="digits"),
            csv=CSV(),
        )
    )
    assert destinations(trainer, "r", tracking) == [
        "TensorBoard in /boards/r",
        "MLflow at http://mlflow:5000 (digits)",
        f"CSV in {tracking / 'metrics.csv'}",
    ]


@pytest.mark.slow
def test_the_last_line_of_a_run_names_its_tracker_outputs(workdir: Path):
    done = dew_train(*TINY, "trainer.steps=2", "trainer/trackers=[tensorboard,csv]", cwd=workdir)
    assert done is not None and done.returncode == 0, done.stdout[-3000:]
    tracking = workdir / "tracking" / "digits"
    assert done.stdout.strip().splitlines()[-1] == (
        f"dew-train: run 'digits' is in {workdir / 'checkpoints' / 'digits'}; "
        f"TensorBoard in {tracking / 'tensorboard'}; CSV in {tracking / 'metrics.csv'}"
    )
    assert (tracking / "metrics.csv").is_file() and any((tracking / "tensorboard").iterdir())
