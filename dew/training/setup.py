"""A run's set-up, done once before it trains: everything about the run that can fail checked
without touching the disk, the process prepared, the stop signals listened to, the run directory's
lock taken and its record written. ``RunConfig.train`` from Python and ``dew-train`` both do it in
one call, ``set_up``: dew-train passes what it does in the middle (converting its config and loading
the data once the process pool is up) and how its processes agree on a verdict between checking and
writing. Nothing is remembered between runs: a notebook that trains many runs sets each up once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
from etils import epath
from flax import nnx

from dew.contract.config import STEP_LIMIT, RunConfig, TrainerConfig
from dew.contract.data import Dataset, eval_sources
from dew.contract.journal import JournalError, read
from dew.contract.models import of
from dew.contract.rundir import JOURNAL
from dew.objectives.base import Metric, Objective
from dew.objectives.metrics import builtin_metrics
from dew.training import adapt, assembly, early_stopping, preflight, sharding, task_evals
from dew.training.checkpointing import warmstart
from dew.training.evaluate import check_named, check_sources, produced
from dew.training.extension import Extension, check_length, record_length
from dew.training.hooks import from_config
from dew.training.optim.build import Optimizer, build_optimizer
from dew.training.preemption import StopSignals
from dew.training.process import prepare_process
from dew.training.ramp import run_tokens_seen
from dew.training.reporting import trackers
from dew.training.reporting.tracker import launched, tracking_dir
from dew.training.run_directory import (
    RunDirError,
    hold,
    prepare_run_dir,
    read_record,
    record_tokenizer,
    resume_changes,
    run_dir,
    trained_objective,
)


@dataclasses.dataclass(frozen=True)
class Setup:
    """What a run's set-up checked and prepared, handed to the trainer."""

    name: str
    """The run's name under ``trainer.checkpoint_dir``."""
    path: epath.Path
    """The run directory."""
    total_steps: int
    """The run's length in steps, batch ramp and epochs resolved."""
    eval_every: int | None
    """Steps between evaluations (None: at the end only)."""
    ckpt_every: int | None
    """Steps between checkpoints (None: at the end only)."""
    trains: str | None
    """The objective the run trains, by its knob section (``rundir.trained_objective``)."""
    changed: list[str]
    """Settings a resume changed, as ``path: old -> new`` (empty for a new run)."""
    stop: StopSignals
    """The stop signals' handlers, installed before the set-up so a signal during it or during the
    restore is honoured at the first step boundary."""
    extension: Extension | None = None
    """A resume that trains the run further (or less far): its length changed (``dew.training.extension``)."""
    began: float = 0.0
    """When this start of the run was launched (``dew.training.reporting.tracker.launched``): the
    goodput ledger's start of its start-up."""


def start_process(t: TrainerConfig) -> None:
    """Check ``trainer.xla_flags`` (XLA aborts the process on a flag it does not know), then apply
    the flags, the compilation cache and the process pool, before anything opens a JAX backend."""
    preflight.check_xla_flags(t)
    prepare_process(t)


def check(
    run: RunConfig,
    objective: Objective,
    dataset: Dataset,
    *,
    metrics: Sequence[Metric] | None = None,
    device_count: int | None = None,
    process_count: int | None = None,
) -> tuple[int, int | None, int | None]:
    """Everything about a run that can fail before it starts, checked without touching the disk or
    allocating the model: the batch the dataset was loaded at, the run's length and cadences, the
    value early stopping watches against those the evaluations report (with ``metrics``, the ones
    the run evaluates; None: dew-train's, ``builtin_metrics``), the mesh and the batch split, and
    the optimizer over the model's (abstract) parameters.

    Returns the run's total steps and its evaluation and checkpoint intervals. With
    ``device_count``, the mesh is an abstract one over that many devices (the launching process of
    a sweep checks its jobs so, without opening an accelerator), held by ``process_count``
    processes where the launcher knows how many tasks a job starts.
    """
    t = run.trainer
    if dataset.batch_size != t.batch_size:
        raise ValueError(
            f"the dataset was loaded at batch {dataset.batch_size}, but trainer.batch_size="
            f"{t.batch_size}: the run would train at a batch it does not report; load it at "
            "trainer.batch_size"
        )
    total_steps = t.total_steps(dataset)
    if total_steps > STEP_LIMIT:
        raise ValueError(
            f"trainer.epochs={t.epochs} is {total_steps} steps at trainer.batch_size={t.batch_size}, "
            f"more than the {STEP_LIMIT} a run can take"
        )
    preflight.check_attention(run)
    from_config(t.hooks)  # each named hook is registered and takes its options
    evaluated = builtin_metrics(objective) if metrics is None else metrics
    early_stopping.check(t.early_stopping, objective, evaluated, eval_sources(dataset), evals=t.evals)
    if t.evals is not None:  # the best checkpoint's value: one the run's evaluations report, by the same rule
        values = produced(objective, evaluated, eval_sources(dataset), t.evals)
        check_named("trainer.evals.best", t.evals.best, values)
    check_sources(eval_sources(dataset), [task.name for task in t.evals.tasks] if t.evals is not None else [])
    trackers.check(t, tracking_dir(t))  # trainer.trackers: each one's library, and where it writes
    eval_every = t.eval_interval(dataset)
    ckpt_every = t.checkpoint_interval(dataset)
    # device_count: a launcher's check, before its processes exist
    mesh = assembly.mesh_of(t) if device_count is None else assembly.planned_mesh(t, device_count)
    assembly.check_batches(
        t,
        mesh,
        [(batch, "trainer.batch_size" if batch == t.batch_size else "trainer.batch_ramp") for batch, _ in t.stages()],
        process_count=process_count,
    )
    task_evals.check(t, objective, mesh, process_count)  # trainer.evals: read, tokenized, its batch split
    abstract = nnx.eval_shape(lambda: adapt.build_model(run, objective))
    warmstart.check(run, abstract)  # trainer.init_from: the source fits, before anything is written
    sharding.param_specs(nnx.state(abstract, nnx.Param), mesh, t.layout)  # each split divides
    run_optimizer(run, dataset, nnx.state(abstract, adapt.trainable(run.lora)), total_steps)
    return total_steps, eval_every, ckpt_every


def run_optimizer(run: RunConfig, dataset: Dataset, params: nnx.State, total_steps: int) -> Optimizer:
    """The run's optimizer over ``params``, its schedule counting the tokens the batch ramp feeds."""
    return build_optimizer(
        run.optim,
        params,
        total_steps=total_steps,
        tokens_seen=run_tokens_seen(run.trainer, dataset),
        architecture=of(run.model.architecture, run.model.fields()),
    )


def check_setup(
    run: RunConfig,
    objective: Objective,
    dataset: Dataset,
    name: str,
    stop: StopSignals,
    metrics: Sequence[Metric] | None = None,
    began: float = 0.0,
) -> Setup:
    """Check the run (evaluated with ``metrics``: ``check``) and its run directory (reading only: a
    refused resume changes nothing, the lock included); the process must be started
    (``start_process``). ``began``: when this start of the run was launched (``Setup.began``)."""
    total_steps, eval_every, ckpt_every = check(run, objective, dataset, metrics=metrics)
    place = check_run_dir(run, objective, dataset, name, main=jax.process_index() == 0)
    return Setup(
        name, place.path, total_steps, eval_every, ckpt_every, place.trains, place.changed, stop, place.extension, began
    )


class RunDirCheck(NamedTuple):
    """What the run directory's checks found."""

    path: epath.Path
    trains: str | None
    """The objective the run trains, by its knob section (``rundir.trained_objective``)."""
    changed: list[str]
    """Settings a resume changes, as ``path: old -> new`` (empty for a new run)."""
    extension: Extension | None
    """A resume that changes the run's length (``dew.training.extension``), or None."""


def check_run_dir(run: RunConfig, objective: Objective, dataset: Dataset, name: str, *, main: bool) -> RunDirCheck:
    """The run directory's checks, reading only, for a run's set-up and a launcher's check of its
    jobs alike: the checkpoint directory, a record there that the run may resume (the settings a
    resume may change, a length its schedule allows) and, on the process that writes (``main``),
    the run directory's record and the journal a resume appends to."""
    path = run_dir(run, name)
    preflight.check_checkpoint_dir(run.trainer, path)
    trains = trained_objective(run, objective)
    recorded = read_record(path)
    if main:
        prepare_run_dir(run, name, write=False, trains=trains)
        check_journal(tracking_dir(run.trainer) / name / JOURNAL)
    changed = resume_changes(recorded, run.to_dict(), trains)[0] if recorded is not None else []
    extension = check_length(run, recorded, dataset, path) if recorded is not None else None
    return RunDirCheck(path, trains, changed, extension)


def check_journal(path: epath.Path) -> None:
    """Refuse a run whose journal cannot be read (a damaged line, a newer version): a resume appends
    to it, and reads its history first (docs/journal.md)."""
    try:
        if path.exists():
            read(path)
    except JournalError as err:
        raise RunDirError(f"the run's journal cannot be read, so the run is not resumed: {err}") from None


def claim(run: RunConfig, setup: Setup, held: contextlib.ExitStack) -> None:
    """Take the run directory's lock until ``held`` closes and write the run's record (process 0:
    one writer per run directory)."""
    if jax.process_index() == 0:
        held.enter_context(hold(setup.path))
        prepare_run_dir(run, setup.name, write=True, trains=setup.trains)
        if setup.extension is not None:
            record_length(setup.path, run)


def listen(held: contextlib.ExitStack) -> StopSignals:
    """The stop signals' handlers, installed until ``held`` closes."""
    stop = StopSignals().install()
    held.callback(stop.restore)
    return stop


class Planned(NamedTuple):
    """What a run trains: the resolved config, the objective, the dataset and the run's name."""

    run: RunConfig
    objective: Objective
    dataset: Dataset
    name: str


def alone(error: Exception | None) -> None:
    """The verdict of a process that needs no one's agreement: its own (``set_up``'s ``agree``)."""


def set_up(
    trainer: TrainerConfig,
    held: contextlib.ExitStack,
    plan: Callable[[], Planned],
    *,
    agree: Callable[[Exception | None], None] = alone,
    metrics: Sequence[Metric] | None = None,
) -> tuple[Planned, Setup]:
    """The whole set-up of a run, once, for ``RunConfig.train`` and ``dew-train`` alike: the process
    (XLA flags, the compilation cache, the pool) before any backend opens, the stop signals, then
    ``plan()`` (what the run trains: dew-train converts its config and loads the data here, once the
    pool is up), the checks (reading only), ``agree`` (the processes of a pool agree on the verdict:
    called with this process's error or None; it raises to stop a process whose peer failed), and
    the claim: the run directory's lock and record. The lock and the signal handlers are held until
    ``held`` closes. ``metrics``: the ones the run evaluates (``RunConfig.train``'s; None: dew-train's)."""
    set_up_at = time.time()
    start_process(trainer)
    stop = listen(held)  # before the checks: a signal from here on stops the run at its first step
    stop.limit(trainer.max_time_seconds())  # trainer.max_time, counted from here: restore and compilation too
    try:
        planned = plan()
        # reads only: a refused resume changes nothing
        setup = check_setup(*planned, stop, metrics, launched(set_up_at))
    except Exception as err:
        agree(err)
        raise
    agree(None)
    claim(planned.run, setup, held)
    if jax.process_index() == 0:
        record_tokenizer(setup.path, planned.dataset)
    return planned, setup
