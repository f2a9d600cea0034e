"""TensorBoard (``trainer.trackers.tensorboard``): event files written with tensorboardX
(``pip install 'dew[trackers]'``), imported only when a run turns it on."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dew.contract.config import TensorBoard
from dew.contract.trackers import trackers
from dew.training.reporting.trackers import Sink, TrackedRun
from dew.training.run_directory import is_local

if TYPE_CHECKING:
    from etils import epath


@trackers.register("tensorboard")
class TensorBoardSink(Sink):
    """Event files in ``<tracking folder>/tensorboard`` (or ``<directory>/<name>``): a scalar per
    metric, the config as text at the first step, each evaluation's samples as an image (or text).
    A resumed run restarts the event files at its step: TensorBoard's reader drops what a killed
    process logged past it."""

    Options = TensorBoard
    libraries = ("tensorboardX",)
    install = "pip install 'dew[trackers]'"

    def __init__(self, options: TensorBoard, run: TrackedRun) -> None:
        from tensorboardX import SummaryWriter  # heavy: only a run that turns TensorBoard on loads it

        start = 0 if run.resume_step is None else run.resume_step + 1
        # purge_step: a SessionLog START event at ``start``, on which TensorBoard's reader drops every
        # event at or past it that came before: what a killed process logged past the resumed
        # checkpoint, or a whole earlier attempt.
        self.writer = SummaryWriter(
            logdir=self.folder(options, run.name, run.directory), flush_secs=30, purge_step=start
        )
        text = json.dumps(run.config, indent=2, default=str)
        self.writer.add_text("config", "\n".join("    " + line for line in text.splitlines()), global_step=start)

    @staticmethod
    def folder(options: TensorBoard, name: str, directory: epath.Path) -> str:
        """The folder of run ``name``'s event files (``directory``: its tracking folder)."""
        return (
            os.path.join(options.directory, name)
            if options.directory is not None
            else os.fspath(directory / "tensorboard")
        )

    @classmethod
    def check(cls, options: TensorBoard, tracking: epath.Path) -> None:
        if options.directory is None and not is_local(os.fspath(tracking)):
            raise ValueError(
                f"trainer.trackers.tensorboard writes event files on a local disk, and the tracking folder "
                f"{os.fspath(tracking)} is not local: set trainer.trackers.tensorboard.directory to a local folder"
            )

    @classmethod
    def destination(cls, options: TensorBoard, name: str, tracking: epath.Path) -> str:
        return f"TensorBoard in {cls.folder(options, name, tracking)}"

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
