"""W&B (``trainer.wandb``, which the API contract names): a W&B run per dew run, its id kept in each
checkpoint so that a resume continues it. wandb is imported only when a run turns it on."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dew.contract.config import Wandb
from dew.contract.trackers import trackers
from dew.training.reporting.trackers import Sink, TrackedRun
from dew.training.run_directory import is_local

if TYPE_CHECKING:
    from dew.contract.config import TrainerConfig

ARTIFACT_NAME_MAX = 128
"""The longest artifact name the W&B registry takes."""


def artifact_name(name: str) -> str:
    """The W&B artifact name of run ``name``: slashes and spaces become ``-`` (the spec's rule), and
    so does every other character the registry refuses (it takes letters, digits, ``-``, ``_`` and
    ``.``: a sweep job's ``lr=0.001,seed=1`` holds two it refuses). A name that needed a replacement
    ends with 8 hex digits of the original's SHA-256, so two runs whose names differ only where
    characters were replaced (``a/b`` and ``a b``) still publish two artifacts."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", name)
    if safe == name and len(name) <= ARTIFACT_NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{safe[: ARTIFACT_NAME_MAX - len(digest) - 1]}-{digest}"


@trackers.register("wandb")
class WandbSink(Sink):
    """A W&B run under the run's name, with the record, the summary and the step count as its
    config: every metric, each evaluation's samples (an image, or a table of texts), and the
    checkpoint the run ends on as a model artifact (by reference: no copy)."""

    Options = Wandb
    libraries = ("wandb",)
    install = "pip install wandb"

    def __init__(self, options: Wandb, run: TrackedRun) -> None:
        import wandb  # heavy: only a run that reports to W&B loads it

        self.run = wandb.init(
            project=options.project,
            entity=options.entity,
            name=run.name,
            id=run.resume_id,
            resume="allow",
            mode="offline" if options.offline else "online",
            # W&B keeps its files on a local disk: beside the journal, or in its default ./wandb
            # when the tracking directory is not local (gs://).
            dir=os.fspath(run.directory) if is_local(os.fspath(run.directory)) else None,
            config=dict(run.config),
        )

    @classmethod
    def field(cls) -> str:
        return "trainer.wandb"

    @classmethod
    def options(cls, trainer: TrainerConfig) -> Wandb | None:
        return trainer.wandb

    @property
    def resume_id(self) -> str | None:
        return str(self.run.id)

    def metrics(self, record: Mapping[str, Any]) -> None:
        step = record["step"]
        if step > (self.run.starting_step or 0) - 1:  # a resumed W&B run takes no step before its own
            self.run.log({k: v for k, v in record.items() if k not in ("step", "time")}, step=step)

    def image(self, step: int, path: str) -> None:
        import wandb

        self.run.log({"samples": wandb.Image(path, caption=f"step {step}")}, step=step)

    def texts(self, step: int, texts: Sequence[str]) -> None:
        import wandb

        self.run.log({"samples": wandb.Table(columns=["sample"], data=[[t] for t in texts])}, step=step)

    def checkpoint(self, name: str, path: str, step: int) -> None:
        import wandb

        artifact = wandb.Artifact(artifact_name(name), type="model", metadata={"step": step, "run": name})
        artifact.add_reference(f"file://{os.path.abspath(path)}" if is_local(path) else path)
        self.run.log_artifact(artifact)

    def close(self, ended: str) -> None:
        self.run.finish()
