"""A tracker from a plugin package, with no edit to dew: docs/extending.md's ``ledger`` (the guide's
package, written from its code blocks with the ``.dist-info`` entry points an install writes, on
PYTHONPATH) receives every metric the journal holds, the run's config and its samples, for a run
of ``dew-train`` and for the run that resumes it."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from dew.contract.config import CSV, Trackers, TrainerConfig
from dew.contract.journal import read
from dew.contract.trackers import trackers
from dew.contract.typed import ConfigError, from_json, to_json
from dew.training.checkpointing.saving import tracker_ids
from dew.training.reporting.tracker import Tracker
from dew.training.reporting.trackers import Sink, TrackedRun
from dew.training.reporting.trackers.wandb import WandbSink
from tests.conftest import REPO
from tests.test_extending import install
from tests.training.conftest import TINY, dew_train, fast_env

RUN = [*TINY, "trainer.eval_every=2", "trainer.checkpoint_every=2", "trainer/trackers=[csv,ledger]"]


@pytest.mark.slow
def test_a_plugin_tracker_receives_every_metric_the_config_and_the_samples_of_a_run_and_its_resume(tmp_path: Path):
    site = install(tmp_path / "site")
    env = fast_env(PYTHONPATH=os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")]))
    work = tmp_path / "work"
    work.mkdir()
    ledger = tmp_path / "ledger"
    records = []
    for steps in (2, 4):  # the run, then the same run trained further: a resume from its step 2
        args = [*RUN, f"trainer.steps={steps}", f"trainer.trackers.plugins.ledger.folder={ledger}"]
        done = dew_train(*args, cwd=work, env=env)
        assert done is not None and done.returncode == 0, (work / "dew-train.out").read_text()[-3000:]
        assert done.stdout.strip().splitlines()[-1].endswith(f"; ledger in {ledger}")  # its destination
        records.append(json.loads((work / "checkpoints" / "digits" / "run.json").read_text()))
    lines = [json.loads(line) for line in (ledger / "ledger.jsonl").read_text().splitlines()]

    # The config: each segment's, as its run.json holds it, and where it starts.
    opened = [line["opened"] for line in lines if "opened" in line]
    assert [(o["run"], o["resume_step"], o["config"]["total_steps"]) for o in opened] == [
        ("digits", None, 2),
        ("digits", 2, 4),
    ]
    assert [o["config"]["run"] for o in opened] == records
    assert records[0]["trainer"]["trackers"]["plugins"] == {"ledger": {"folder": str(ledger)}}

    # Every metric record the journal holds, number for number, in order, across both segments.
    view = read(work / "tracking" / "digits" / "journal.jsonl")
    journal_metrics = [r for r in view.written if "event" not in r]
    received = [line["metrics"] for line in lines if "metrics" in line]
    assert received == journal_metrics
    assert {r["step"] for r in received} == {1, 2, 3, 4} and [r for r in view.history() if "event" not in r] == received
    assert {"train/loss", "train/lr", "eval/loss"} <= {k for r in received for k in r}

    # The samples of each evaluation: the grid the run wrote, copied; each segment closed as finished.
    images = [line["image"] for line in lines if "image" in line]
    assert [i["step"] for i in images] == [2, 4]
    for image in images:
        grid = work / "tracking" / "digits" / "samples" / f"{image['step']}.png"
        assert Path(image["file"]).read_bytes() == grid.read_bytes() and grid.stat().st_size > 0
    assert [line["closed"] for line in lines if "closed" in line] == ["finished", "finished"]
    # Its order: opened, the segment's records, closed, for each segment.
    kinds = [next(iter(line)) for line in lines]
    assert kinds[0] == "opened" and kinds[-1] == "closed" and kinds.count("opened") == kinds.count("closed") == 2
    assert kinds.index("closed") < kinds.index("opened", 1)


def test_reading_the_trackers_loads_none_of_their_libraries():
    """In a fresh interpreter: the registry read (dew's own trackers imported), a run's trackers
    checked and named with none turned on: no tracker's library, and no JAX, is loaded."""
    code = """
import sys
from etils import epath
from dew.config import TrainerConfig
from dew.training.reporting import trackers
names = [c.name for c in trackers.sink_classes()]
trackers.check(TrainerConfig(), epath.Path("/tmp/t"))
trackers.destinations(TrainerConfig(), "r", epath.Path("/tmp/t"))
print(names, sorted({m.split(".")[0] for m in sys.modules} & {"wandb", "mlflow", "tensorboardX", "jax", "PIL"}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['wandb', 'tensorboard', 'mlflow', 'csv'] []"


@dataclasses.dataclass(frozen=True)
class ProbeOptions:
    every: int = 1
    """A number, to be read and checked."""


class Probe(Sink):
    """A tracker of this module's own: it keeps what it is handed, fails where told, and gives the
    id of a run of its own."""

    Options = ProbeOptions
    opened: ClassVar[list[Probe]] = []

    def __init__(self, options: ProbeOptions, run: TrackedRun) -> None:
        self.options, self.run, self.records = options, run, []
        Probe.opened.append(self)

    def metrics(self, record: Mapping[str, Any]) -> None:
        if record["step"] == 2:
            raise ConnectionError("the probe's server is gone")
        self.records.append(dict(record))

    @property
    def resume_id(self) -> str:
        return f"probe-{len(Probe.opened)}"


@pytest.fixture
def probe() -> Iterator[type[Probe]]:
    trackers.register("probe")(Probe)
    Probe.opened.clear()
    try:
        yield Probe
    finally:
        trackers._entries.pop("probe", None)


def test_a_plugin_trackers_options_are_read_into_its_record_and_bad_ones_refused(probe: type[Probe]):
    assert Trackers(plugins={"probe": {}}).plugins == {"probe": ProbeOptions()}
    assert Trackers(plugins={"probe": None}).get("probe") is None  # null: off
    trainer = TrainerConfig(trackers=Trackers(csv=CSV(), plugins={"probe": {"every": 3}}))
    assert (trainer.trackers.get("probe"), trainer.trackers.get("csv"), trainer.trackers.get("mlflow")) == (
        ProbeOptions(every=3),
        CSV(),
        None,
    )
    record = to_json(trainer)
    assert record["trackers"]["plugins"] == {"probe": {"every": 3}}
    assert from_json(TrainerConfig, record) == trainer
    assert probe.field() == "trainer.trackers.plugins.probe" and WandbSink.field() == "trainer.wandb"
    refused = {
        "every": ({"probe": {"every": "3"}}, "trainer.trackers.plugins.probe.every: expected int, found str '3'"),
        "unknown key": (
            {"probe": {"evry": 3}},
            "trainer.trackers.plugins.probe.evry: unknown field of ProbeOptions; its fields are every",
        ),
        "unknown": ({"nope": {}}, "trainer.trackers.plugins.nope: unknown tracker 'nope'; plugin trackers: probe"),
        "own": ({"csv": {}}, "trainer.trackers.plugins.csv: csv is dew's own tracker, set as trainer.trackers.csv"),
    }
    for plugins, message in refused.values():
        with pytest.raises(ConfigError) as err:
            from_json(TrainerConfig, {**record, "trackers": {**record["trackers"], "plugins": plugins}})
        assert str(err.value) == message


def test_a_plugin_tracker_that_fails_is_warned_about_once_and_its_run_id_kept(
    probe: type[Probe], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setenv("DEW_TRACKING_DIR", str(tmp_path / "tracking"))
    trainer = TrainerConfig(checkpoint_dir=str(tmp_path / "ck"), trackers=Trackers(plugins={"probe": {}}))
    given = {"probe": "probe-0", "mlflow": None}
    other = Tracker(trainer, "r", record={}, summary={}, total_steps=3, resume_step=1, wandb_id=None, is_main=False)
    other.metrics(1, {"train/loss": 1.0})
    other.close()
    assert probe.opened == [] and not (tmp_path / "tracking").exists()  # only process 0 reports
    with caplog.at_level(logging.WARNING, logger="dew"):
        tracker = Tracker(
            trainer,
            "r",
            record={},
            summary={},
            total_steps=3,
            resume_step=1,
            wandb_id=None,
            is_main=True,
            resume_ids=given,
        )
        for step in (1, 2, 3):
            tracker.metrics(step, {"train/loss": 1.0 / step})
        tracker.close()
    [opened] = probe.opened
    assert (opened.run.resume_id, opened.run.resume_step, opened.run.name) == ("probe-0", 1, "r")
    assert [r["step"] for r in opened.records] == [1]  # off after its failure at step 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "trainer.trackers.plugins.probe failed (ConnectionError: the probe's server is gone); it is off for the "
        "rest of this run, whose journal keeps every record"
    ]
    assert [r["step"] for r in read(tmp_path / "tracking" / "r" / "journal.jsonl").written if "event" not in r] == [
        1,
        2,
        3,
    ]
    # The id of the probe's own run goes into each checkpoint, and a resume hands it back.
    assert tracker.resume_ids == {"probe": "probe-1"}
    assert tracker_ids({"wandb_id": None, "mlflow_id": "m", "tracker_ids": {"probe": "probe-1"}}) == {
        "mlflow": "m",
        "probe": "probe-1",
    }
