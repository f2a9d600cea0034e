"""``RunConfig.train``: the training loop, read top to bottom.

Chapters: (1) the process and the run directory, (2) the model, the optimizer and the mesh, (3) the
compiled step and evaluation, (4) resume from the latest checkpoint, (5) the loop: batches in,
metrics one step late, evaluation, checkpoints, (6) the end: final evaluation and checkpoint.

The step is a pure function of (state, batch), jitted once per batch shape with the state donated
(docs/architecture.md: ``jax.jit`` over the split state, not ``nnx.jit``); the loop around it is where I/O
happens. It runs at most one step ahead of the devices: before it dispatches step s+1 it waits for
step s-1 (a small output of it, never the donated state), so the devices always have a step queued
and a signal is honoured within two steps of its arrival (preemption.py). Beyond that it waits on the
device only to fetch metrics every ``log_every`` steps (one step late) and to evaluate or checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import nnx
from jax.sharding import NamedSharding

from dew.config import STEP_LIMIT, RunConfig
from dew.data.base import Dataset
from dew.models.registry import of
from dew.objectives.base import Metric, Objective
from dew.training import adapt, preflight, sharding
from dew.training.checkpoint import BEST_METRIC, Checkpoints
from dew.training.optim import build_optimizer
from dew.training.preemption import Preempted, StopSignals
from dew.training.process import compilation_cache_stats, prepare_process
from dew.training.report import RunReport, log_samples
from dew.training.step import NONFINITE, TrainState, make_eval_step, make_train_step
from dew.training.rundir import (
    hold, is_local, prepare_run_dir, read_record, resume_changes, run_dir, trained_objective,
)
from dew.training.tracking import Throughput, Tracker, peak_flops

log = logging.getLogger("dew")


class NonFiniteError(FloatingPointError):
    """The loss or the gradients stopped being finite."""


COMPILER_OPTIONS: dict[str, Any] = {}
"""XLA options the step and the evaluation compile with; empty keeps XLA's defaults. (dew's tests
lower the CPU backend's optimisation level here: the tiny steps they train compile 3x faster.)"""


# ------------------------------------------------------------------------------------ the batch ramp


def stage_at(stages: Sequence[tuple[int, int]], step: int) -> int:
    """The index of the ramp stage that ``step`` trains in."""
    for i, (_, steps) in enumerate(stages):
        if steps == 0 or step < steps:
            return i
        step -= steps
    return len(stages) - 1


def tokens_seen_fn(stages: Sequence[tuple[int, int]], tokens_per_record: float) -> Callable[[jax.Array], jax.Array]:
    """Tokens (records, for data without tokens) consumed before a step, batch ramp included."""

    def tokens_seen(step: jax.Array) -> jax.Array:
        step = jnp.asarray(step, jnp.float32)
        total, start = jnp.zeros((), jnp.float32), 0.0
        for batch, steps in stages:
            span = jnp.clip(step - start, 0.0, steps if steps else jnp.inf)
            total = total + span * batch
            start += steps
        return total * tokens_per_record

    return tokens_seen


def best_criterion(metrics: Sequence[Metric]) -> tuple[str, bool]:
    """The key that chooses the best checkpoint and whether higher is better: the metric marked
    ``best``, else ``eval/loss``. Names must be unique, and at most one metric is marked."""
    names = [m.name for m in metrics]
    if len(set(names)) != len(names) or "loss" in names:
        raise ValueError(f"metrics: names must be unique and not 'loss' (eval/loss is the objective's); got {names}")
    best = [m for m in metrics if m.best]
    if len(best) > 1:
        raise ValueError(f"metrics: {[m.name for m in best]} are all marked best; one metric chooses the best "
                         "checkpoint")
    return (f"eval/{best[0].name}", best[0].higher_is_better) if best else (BEST_METRIC, False)


# ------------------------------------------------------------------------------------------ train


_checked: list[tuple[RunConfig, Objective, Dataset, tuple[int, int | None, int | None]]] = []
"""The last run ``check`` passed, by identity: ``dew-train`` checks a run before it writes the run
directory, then ``RunConfig.train`` asks again for the very same objects and gets the answer without
building the abstract model and the optimizer a second time."""


def check(run: RunConfig, objective: Objective, dataset: Dataset) -> tuple[int, int | None, int | None]:
    """Everything about a run that can fail before it starts, checked without touching the disk or
    allocating the model: the batch the dataset was loaded at, the run's length and cadences, the
    mesh and the batch split, and the optimizer over the model's (abstract) parameters.

    Returns the run's total steps and its evaluation and checkpoint intervals.
    """
    if _checked and all(x is y for x, y in zip(_checked[0][:3], (run, objective, dataset), strict=True)):
        return _checked[0][3]
    result = _check(run, objective, dataset)
    _checked[:] = [(run, objective, dataset, result)]
    return result


def _check(run: RunConfig, objective: Objective, dataset: Dataset) -> tuple[int, int | None, int | None]:
    t = run.trainer
    if dataset.batch_size != t.batch_size:
        raise ValueError(f"the dataset was loaded at batch {dataset.batch_size}, but trainer.batch_size="
                         f"{t.batch_size}: the run would train at a batch it does not report; load it at "
                         "trainer.batch_size")
    total_steps = t.total_steps(dataset)
    if total_steps > STEP_LIMIT:
        raise ValueError(f"trainer.epochs={t.epochs} is {total_steps} steps at trainer.batch_size={t.batch_size}, "
                         f"more than the {STEP_LIMIT} a run can take")
    preflight.check_attention(run)
    eval_every = t.eval_interval(dataset)
    ckpt_every = t.checkpoint_interval(dataset)
    mesh = sharding.make_mesh(t)
    for batch, _ in t.stages():
        sharding.check_batch(batch // t.accumulation, mesh, t.layout,
                             field="trainer.batch_size" if batch == t.batch_size else "trainer.batch_ramp")
    abstract = nnx.eval_shape(lambda: adapt.build_model(run, objective))
    sharding.param_specs(nnx.state(abstract, nnx.Param), mesh, t.layout)  # each split divides
    _optimizer(run, dataset, nnx.state(abstract, adapt.trainable(run.lora)), total_steps)
    return total_steps, eval_every, ckpt_every


def _optimizer(run: RunConfig, dataset: Dataset, params: Any, total_steps: int) -> Any:
    tokens_per_record = float(getattr(dataset, "tokens_per_record", 1) or 1)
    return build_optimizer(run.optim, params, total_steps=total_steps,
                           tokens_seen=tokens_seen_fn(run.trainer.stages(), tokens_per_record),
                           architecture=of(run.model.architecture, run.model.fields()))


def compile_train_step(objective: Objective, optimizer: Any, t: Any, mesh: Any, state_sharding: Any,
                       batch_sharding: NamedSharding) -> Callable[[TrainState, Any], tuple[TrainState, dict]]:
    """The train step, jitted over the mesh with the state donated; traced under the layout's rules,
    so the models' activation constraints (dew.models.axes) apply."""
    graphdef, rest = state_sharding.graphdef, state_sharding.rest
    return jax.jit(
        sharding.under_rules(mesh, t.layout, make_train_step(
            objective, graphdef, rest, optimizer.tx, optimizer.learning_rate,
            accumulation=t.accumulation, dynamic_scale=t.dynamic_scale, extra_args=optimizer.extra_args)),
        in_shardings=(state_sharding, batch_sharding), out_shardings=(state_sharding, None),
        compiler_options=COMPILER_OPTIONS or None,
        donate_argnums=0)


def train(run: RunConfig, objective: Objective, dataset: Dataset, *, name: str,
          metrics: Sequence[Metric] = (), summary: Mapping[str, object] | None = None) -> TrainState:
    """Train ``objective`` on ``dataset`` as ``run`` says (``RunConfig.train``); ``metrics`` are
    evaluated beside the loss (``eval/<name>``) and one marked ``best`` chooses the best checkpoint."""
    with contextlib.ExitStack() as held:  # the run directory's lock, released however the run ends
        return _train(run, objective, dataset, name=name, metrics=metrics, summary=summary, held=held)


def _train(run: RunConfig, objective: Objective, dataset: Dataset, *, name: str, metrics: Sequence[Metric],
           summary: Mapping[str, object] | None, held: contextlib.ExitStack) -> TrainState:
    t = run.trainer

    # (1) Check everything that can be checked before the run directory is touched. ---------------
    preflight.check_xla_flags(t)  # XLA would abort the process on a flag it does not know
    prepare_process(t)  # before anything opens a JAX backend
    total_steps, eval_every, ckpt_every = check(run, objective, dataset)
    best_metric, higher_is_better = best_criterion(metrics)
    is_main = jax.process_index() == 0
    trains = trained_objective(run, objective)
    recorded = read_record(run_dir(run, name))
    if is_main:
        preflight.check_checkpoint_dir(t, run_dir(run, name))
        prepare_run_dir(run, name, write=False, trains=trains)  # a refused resume changes nothing, the lock included
        held.enter_context(hold(run_dir(run, name)))  # one writer: held until the run ends
    path = prepare_run_dir(run, name, write=is_main, trains=trains)
    changed = resume_changes(recorded, run.to_dict(), trains)[0] if recorded is not None else []
    _log_to_file(path)
    checkpoints = Checkpoints(path, keep=t.keep, best_metric=best_metric, higher_is_better=higher_is_better)

    # (2) The model, the optimizer and the mesh. -------------------------------------------------
    mesh = sharding.make_mesh(t)
    stages = t.stages()
    graphdef, params, rest = adapt.init_model(run, objective)
    optimizer = _optimizer(run, dataset, params, total_steps)

    def init_state(params: Any) -> TrainState:
        return TrainState.create(params, optimizer.tx, seed=t.seed, ema=objective.ema_decay > 0,
                                 dynamic_scale=t.dynamic_scale)

    # One compiled program lays the whole state out on the mesh (not one eager op per leaf), each
    # leaf as the logical axes of its parameter and trainer.layout.rules say.
    state_sharding = sharding.state_sharding(jax.eval_shape(init_state, params), params, mesh, t.layout)
    state = jax.jit(init_state, out_shardings=state_sharding)(params).replace(graphdef=graphdef, rest=rest)
    state_sharding = state_sharding.replace(graphdef=graphdef, rest=rest)
    batch_sharding = sharding.batch_sharding(mesh, t.layout)

    # (3) The compiled step and evaluation. ----------------------------------------------------
    # Traced under the rules, so the models' activation constraints (dew.models.axes) apply.
    train_step = compile_train_step(objective, optimizer, t, mesh, state_sharding, batch_sharding)
    eval_step = jax.jit(sharding.under_rules(mesh, t.layout, make_eval_step(objective, graphdef, rest, metrics)),
                        in_shardings=(state_sharding.params, batch_sharding, None),
                        compiler_options=COMPILER_OPTIONS or None)
    eval_key = jax.random.PRNGKey(t.seed + 2)

    def derived(values: Mapping[str, float]) -> dict[str, float]:
        """Metrics an objective derives from the reported means (next_token's perplexity)."""
        derive = getattr(objective, "derived_metrics", None)
        return dict(derive(values)) if derive is not None else {}

    def evaluate(state: TrainState) -> dict[str, float]:
        sums: dict[str, jax.Array] = {}
        metric_sums: dict[str, tuple[jax.Array, jax.Array]] = {}
        total = count = 0.0
        for i, batch in enumerate(dataset.eval_batches(jax.process_index(), jax.process_count())):
            out_total, out_count, out_sums, out_metrics = eval_step(
                state.params, _global(batch, batch_sharding), jax.random.fold_in(eval_key, i))
            total, count = total + out_total, count + out_count
            for k, v in out_sums.items():
                sums[k] = sums.get(k, 0.0) + v
            for k, (v, n) in out_metrics.items():  # sums and counts, divided once at the end
                before = metric_sums.get(k, (0.0, 0.0))
                metric_sums[k] = (before[0] + v, before[1] + n)
        total, count, sums, metric_sums = jax.device_get((total, count, sums, metric_sums))
        if not count:
            return {}
        values = {BEST_METRIC: float(total / count), **{f"eval/{k}": float(v / count) for k, v in sums.items()}}
        for k, (v, n) in metric_sums.items():
            if f"eval/{k}" in values:
                raise ValueError(f"metric {k!r}: the objective already reports eval/{k}; name the metric otherwise")
            values[f"eval/{k}"] = float(v / n) if n else float("nan")
        return {**values, **derived(values)}

    # (4) Resume from the latest checkpoint. -----------------------------------------------------
    iterator = dataset.iterator(jax.process_index(), jax.process_count())
    latest = checkpoints.latest_step()
    records, wandb_id, fallbacks = 0, None, []
    if latest is not None:
        latest, state, meta, fallbacks = checkpoints.restore_intact(state, move_damaged=is_main)
        state = state.replace(graphdef=graphdef, rest=rest)
        records, wandb_id = meta["records"], meta.get("wandb_id")
        if meta.get("data") is not None:
            iterator.set_state(meta["data"])
        log.info("resuming %s from step %d (%d records consumed)", name, latest, records)
    step = int(jax.device_get(state.step))
    if latest is not None and step >= total_steps:  # a finished run launched again: nothing to do
        log.info("%s already completed its %d steps; nothing to train", name, total_steps)
        checkpoints.close()
        return state
    tracker = Tracker(t, name, record=run.to_dict(), summary=summary or {}, total_steps=total_steps,
                      resume_step=latest, wandb_id=wandb_id, is_main=is_main, changed=changed)
    for f in fallbacks:
        tracker.event("checkpoint_fallback", step=latest, damaged_step=f.damaged_step, problem=f.problem,
                      **({"moved_to": f.moved_to} if f.moved_to else {}))
    story = RunReport(run, name, path, total_steps=total_steps)
    story.start(mesh=mesh, params=state.params, opt_state=state.opt_state, resumed_from=latest)

    def meta() -> dict[str, Any]:
        data_state = iterator.get_state() if dataset.resumable else None
        return {"step": step, "records": records, "data": _plain(data_state), "wandb_id": tracker.wandb_id,
                "ramp_stage": stage_at(stages, step), "total_steps": total_steps}

    def check_finite(state: TrainState) -> None:
        bad = int(jax.device_get(state.nonfinite_step))
        if bad >= 0:
            checkpoints.wait()  # a save in flight holds an earlier, finite state: let it land
            last = checkpoints.latest_step()
            where = f"step {last} in {checkpoints.step_path(last)}" if last is not None else "none was saved"
            raise NonFiniteError(f"the loss or the gradients became non-finite at step {bad + 1}; the run "
                                 f"stops. The last good checkpoint, left intact: {where}")

    # (5) The loop. ---------------------------------------------------------------------------------
    pending: tuple[int, int, dict[str, jax.Array]] | None = None  # (step, records, metrics) to fetch
    previous: dict[str, jax.Array] = {}  # the metrics of the step before the one just dispatched
    meter = Throughput(flops_per_example=_flops_per_example(run), peak_flops=peak_flops(
        jax.devices()[0].device_kind, run.model.dtype, jax.device_count()))
    last_eval: dict[str, float] = {}
    last_saved = latest
    profiling = False
    stop = StopSignals()  # SIGUSR2 / SIGTERM / SIGINT: save at the next step boundary, then stop

    def report() -> None:
        nonlocal pending
        if pending is not None:
            logged_step, logged_records, values = pending
            pending = None
            fetched = {k: float(v) for k, v in jax.device_get(values).items()}
            if fetched.pop(NONFINITE) >= 0:
                check_finite(state)
            tracker.metrics(logged_step, {**fetched, **derived(fetched), **meter.measure(logged_records)})

    try:
        stop.install()
        while step < total_steps:
            if t.profile is not None and step == t.profile.warmup and not profiling:
                jax.profiler.start_trace(os.path.expanduser(t.profile.directory))
                profiling = True
            batch_size = stages[stage_at(stages, step)][0]
            batch = _global(iterator.next(batch_size), batch_sharding)
            first = story.starting_step()
            with jax.profiler.StepTraceAnnotation("train", step_num=step):
                state, step_metrics = train_step(state, batch)
            # Step s is queued behind s-1: wait for s-1, so the host leads the devices by one step
            # and a stop, a save or a progress line is about steps the devices have run.
            jax.block_until_ready(previous)
            previous = step_metrics
            step, records = step + 1, records + batch_size
            if first:  # the first metrics come after the first step, whatever log_every is
                story.first_step(step, jax.device_get(step_metrics), show=step % t.log_every != 0)
            if profiling and step >= t.profile.warmup + t.profile.steps:
                jax.block_until_ready(state)
                jax.profiler.stop_trace()
                profiling = False
            report()  # the previous log step's metrics, fetched one step late: no host sync per step
            if step % t.log_every == 0 or step == total_steps:
                pending = (step, records, step_metrics)
            at_end = step == total_steps
            eval_now = eval_every is not None and (step % eval_every == 0) or at_end
            ckpt_now = ckpt_every is not None and (step % ckpt_every == 0) or at_end
            if eval_now or ckpt_now:
                report()
                check_finite(state)  # a checkpoint holds only a state that never went non-finite
            if eval_now:
                with story.phase("eval"):
                    last_eval = evaluate(state)
                    if t.wandb is not None:  # every process: sampling may span all of them
                        log_samples(tracker, objective, state, step, seed=t.seed)
                story.evaluated(step, last_eval)
                tracker.metrics(step, last_eval)
                tracker.event("eval", step=step, **last_eval)
            if ckpt_now:
                with story.phase("checkpoint"):
                    checkpoints.save(step, state, meta(), metrics=last_eval if eval_now and last_eval else None)
                tracker.event("checkpoint", step=step)
                last_saved = step
            if eval_now or ckpt_now:
                meter.restart(records)  # evaluation and the save's copy are not step time
            if not at_end and stop.stop_at(step):  # the same step on every process (preemption.py)
                report()
                check_finite(state)
                if last_saved != step:
                    checkpoints.save(step, state, meta(), metrics=None)
                    tracker.event("checkpoint", step=step)
                checkpoints.wait()
                stopped = Preempted(stop.reason, step, stop.received, checkpoints.step_path(step))
                tracker.event("stop", step=step, reason=stop.reason, message=str(stopped))
                log.warning("%s", stopped)
                raise stopped
        report()
        check_finite(state)

        # (6) The end: wait for the saves, publish the last checkpoint. ----------------------------
        with story.phase("checkpoint"):
            checkpoints.wait()
            if checkpoints.latest_step() is None or checkpoints.latest_step() < step:
                checkpoints.save(step, state, meta(), metrics=last_eval or None)
                checkpoints.wait()
        tracker.publish_checkpoint(name, checkpoints.step_path(step), step)
        cache = compilation_cache_stats()
        if t.compilation_cache_dir:
            log.info("compilation cache %s: %d hits, %d misses", t.compilation_cache_dir, cache["hits"], cache["misses"])
        tracker.event("end", step=step, best_step=checkpoints.best_step(), compile_cache=cache)
        story.end(step)
    except Preempted:
        raise  # its stop event is written where the signal is honoured
    except NonFiniteError as err:
        tracker.event("stop", step=step, reason="nonfinite", message=str(err))
        raise
    except Exception as err:
        tracker.event("stop", step=step, reason="error", message=f"{type(err).__name__}: {err}")
        raise
    finally:
        stop.restore()
        if profiling:
            jax.profiler.stop_trace()
        checkpoints.close()
        tracker.close()
    return state


def _flops_per_example(run: RunConfig) -> float | None:
    """Training FLOPs of one example (``dew.models.flops``), None for an architecture it does not
    count."""
    from dew.models.flops import flops_per_example

    try:
        return flops_per_example(run.model.architecture, run.model.fields())
    except (KeyError, ValueError, TypeError) as err:
        log.info("no FLOP count for %s (%s): perf/mfu is not logged", run.model.architecture, err)
        return None


def _global(batch: Mapping[str, np.ndarray], batch_sharding: NamedSharding) -> dict[str, jax.Array]:
    """This process's part of a global batch, as global arrays laid out over the batch axes."""
    if jax.process_count() == 1:  # the whole batch is here: one transfer, as a hand-written loop does
        return jax.device_put(dict(batch), batch_sharding)
    return {k: jax.make_array_from_process_local_data(batch_sharding, np.asarray(v)) for k, v in batch.items()}


def _plain(value: Any) -> Any:
    """A JSON-safe copy of an iterator state (NumPy scalars to Python numbers)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _log_to_file(path: epath.Path) -> None:
    """Append process 0's log to ``<run>/train.log``; the other processes log to their standard
    streams only (under submitit, one log file per task in the sweep's .submitit/)."""
    if jax.process_index() != 0:
        return
    if not is_local(os.fspath(path)):  # a logging.FileHandler streams to a local file only
        log.info("the run directory %s is not local: no train.log (the journal and stderr have the log)", path)
        return
    filename = os.fspath(path / "train.log")
    root = logging.getLogger()
    if any(getattr(h, "baseFilename", None) == os.path.abspath(filename) for h in root.handlers):
        return
    handler = logging.FileHandler(filename)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] %(message)s"))
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)


