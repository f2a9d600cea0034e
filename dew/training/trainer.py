"""``RunConfig.train``: the training loop, read top to bottom.

Chapters: (1) the process and the run directory, (2) the model, the optimizer and the mesh, (3) the
compiled step and evaluation, (4) resume from the latest checkpoint, (5) the loop: batches in,
metrics one step late, evaluation, checkpoints, (6) the end: final evaluation and checkpoint.

The step is a pure function of (state, batch), jitted once per batch shape with the state donated
(docs/architecture.md: ``jax.jit`` over the split state, not ``nnx.jit``); the loop around it is where I/O
happens, and it never waits on the device except to fetch metrics every ``log_every`` steps (one
step late) and to evaluate or checkpoint.
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
import optax
from etils import epath
from flax import nnx, struct
from jax.sharding import NamedSharding

from dew.config import STEP_LIMIT, RunConfig
from dew.data.base import Dataset
from dew.models.qk import LAYER as QK_LAYER
from dew.models.qk import qk_clip_layers
from dew.objectives.base import Loss, Metric, Objective
from dew.training import adapt, preflight, sharding
from dew.training.checkpoint import BEST_METRIC, Checkpoints
from dew.training.optim import build_optimizer
from dew.training.preemption import Preempted, StopSignals
from dew.training.process import compilation_cache_stats, prepare_process
from dew.training.report import RunReport, log_samples
from dew.training.rundir import (
    hold, is_local, prepare_run_dir, read_record, resume_changes, run_dir, trained_objective,
)
from dew.training.muon import QKClipLayer, qk_clip
from dew.training.tracking import Throughput, Tracker, peak_flops

log = logging.getLogger("dew")


class NonFiniteError(FloatingPointError):
    """The loss or the gradients stopped being finite."""


COMPILER_OPTIONS: dict[str, Any] = {}
"""XLA options the step and the evaluation compile with; empty keeps XLA's defaults. (dew's tests
lower the CPU backend's optimisation level here: the tiny steps they train compile 3x faster.)"""

NONFINITE = "_nonfinite_step"
"""The step's metric (not logged) that carries the first non-finite step, -1 while there is none."""


@struct.dataclass
class TrainState:
    """Everything a step changes. ``graphdef`` and ``rest`` (non-parameter module state) are static."""

    step: jax.Array
    params: Any
    opt_state: Any
    ema: Any
    key: jax.Array
    loss_scale: jax.Array
    good_steps: jax.Array
    nonfinite_step: jax.Array
    graphdef: Any = struct.field(pytree_node=False, default=None)
    rest: Any = struct.field(pytree_node=False, default=None)

    def model(self, *, ema: bool = False) -> nnx.Module:
        """The trained module (with the EMA of its parameters when ``ema`` and the run kept one)."""
        params = self.ema if ema and self.ema is not None else self.params
        return nnx.merge(self.graphdef, params, self.rest)


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


# -------------------------------------------------------------------------------------- the step


def make_train_step(objective: Objective, graphdef: Any, rest: Any, tx: optax.GradientTransformation,
                    learning_rate: Callable[[jax.Array], jax.Array], *, accumulation: int,
                    dynamic_scale: bool, qk_clip_tau: float | None = None,
                    qk_layers: Mapping[str, QKClipLayer] | None = None,
                    ) -> Callable[[TrainState, Mapping[str, jax.Array]], tuple[TrainState, dict]]:
    """The pure train step: micro-batches summed in one scan, one optimizer update.

    With ``qk_clip_tau`` (MuonClip), the loss also returns each attention head's largest logit; the
    maximum over the micro-batches (under ``jit`` over a sharded batch it is already global over the
    devices) caps the updated query and key projections (``qk_clip``, Kimi K2 section 2.1).
    """
    clip = qk_clip_tau is not None

    def loss_fn(params: Any, batch: Mapping[str, jax.Array], key: jax.Array, scale: jax.Array) -> tuple[jax.Array, Loss]:
        out = objective.loss(nnx.merge(graphdef, params, rest), batch, key, **({"max_logits": True} if clip else {}))
        if clip:
            out = out._replace(max_logits=jax.lax.stop_gradient(out.max_logits))
        return out.total * scale, out

    grad_fn = jax.grad(loss_fn, has_aux=True)

    def step(state: TrainState, batch: Mapping[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
        key = jax.random.fold_in(state.key, state.step)
        micro = jax.tree.map(lambda x: x.reshape(accumulation, x.shape[0] // accumulation, *x.shape[1:]), batch)

        def micro_step(grad_sum: Any, inputs: tuple[jax.Array, Any]) -> tuple[Any, Loss]:
            i, mb = inputs
            grads, out = grad_fn(state.params, mb, jax.random.fold_in(key, i), state.loss_scale)
            return jax.tree.map(jnp.add, grad_sum, grads), out

        if accumulation == 1:  # no scan of one: XLA fuses the step as a hand-written one
            grad_sum, out = grad_fn(state.params, batch, jax.random.fold_in(key, 0), state.loss_scale)
            outs = jax.tree.map(lambda x: x[None], out)
        else:
            zeros = jax.tree.map(jnp.zeros_like, state.params)
            grad_sum, outs = jax.lax.scan(micro_step, zeros, (jnp.arange(accumulation), micro))
        # A sum and a count over every micro-batch, not a mean of means: equals the full batch.
        total, count = outs.total.sum(), outs.count.sum()
        grads = jax.tree.map(lambda g: g / (count * state.loss_scale), grad_sum)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(total) & jnp.isfinite(grad_norm)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if clip:
            max_logits = outs.max_logits.max(axis=0)  # over the micro-batches
            params = qk_clip(params, {QK_LAYER: max_logits}, qk_clip_tau, layers=qk_layers)
        loss_scale, good_steps = state.loss_scale, state.good_steps
        if dynamic_scale:
            # A dynamic loss scale (Micikevicius et al. 2018): skip a non-finite step and halve the
            # scale; double it after 2000 finite steps. Written here, not with flax's DynamicScale,
            # because the scale must wrap the micro-batch scan, not one grad call.
            keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
            params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
            grow = finite & (good_steps + 1 >= 2000)
            loss_scale = jnp.where(finite, jnp.where(grow, loss_scale * 2, loss_scale), jnp.maximum(loss_scale / 2, 1.0))
            good_steps = jnp.where(finite & ~grow, good_steps + 1, 0)
            nonfinite_step = state.nonfinite_step
        else:
            nonfinite_step = jnp.where((state.nonfinite_step < 0) & ~finite, state.step, state.nonfinite_step)
        ema = state.ema
        if ema is not None:
            # The decay warms up as (1 + step) / (10 + step) (TensorFlow's ExponentialMovingAverage
            # with num_updates), so the average does not drag the initialisation through short runs.
            step_f = state.step.astype(jnp.float32)
            d = jnp.minimum(objective.ema_decay, (1.0 + step_f) / (10.0 + step_f))
            ema = jax.tree.map(lambda e, p: (d * e + (1 - d) * p).astype(e.dtype), ema, params)
        metrics = {"train/loss": total / count, "train/grad_norm": grad_norm,
                   "train/lr": learning_rate(state.step),
                   **{k: v.sum() / count for k, v in outs.sums.items()}}
        if dynamic_scale:
            metrics["train/loss_scale"] = loss_scale
        if clip:
            metrics["train/max_logit"] = max_logits.max()
        metrics[NONFINITE] = nonfinite_step
        new = state.replace(step=state.step + 1, params=params, opt_state=opt_state, ema=ema,
                            loss_scale=loss_scale, good_steps=good_steps, nonfinite_step=nonfinite_step)
        return new, metrics

    return step


def make_eval_step(objective: Objective, graphdef: Any, rest: Any,
                   metrics: Sequence[Metric] = ()) -> Callable[..., tuple[jax.Array, jax.Array, Any, Any]]:
    """The evaluation of one batch: the objective's loss (sum, count, sums) and each metric's
    (sum, count) by name, all in one compiled program."""

    def eval_step(params: Any, batch: Mapping[str, jax.Array], key: jax.Array) -> tuple[jax.Array, jax.Array, Any, Any]:
        model = nnx.merge(graphdef, params, rest)
        out = objective.evaluate(model, batch, key)
        return out.total, out.count, out.sums, {m.name: m(model, batch, key) for m in metrics}

    return eval_step


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


def check(run: RunConfig, objective: Objective, dataset: Dataset) -> tuple[int, int | None, int | None]:
    """Everything about a run that can fail before it starts, checked without touching the disk or
    allocating the model: the batch the dataset was loaded at, the run's length and cadences, the
    mesh and the batch split, and the optimizer over the model's (abstract) parameters.

    Returns the run's total steps and its evaluation and checkpoint intervals.
    """
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
    abstract = nnx.eval_shape(lambda: adapt.adapt(objective, objective.build(nnx.Rngs(params=t.seed)), dataset,
                                                  quantization=t.quantization, lora=run.lora, seed=t.seed))
    sharding.param_specs(nnx.state(abstract, nnx.Param), mesh, t.layout)  # each split divides
    optimizer = _optimizer(run, dataset, nnx.state(abstract, adapt.trainable(run.lora)), total_steps)
    _qk_layers(run, optimizer.qk_clip_tau)
    return total_steps, eval_every, ckpt_every


def _qk_layers(run: RunConfig, tau: float | None) -> dict[str, QKClipLayer] | None:
    """MuonClip's layer description of the run's model; None without muonclip."""
    return None if tau is None else qk_clip_layers(run.model.architecture, run.model.fields())


def _optimizer(run: RunConfig, dataset: Dataset, params: Any, total_steps: int) -> Any:
    tokens_per_record = float(getattr(dataset, "tokens_per_record", 1) or 1)
    return build_optimizer(run.optim, params, total_steps=total_steps,
                           tokens_seen=tokens_seen_fn(run.trainer.stages(), tokens_per_record))


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
    model = adapt.adapt(objective, objective.build(nnx.Rngs(params=t.seed)), dataset,
                        quantization=t.quantization, lora=run.lora, seed=t.seed)
    graphdef, params, rest = nnx.split(model, adapt.trainable(run.lora), ...)
    optimizer = _optimizer(run, dataset, params, total_steps)

    def init_state(params: Any) -> TrainState:
        return TrainState(
            step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.tx.init(params),
            ema=jax.tree.map(jnp.copy, params) if objective.ema_decay > 0 else None,
            key=jax.random.PRNGKey(t.seed + 1),  # init draws from seed; per-step draws from seed + 1
            loss_scale=jnp.asarray(2.0**15 if t.dynamic_scale else 1.0, jnp.float32),
            good_steps=jnp.zeros((), jnp.int32), nonfinite_step=jnp.full((), -1, jnp.int32))

    # One compiled program lays the whole state out on the mesh (not one eager op per leaf), each
    # leaf as the logical axes of its parameter and trainer.layout.rules say.
    state_sharding = sharding.state_sharding(jax.eval_shape(init_state, params), params, mesh, t.layout)
    state = jax.jit(init_state, out_shardings=state_sharding)(params).replace(graphdef=graphdef, rest=rest)
    state_sharding = state_sharding.replace(graphdef=graphdef, rest=rest)
    batch_sharding = sharding.batch_sharding(mesh, t.layout)

    # (3) The compiled step and evaluation. ----------------------------------------------------
    # Traced under the rules, so the models' activation constraints (dew.models.axes) apply.
    train_step = jax.jit(
        sharding.under_rules(mesh, t.layout, make_train_step(
            objective, graphdef, rest, optimizer.tx, optimizer.learning_rate,
            accumulation=t.accumulation, dynamic_scale=t.dynamic_scale,
            qk_clip_tau=optimizer.qk_clip_tau, qk_layers=_qk_layers(run, optimizer.qk_clip_tau))),
        in_shardings=(state_sharding, batch_sharding), out_shardings=(state_sharding, None),
        compiler_options=COMPILER_OPTIONS or None,
        donate_argnums=0)
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


