"""``RunConfig.train``: the training loop, read top to bottom.

Chapters: (1) the set-up, done once (``dew.training.setup``: checks, the process, the stop signals,
the run directory's lock and record), (2) the model, the optimizer and the mesh, (3) the compiled
step and evaluation, (4) resume from the latest checkpoint, (5) the loop: batches in (read and
placed on the mesh ahead, in a thread: ``trainer.prefetch``, prefetch.py), metrics one step late,
the hooks at their cadence, a stop, (6) the end: the last checkpoint published. What happens around
the steps is hooks (``dew.training.hooks``), each at its own cadence: the profiler (profiler.py),
the metric report (late_metrics.py), the evaluation (``Evaluate``, eval_hooks.py), the checkpoint
(``Saver``, saving.py), the samples, and those ``trainer.hooks`` names; the stop signals are
``StopSignals`` (preemption.py).

The step is a pure function of (state, batch), jitted once per batch shape with the state donated
(docs/architecture.md: ``jax.jit`` over the split state, not ``nnx.jit``); the loop around it is where I/O
happens. It runs at most one step ahead of the devices: before it dispatches step s+1 it waits for
step s-1 (a small output of it, never the donated state), so the devices always have a step queued
and a signal is honoured within two steps of its arrival (preemption.py). Beyond that it waits on the
device only to fetch metrics every ``log_every`` steps (one step late) and to evaluate or checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import jax
from etils import epath

from dew.contract.config import RunConfig, TrainerConfig
from dew.contract.data import BatchIterator, Dataset
from dew.contract.objectives import can_sample
from dew.contract.rundir import EARLY_STOP, EXTEND, RUN_RECORD
from dew.data.overfit import OverfitBatches
from dew.objectives.base import Metric, Objective
from dew.training import task_evals
from dew.training.assembly import Assembled, assemble
from dew.training.checkpointing.checkpoints import Checkpoints, Fallback
from dew.training.checkpointing.resume_check import ResumeCheck
from dew.training.checkpointing.saving import NonFiniteError, Saver, tracker_ids
from dew.training.early_stopping import EarlyStop, watched
from dew.training.eval_hooks import Evaluate, Samples, every_step
from dew.training.evaluate import Evaluator, best_criterion, derived_metrics
from dew.training.hooks import At, Hook, Hooks, Started, from_config
from dew.training.optim.mup import with_mup_groups
from dew.training.pace import Pace
from dew.training.preemption import Preempted, StopRequest, StopSignals
from dew.training.prefetch import Feed, feed_for
from dew.training.process import compilation_cache_stats, nan_checks_held
from dew.training.ramp import stage_at, tokens_seen_fn
from dew.training.reporting.late_metrics import Reporter
from dew.training.reporting.profiler import Profiler
from dew.training.reporting.progress import Progress
from dew.training.reporting.summary import RunReport, flops_per_example_of, log_to_file
from dew.training.reporting.tracker import Throughput, Tracker, peak_flops
from dew.training.reporting.trackers import takes_samples
from dew.training.setup import Planned, Setup, check, run_optimizer, set_up
from dew.training.step import TrainState
from dew.training.watchdog import Watchdog

__all__ = [
    "NonFiniteError",
    "Setup",
    "best_criterion",
    "check",
    "stage_at",
    "tokens_seen_fn",
    "train",
]

log = logging.getLogger("dew")


# ------------------------------------------------------------------------------------------ train


def train(
    run: RunConfig,
    objective: Objective,
    dataset: Dataset,
    *,
    name: str,
    metrics: Sequence[Metric] = (),
    summary: Mapping[str, object] | None = None,
    setup: Setup | None = None,
    hooks: Sequence[Hook] = (),
) -> TrainState:
    """Train ``objective`` on ``dataset`` as ``run`` says (``RunConfig.train``); ``metrics`` are
    evaluated beside the loss (``eval/<name>``) and one marked ``best`` chooses the best checkpoint.
    ``hooks`` run after those ``trainer.hooks`` names, before the checkpoint (a search's trial adds
    its pruning: ``dew.launching.search.pruning``), or after it where they ask (``Hook.after_checkpoint``).

    ``setup`` is what ``dew-train`` checked and prepared (``dew.training.setup``); without it, the
    run is set up here, its lock and signal handlers held until it ends."""
    criterion = best_criterion(metrics, run.trainer.evals)  # before anything is written
    run = with_mup_groups(run, objective)  # muP's groups, for a run built in Python too (dew.training.optim.mup)
    with contextlib.ExitStack() as held:
        # (1) The set-up: checks, the process, the stop signals, the run directory's lock and record.
        if setup is None:
            setup = set_up(run.trainer, held, lambda: Planned(run, objective, dataset, name), metrics=metrics)[1]
        return _train(
            run, objective, dataset, setup, metrics=metrics, summary=summary, criterion=criterion, hooks=hooks
        )


@dataclasses.dataclass
class Parts:
    """What the loop calls, built once before it."""

    train_step: Callable[..., tuple[TrainState, dict]]
    """``(state, batch, *, dynamics) -> (state, metrics)`` (``assembly.compile_train_step``)."""
    feed: Feed
    """Each step's batch, placed on the mesh, read ahead in the background (``trainer.prefetch``)."""
    story: RunReport
    tracker: Tracker
    hooks: Hooks
    """What happens around the steps, each at its cadence (dew.training.hooks)."""
    started: Started
    """What the hooks are told before the first step."""
    evaluate: Evaluate
    saver: Saver
    stop: StopSignals


def _train(
    run: RunConfig,
    objective: Objective,
    dataset: Dataset,
    setup: Setup,
    *,
    metrics: Sequence[Metric],
    summary: Mapping[str, object] | None,
    criterion: tuple[str, bool],
    hooks: Sequence[Hook],
) -> TrainState:
    t = run.trainer
    if t.overfit_batches is not None:  # debug=overfit: the first batches, again and again
        dataset = OverfitBatches(dataset, t.overfit_batches)
    to_file = log_to_file(setup.path)
    checkpoints = Checkpoints(setup.path, keep=t.keep, best_metric=criterion[0], higher_is_better=criterion[1])
    try:
        # (2) The model, the optimizer and the mesh; (3) the compiled step and evaluation.
        built = assemble(
            run,
            objective,
            lambda params: run_optimizer(run, dataset, params, setup.total_steps),
            metrics,
            run_dir=setup.path,
            resuming=checkpoints.latest_step() is not None,
        )
        # (4) Resume from the latest checkpoint.
        iterator = dataset.iterator(jax.process_index(), jax.process_count())
        state, latest, meta, fallbacks = _resume(checkpoints, built.state, iterator, setup.name)
        step = int(jax.device_get(state.step))
        if latest is not None and _ended(setup, step, meta):  # a run that ended, launched again: nothing to do
            return state
        tracker = _tracker(run, setup, summary, latest, meta)
        if latest is not None:
            _journal_fallbacks(tracker, latest, fallbacks)
        if (extension := setup.extension) is not None:  # trained further: dew.training.extension
            log.info("%s", extension.describe(setup.name))
            tracker.event(EXTEND, step=latest or 0, from_steps=extension.from_steps, to_steps=extension.to_steps)
        story = RunReport(
            run,
            setup.name,
            setup.path,
            total_steps=setup.total_steps,
            samples=can_sample(objective),
            every=(setup.eval_every, setup.ckpt_every),
            evaluates=getattr(dataset, "num_eval_records", None) != 0,
            best=criterion,
        )
        story.start(mesh=built.mesh, params=state.params, opt_state=state.opt_state, resumed_from=latest)
        story.began = tracker.began
        tracker.ledger = story.ledger  # every stop and end event says where this start's time went
        parts = _parts(
            run,
            objective,
            dataset,
            setup,
            checkpoints,
            tracker,
            story,
            iterator,
            latest,
            meta.get("hooks", {}),
            metrics=metrics,
            criterion=criterion,
            built=built,
            hooks=hooks,
        )
        return _run(parts, setup, t, state, Position(step, meta.get("records", 0)))
    finally:
        checkpoints.close()
        if to_file is not None:  # this run's log file takes this run's lines only (a notebook trains many)
            logging.getLogger().removeHandler(to_file)
            to_file.close()


def _tracker(
    run: RunConfig, setup: Setup, summary: Mapping[str, object] | None, latest: int | None, meta: Mapping[str, Any]
) -> Tracker:
    """The run's tracker (the journal, and the trackers the run turns on), continuing the runs a
    checkpoint's record names (``meta``) on a resume from ``latest``."""
    return Tracker(
        run.trainer,
        setup.name,
        record=run.to_dict(),
        summary=summary or {},
        total_steps=setup.total_steps,
        resume_step=latest,
        wandb_id=meta.get("wandb_id"),
        resume_ids=tracker_ids(meta),
        run_record=setup.path / RUN_RECORD,
        is_main=jax.process_index() == 0,
        changed=setup.changed,
        began=setup.began or None,
    )


def _watchdog(
    t: TrainerConfig, run_dir: epath.Path, phase: Callable[[str], AbstractContextManager[object]], saver: Saver
) -> tuple[list[Hook], Callable[[str], AbstractContextManager[object]]]:
    """``trainer.stall_timeout``'s watchdog (none where it is unset) and the run report's timed
    phases with the watchdog's around them; the saver's wait for its first save to land is untimed,
    as the save is."""
    if (timeout := t.stall_timeout_seconds()) is None:
        return [], phase
    watchdog = Watchdog(timeout, run_dir, process=jax.process_index(), count=jax.process_count())
    saver.untimed = watchdog.untimed
    return [watchdog], watchdog.timed(phase)


def _journal_fallbacks(tracker: Tracker, latest: int, fallbacks: Sequence[Fallback]) -> None:
    """One ``checkpoint_fallback`` event per damaged step the restore walked past to ``latest``."""
    for f in fallbacks:
        tracker.event(
            "checkpoint_fallback",
            step=latest,
            damaged_step=f.damaged_step,
            problem=f.problem,
            **({"moved_to": f.moved_to} if f.moved_to else {}),
        )


def _ended(setup: Setup, step: int, meta: Mapping[str, Any]) -> bool:
    """Whether the checkpoint resumed from (at ``step``, with its record ``meta``) ends the run: its
    last step, or a stop request (early stopping) honoured there; says so in the log."""
    if step >= setup.total_steps:
        log.info("%s already completed its %d steps; nothing to train", setup.name, setup.total_steps)
        return True
    if (request := meta.get("stop_request")) is not None:
        log.info("%s stopped early at step %d (%s); nothing to train", setup.name, step, request["message"])
        return True
    return False


def _resume(
    checkpoints: Checkpoints, state: TrainState, iterator: BatchIterator, name: str
) -> tuple[TrainState, int | None, dict[str, Any], list]:
    """The state, the step restored (None for a new run), the checkpoint's record (``Saver.meta``:
    the records consumed, the W&B and MLflow run ids, the hooks' states; empty for a new run) and the damaged
    checkpoints walked past; the data iterator is put where the checkpoint left it."""
    if checkpoints.latest_step() is None:
        return state, None, {}, []
    latest, restored, meta, fallbacks = checkpoints.restore_intact(state, move_damaged=jax.process_index() == 0)
    restored = restored.replace(graphdef=state.graphdef, rest=state.rest)
    if meta.get("data") is not None:
        iterator.set_state(meta["data"])
    log.info("resuming %s from step %d (%d records consumed)", name, latest, meta["records"])
    return restored, latest, meta, fallbacks


def _parts(
    run: RunConfig,
    objective: Objective,
    dataset: Dataset,
    setup: Setup,
    checkpoints: Checkpoints,
    tracker: Tracker,
    story: RunReport,
    iterator: BatchIterator,
    latest: int | None,
    saved: Mapping[str, Any],
    *,
    metrics: Sequence[Metric],
    criterion: tuple[str, bool],
    built: Assembled,
    hooks: Sequence[Hook],
) -> Parts:
    """The loop's parts, each given what it reads, and its hooks in the order they run at a step
    (``saved``: the hooks' states in the checkpoint resumed from)."""
    t = run.trainer
    derive = functools.partial(derived_metrics, objective)
    evaluator = Evaluator.over(dataset, built.eval_step, built.place, seed=t.seed, derive=derive)
    meter = Throughput(
        flops_per_example=flops_per_example_of(run),
        peak_flops=peak_flops(jax.devices()[0].device_kind, run.model.dtype, jax.device_count()),
        tokens_per_example=getattr(dataset, "tokens_per_record", None),
    )
    # The data position a checkpoint saves is the feed's: that of the batches the steps took, not the
    # iterator's own, which has read ahead (dew.training.prefetch).
    feed = feed_for(t, iterator, built.place, resumable=dataset.resumable, start=latest or 0, end=setup.total_steps)
    story.data_wait = lambda: feed.waited_s
    saver = Saver(
        checkpoints,
        tracker,
        data_state=lambda: feed.position,
        stages=t.stages(),
        total_steps=setup.total_steps,
        last_saved=latest,
        every=setup.ckpt_every,
        unnamed=None if t.name or "/" in setup.name else setup.name,  # unnamed (a sweep's job: sweep/job)
    )
    tasks = task_evals.in_loop(t, objective, built.state.graphdef, built.state.rest, built.mesh, built.state.params)
    evaluate = Evaluate(evaluator, story, tracker, setup.eval_every, tasks, task_evals.due(t, setup.eval_every))
    watchdog, phase = _watchdog(t, setup.path, story.phase, saver)  # trainer.stall_timeout
    own: list[Hook] = [*watchdog, *([Profiler(t.profile)] if t.profile is not None else [])]
    progress = [Progress(t.log_every, setup.total_steps)] if tracker.is_main else []  # the console's lines
    own += [Reporter(tracker.metrics, measure=meter.measure, every=t.log_every), *progress, evaluate]
    if takes_samples(t):
        own.append(Samples(tracker, objective, t.seed, phase))
    if t.early_stopping is not None:
        tasks_reported = t.evals.values() if t.evals is not None else {}
        own.append(EarlyStop(t.early_stopping, *watched(t.early_stopping, metrics, criterion, t.evals), tasks_reported))
    # The checkpoint comes last at a step, so that it holds what every hook decided there (but for
    # hooks that only read the state and ask to come after it: the final samples).
    last: list[Hook] = (
        [saver, ResumeCheck(saver, dataset.iterator, every=setup.ckpt_every)] if t.check_resume else [saver]
    )
    chain = Hooks(
        [*own, *from_config(t.hooks), *(h for h in hooks if not h.after_checkpoint), *last]
        + [h for h in hooks if h.after_checkpoint],
        derive=derive,
        check_finite=saver.check_finite,
        restart=meter.restart,
        phase=phase,
    )
    evaluate.told = chain.evaluated  # an evaluation tells every hook (the samples, early stopping, pruning)
    saver.hook_states = chain.states
    saver.requested = lambda: setup.stop.requested
    return Parts(
        train_step=built.train_step,
        feed=feed,
        story=story,
        tracker=tracker,
        hooks=chain,
        evaluate=evaluate,
        saver=saver,
        stop=setup.stop,
        started=Started(run, objective, tracker, latest or 0, setup.total_steps, setup.stop.request, saved),
    )


@dataclasses.dataclass
class Position:
    """Where the run is: steps dispatched, and records consumed by them."""

    step: int
    records: int


def _run(p: Parts, setup: Setup, t: TrainerConfig, state: TrainState, at: Position) -> TrainState:
    """The loop and the end, with the journal's ``stop`` event for a run that fails."""
    try:
        with p.hooks.held(), nan_checks_held():  # JAX's checks (trainer.debug_nans) on every call
            state = _loop(p, setup, t, state, at)
            _finish(p, setup, state, at, t)
    except Preempted:
        raise  # its stop event is written where the signal is honoured
    except NonFiniteError as err:  # dew's check, or JAX's in a step (trainer.debug_nans: _jax_check)
        p.tracker.event("stop", step=at.step, reason="nonfinite", message=str(err))
        raise
    except FloatingPointError as err:  # JAX's check (trainer.debug_nans) in a hook: an evaluation
        stop = p.saver.nonfinite(_found_by_jax(err, f"a hook after step {at.step}"))
        p.tracker.event("stop", step=at.step, reason="nonfinite", message=str(stop))
        raise stop from err
    except Exception as err:
        p.tracker.event("stop", step=at.step, reason="error", message=f"{type(err).__name__}: {err}")
        raise
    finally:
        p.feed.close()  # the reading thread ends by itself; a stop does not wait for it
        p.tracker.close()
    return state


def _loop(p: Parts, setup: Setup, t: TrainerConfig, state: TrainState, at: Position) -> TrainState:
    """(5) The loop: the state after the last step."""
    pace = Pace()
    p.hooks.start(p.started)
    while at.step < setup.total_steps:
        p.hooks.before(at.step)
        fed = p.feed.next()  # read and placed while the steps before ran (trainer.prefetch)
        first = p.story.starting_step()
        with jax.profiler.StepTraceAnnotation("train", step_num=at.step), _jax_check(p, at.step + 1, state):
            # the program that also measures the training dynamics at the steps that report them
            state, step_metrics = p.train_step(state, fed.batch, dynamics=every_step(t.dynamics_every, at.step + 1))
        # Step s is queued behind s-1: wait for s-1 (for s once steps are long), so the host leads the
        # devices by one step at most and a stop, a save or a progress line is about steps they have run.
        pace.wait(step_metrics)
        at.step, at.records = at.step + 1, at.records + fed.records
        last = at.step == setup.total_steps
        if first:  # the compile time, once the first step ran
            p.story.first_step(at.step, jax.device_get(step_metrics))
        # The hooks due at this step, in order: the profiler, the report and the progress line (the
        # previous log step's metrics, fetched one step late; this step's at once when steps are
        # long), the evaluation, the checkpoint, the run's own hooks.
        p.hooks.after(At(at.step, at.records, state, step_metrics, last), ready=first or pace.long)
        if not last and p.stop.stop_at(at.step):  # the same step on every process (preemption.py)
            p.hooks.flush(state)
            if p.stop.requested is None:  # a signal: save, and stop to be resumed
                raise p.saver.stopped(p.stop, at.step, at.records, state)
            _stopped_early(p, p.stop.requested, at.step)  # asked: the run ends here as a finished one
            break
    p.stop.settle(at.step)  # no boundary is left to stop at: a signal from here on is not passed on
    p.hooks.flush(state)
    p.saver.check_finite(state)
    return state


@contextlib.contextmanager
def _jax_check(p: Parts, step: int, state: TrainState) -> Iterator[None]:
    """The call of step ``step`` (1-based) on ``state``, where JAX's checks (``trainer.debug_nans``)
    raise when the step's output holds a NaN or an infinity: the previous step's metrics reported,
    then the run's ``NonFiniteError``, naming the step and the operation JAX's op-by-op re-run
    stopped at."""
    try:
        yield
    except FloatingPointError as err:
        p.hooks.flush(state)  # the last finite step's metrics (the state is not donated under the checks)
        raise p.saver.nonfinite(_found_by_jax(err, f"step {step}")) from err


def _found_by_jax(err: FloatingPointError, where: str) -> str:
    """One line: where JAX's check fired and what its op-by-op re-run found (the first line of its
    message: ``invalid value (nan) encountered in mul``)."""
    finding = str(err).splitlines()[0] if str(err) else type(err).__name__
    return f"jax_debug_nans: {where} made a non-finite value; re-run op by op: {finding}"


def _stopped_early(p: Parts, request: StopRequest, step: int) -> None:
    """The journal's ``early_stop`` event and the log line of a run that a stop request ends."""
    log.warning("stopping early at step %d: %s", step, request.message)
    p.tracker.event(EARLY_STOP, step=step, reason=request.reason, message=request.message, **request.details)


def _finish(p: Parts, setup: Setup, state: TrainState, at: Position, t: TrainerConfig) -> None:
    """(6) The end: wait for the saves, publish the last checkpoint, write the ``end`` event."""
    evaluation = p.evaluate.last if p.evaluate.step == at.step else {}  # a stop request may end a step without one
    with p.hooks.phase("checkpoint"):  # the run report's phase (and the watchdog's)
        p.saver.last(at.step, at.records, state, evaluation)
    p.tracker.publish_checkpoint(setup.name, p.saver.checkpoints.step_path(at.step), at.step)
    cache = compilation_cache_stats()
    if t.compilation_cache_dir:
        log.info("compilation cache %s: %d hits, %d misses", t.compilation_cache_dir, cache["hits"], cache["misses"])
    p.tracker.event("end", step=at.step, best_step=p.saver.checkpoints.best_step(), compile_cache=cache)
    p.story.end(at.step)
