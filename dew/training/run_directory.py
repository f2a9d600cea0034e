"""The run directory: one run is one directory, ``<trainer.checkpoint_dir>/<name>/``.

It holds ``run.json`` (the resolved config), the orbax step directories, Hydra's ``.hydra/`` and
``train.log``. Starting a run whose directory already holds a record resumes it when the config is
the same, or differs only in settings that cannot change the training (``RESUME_FREE``, the knobs of
objectives the run does not train, sampling knobs) or in its length where the schedule allows
(``LENGTH``: training a run further, ``dew.training.extension``), and is refused, with the fields
that differ, when it is not: nothing is overwritten.

One process writes a run directory at a time: process 0 of the run holds its lock
(``dew.contract.lock``) from before it writes anything there until the run ends, and a second
writer is refused at once with the holder's host and PID.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import posixpath
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from etils import epath

from dew.contract.config import NoRunRecord, RunConfig, RunRecord, RunRecordError
from dew.contract.lock import RunLock, RunLockedError, describe, holder
from dew.contract.objectives import summary_name
from dew.contract.rundir import TOKENIZER_DIR
from dew.contract.typed import differences
from dew.data.tokenizer import save_record

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from dew.contract.data import Dataset
    from dew.objectives.base import Objective


class RunDirError(ValueError):
    """A run directory that cannot take this run."""


def is_local(path: str) -> bool:
    """Whether ``path`` is on this machine's filesystem, not a URL (``gs://bucket/runs``)."""
    return "://" not in path


def absolute(path: str) -> epath.Path:
    """``path`` made absolute when it is local; a URL as it is (``os.path.abspath`` would make
    ``gs://b/runs`` the local folder ``<cwd>/gs:/b/runs``)."""
    return epath.Path(os.path.abspath(path) if is_local(path) else path.rstrip("/"))


def run_dir(config: RunConfig, name: str) -> epath.Path:
    """``checkpoint_dir/name``, local or any filesystem epath reaches; a name that would escape
    checkpoint_dir is refused."""
    root = os.fspath(absolute(config.trainer.checkpoint_dir))
    scheme, _, rest = root.rpartition("://")
    inner = rest if scheme else root  # the path part of a URL: the same containment rule
    path = posixpath.normpath(posixpath.join(inner, name)) if scheme else os.path.abspath(os.path.join(root, name))
    if os.path.commonpath([inner, path]) != inner or path == inner:
        raise RunDirError(f"run name {name!r} escapes trainer.checkpoint_dir={config.trainer.checkpoint_dir!r}")
    return epath.Path(f"{scheme}://{path}" if scheme else path)


# ------------------------------------------------------------------------------ resume rules

RESUME_FREE: tuple[str, ...] = (
    "trainer.log_every",
    "trainer.eval_every",
    "trainer.checkpoint_every",
    "trainer.keep",
    "trainer.profile",
    "trainer.wandb",
    "trainer.trackers",
    "trainer.compilation_cache_dir",
    "trainer.multi_host",
    "trainer.mesh",
    "trainer.layout",
    "trainer.prefetch",
    "trainer.max_time",
    "trainer.stall_timeout",
    "trainer.name",
    "trainer.evals",
    "trainer.dynamics_every",
    "trainer.final_samples",
)
"""Settings a resume may change: they decide what is logged, evaluated, kept, traced, where it
reports, how the process starts, how long one start of it may run and how long it may stall, never
what a step computes.
The name is the run directory's, which a resume is in already: a run started without one is named
after the moment it started and resumed with ``trainer.name=run-<that moment>``.
(The best checkpoint is chosen among the evaluations a run makes, so eval_every changes which step
is best, not any parameter.) The mesh and the layout decide where each shard of the same
computation lives: the checkpoint restores into the new layout (tests/training/mesh_runs.py), and
only the order of floating-point reductions changes. How far ahead the batches are read (prefetch)
changes when a batch is read, not which. The downstream tasks (``trainer.evals``) are evaluations; the training dynamics
(``trainer.dynamics_every``) are measurements of the same update; the final samples
(``trainer.final_samples``) are drawn from the trained model."""

LENGTH: tuple[str, ...] = ("trainer.steps", "trainer.epochs")
"""The run's length: a resume may change it where the learning rate of every step already trained
stays the same at the new length (``dew.training.extension.check_length``, which the set-up calls
with the data and the checkpoint at hand); the record then takes the new length."""

SAMPLING_KNOBS: tuple[str, ...] = (
    "sampler",
    "sample_steps",
    "samples",
    "samples_per_class",
    "guidance_scale",
    "temperature",
    "top_k",
)
"""Knobs of an objective that only its sampler reads (the samples written at the end of a run):
a resume may change them for the objective it trains."""


def resume_blocks(path: str, trains: str | None, objectives: frozenset[str]) -> bool:
    """Whether a change at dotted ``path`` must refuse a resume: every setting that can change
    what the run computes does, except ``RESUME_FREE``, the knobs of objectives the run does not
    train (``trains``; ``objectives`` are the record's knob sections), ``SAMPLING_KNOBS`` and the
    run's ``LENGTH`` (whose change the set-up checks against the schedule).

    An unknown objective (``trains`` None) keeps every knob blocking."""
    if any(path == free or path.startswith(free + ".") for free in RESUME_FREE) or path in LENGTH:
        return False
    section, _, field = path.partition(".")
    if section in objectives and trains is not None:
        return section == trains and field.partition(".")[0] not in SAMPLING_KNOBS
    return True


def resume_changes(old: dict[str, Any], new: dict[str, Any], trains: str | None) -> tuple[list[str], list[str]]:
    """The differences between a run's record and the config that resumes it, as (accepted,
    refused) lists of ``path: old -> new``."""
    sections = frozenset(set(old) | set(new)) - {f.name for f in dataclasses.fields(RunConfig)}
    accepted: list[str] = []
    refused: list[str] = []
    for line in differences(old, new):
        (refused if resume_blocks(line.partition(":")[0], trains, sections) else accepted).append(line)
    return accepted, refused


def trained_objective(run: RunConfig, objective: Objective) -> str | None:
    """The objective a run trains, by the name of its knob section: ``run.objective``, else the one
    the built objective reports in its summary (``summary_name``)."""
    return run.objective or summary_name(objective)


def read_record(path: epath.Path) -> dict[str, Any] | None:
    """The run record in run directory ``path`` as written (``RunRecord``), None when there is none."""
    try:
        return RunRecord.read(path).values
    except NoRunRecord:
        return None
    except RunRecordError as err:
        raise RunDirError(f"{err.path}: unreadable run record, refusing to touch the run: {err.reason}") from None


def prepare_run_dir(config: RunConfig, name: str, *, write: bool = True, trains: str | None = None) -> epath.Path:
    """Check the run directory can take ``config`` and write the record there (before anything
    trains). The same config again is a resume, and so is one that differs only in settings a resume
    may change (``resume_blocks``; ``trains`` names the objective the run trains); any other
    difference is refused, nothing overwritten. The record keeps the config the run started with:
    it is what built the parameters; the trainer writes what a resume changed to the journal."""
    path = run_dir(config, name)
    old = read_record(path)
    if old is not None:
        _, refused = resume_changes(old, config.to_dict(), trains or config.objective)
        if refused:
            raise RunDirError(
                f"{path} already holds a run with a different config; nothing was changed. Fields that "
                "differ (recorded -> requested):\n  "
                + "\n  ".join(refused)
                + "\nResume it with the recorded config, or name a new run with trainer.name=..."
            )
        return path
    if write:
        config.save(os.fspath(path))
    return path


def record_tokenizer(path: epath.Path, dataset: Dataset) -> None:
    """Keep a token dataset's tokenizer in the run directory (``TOKENIZER_DIR``), for ``dew-sample``;
    a resume keeps the one the run started with. Nothing for other data, or a run directory that is
    not local."""
    record = getattr(dataset, "tokenizer", None)
    folder = path / TOKENIZER_DIR
    if isinstance(record, Mapping) and is_local(os.fspath(path)) and not folder.exists():
        save_record(record, os.fspath(folder))


@contextlib.contextmanager
def hold(path: str | os.PathLike) -> Iterator[None]:
    """Hold ``path``'s run-directory lock for the block; raises ``RunLockedError`` naming the holder
    when another process has it. The set-up takes it once per run (``dew.training.setup.claim``)."""
    lock = RunLock(path).acquire()
    try:
        yield
    finally:
        lock.release()


def refuse_if_held(path: str | os.PathLike) -> None:
    """Raise ``RunLockedError`` if another live process holds ``path`` (reads only: it takes and
    writes nothing, so it can run before a config is fully checked)."""
    key = os.path.abspath(os.fspath(path)) if "://" not in os.fspath(path) else os.fspath(path)
    who = holder(path, writer=True)  # a requeue of the same SLURM job takes its own lease
    if who is not None:
        raise RunLockedError(
            f"{key} is in use by {describe(who)}; a run directory takes one writer "
            "at a time. Wait for it to finish or stop it, or name another run with "
            "trainer.name=..."
        )


def write_hydra_record(path: epath.Path, cfg: DictConfig) -> None:
    """Write Hydra's record of the job (config, hydra config, overrides) to ``<run>/.hydra/``.

    Hydra is told to write nothing itself (conf/config.yaml) so that a bad input leaves no trace;
    this writes what it would have, once the run is known to be valid.
    """
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    hc = HydraConfig.get()
    folder = path / ".hydra"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    (folder / "hydra.yaml").write_text(OmegaConf.to_yaml({"hydra": hc}))
    (folder / "overrides.yaml").write_text(OmegaConf.to_yaml(list(hc.overrides.task)))
