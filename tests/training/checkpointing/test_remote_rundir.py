"""A checkpoint_dir that is a URL (gs://) stays one: the run directory, the record, Hydra's record,
the journal and the samples go there through epath, and no local ``gs:`` folder appears.

The bucket is faked offline with ``etils.epath.testing.mock_epath``: every epath call on a
``gs://b/...`` path is served from a local folder standing for the bucket. Orbax's checkpoints are
not covered here: orbax writes array data with tensorstore, whose gs driver needs the network.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from etils import epath
from etils.epath import testing as epath_testing

from dew.config import TrainerConfig
from dew.contract.journal import read_journal
from dew.recipe import Recipe
from dew.training.reporting.tracker import Tracker, tracking_dir
from dew.training.run_directory import RunDirError, prepare_run_dir, run_dir, write_hydra_record

URL = "gs://b/runs"


@contextlib.contextmanager
def fake_bucket(folder: Path) -> Iterator[None]:
    """Serve every epath call on gs:// from ``folder`` (``gs://b/x`` is ``folder/b/x``)."""

    def local(path: object) -> str:
        text = os.fspath(path)
        return str(folder / text[len("gs://") :]) if text.startswith("gs://") else text

    one = lambda original, path, *args, **kwargs: original(local(path), *args, **kwargs)  # noqa: E731
    two = lambda original, src, dst, *args, **kwargs: original(local(src), local(dst), *args, **kwargs)  # noqa: E731
    with epath_testing.mock_epath(
        open=one,
        exists=one,
        isdir=one,
        listdir=one,
        makedirs=one,
        mkdir=one,
        remove=one,
        rmtree=one,
        stat=one,
        glob=one,
        walk=one,
        rename=two,
        replace=two,
        copy=two,
    ):
        yield


def test_a_gs_checkpoint_dir_takes_the_record_the_journal_and_the_samples(tmp_path, monkeypatch):
    cwd, bucket = tmp_path / "cwd", tmp_path / "bucket"
    cwd.mkdir(), bucket.mkdir()
    monkeypatch.chdir(cwd)
    run = Recipe(trainer=TrainerConfig(checkpoint_dir=URL, steps=2, compilation_cache_dir=None))
    with fake_bucket(bucket):
        path = run_dir(run, "exp/one")
        assert os.fspath(path) == "gs://b/runs/exp/one"
        with pytest.raises(RunDirError, match="escapes trainer.checkpoint_dir"):
            run_dir(run, "../elsewhere")

        # The record, and reading it back.
        prepare_run_dir(run, "exp/one")
        assert (bucket / "b/runs/exp/one/run.json").is_file()
        assert Recipe.load("gs://b/runs/exp/one") == run

        # Hydra's record of the command.
        from hydra import compose, initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra
        from hydra.core.hydra_config import HydraConfig

        from dew.commandline.configs import conf_dir, register_configs

        GlobalHydra.instance().clear()
        register_configs()
        with initialize_config_dir(config_dir=conf_dir(), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"trainer.checkpoint_dir={URL}"], return_hydra_config=True)
        HydraConfig.instance().set_config(cfg)
        write_hydra_record(path, cfg)
        assert sorted(p.name for p in (bucket / "b/runs/exp/one/.hydra").iterdir()) == [
            "config.yaml",
            "hydra.yaml",
            "overrides.yaml",
        ]

        # The journal, in the tracking directory beside checkpoint_dir.
        assert os.fspath(tracking_dir(run.trainer)) == "gs://b/tracking"
        tracker = Tracker(
            run.trainer,
            "exp/one",
            record=run.to_dict(),
            summary={},
            total_steps=2,
            resume_step=None,
            wandb_id=None,
            is_main=True,
        )
        tracker.metrics(1, {"train/loss": 0.5})
        tracker.close()
        assert (bucket / "b/tracking/exp/one/journal.jsonl").is_file()
        journal = read_journal("gs://b/tracking/exp/one/journal.jsonl")
        assert journal[0]["event"] == "start" and {k: v for k, v in journal[1].items() if k != "time"} == {
            "step": 1,
            "train/loss": 0.5,
        }

        # The samples a run ends with.
        from dew.sampling import write_grid, write_text_samples

        write_grid(os.fspath(path / "samples.png"), np.zeros((4, 8, 8, 1), np.uint8), rows=2)
        assert (bucket / "b/runs/exp/one/samples.png").read_bytes()[:4] == b"\x89PNG"

        class Texts:
            def sample_text(self, model, key):
                return None, ["ab", "cd"]

        write_text_samples(Texts(), None, path, seed=0)
        assert "--- sample 1 ---\ncd" in (bucket / "b/runs/exp/one/samples.txt").read_text()
        assert epath.Path("gs://b/runs/exp/one/samples.txt").exists()

    assert [p for p in tmp_path.rglob("*") if "gs:" in p.name] == []
    assert list(cwd.iterdir()) == []
