"""The pure train and evaluation steps over the state they carry (``dew.training.state``).

``make_train_step`` returns ``step(state, batch) -> (state, metrics)``: micro-batches summed in one
scan, one optimizer update (the optimizer's own post-update transform included), the dynamic loss
scale and the parameter EMA. The step knows no model and no optimizer by name: it asks the objective
for a loss and hands the optimizer what the optimizer says it needs (``Optimizer.extra_args``).
With ``dynamics`` the step also reports the per-layer RMS of the activations, gradients, updates and
parameters (``dew.training.dynamics``): a second program, run on the steps that report them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dew.models import stack
from dew.objectives.base import Loss, Metric, Objective
from dew.training import dynamics as dynamics_metrics
from dew.training.hooks import NONFINITE  # the step's metric of the first non-finite step (-1: none)
from dew.training.state import TrainState

LOSS_SCALE_PERIOD = 2000
"""Finite steps after which the dynamic loss scale doubles."""


def ema_update(ema: nnx.State, params: nnx.State, decay: float, step: jax.Array) -> nnx.State:
    """The exponential moving average of the parameters after ``step``'s update. The decay warms up
    as (1 + step) / (10 + step) (TensorFlow's ExponentialMovingAverage with num_updates), so the
    average does not drag the initialisation through short runs."""
    step_f = step.astype(jnp.float32)
    d = jnp.minimum(decay, (1.0 + step_f) / (10.0 + step_f))
    return jax.tree.map(lambda e, p: (d * e + (1 - d) * p).astype(e.dtype), ema, params)


def next_loss_scale(scale: jax.Array, good_steps: jax.Array, finite: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A dynamic loss scale (Micikevicius et al. 2018): halve it (to at least 1) after a non-finite
    step, double it after ``LOSS_SCALE_PERIOD`` finite steps. Returns (scale, finite steps since the
    last change). Written here, not with flax's DynamicScale, because the scale must wrap the
    micro-batch scan, not one grad call."""
    grow = finite & (good_steps + 1 >= LOSS_SCALE_PERIOD)
    scale = jnp.where(finite, jnp.where(grow, scale * 2, scale), jnp.maximum(scale / 2, 1.0))
    return scale, jnp.where(finite & ~grow, good_steps + 1, 0)


def make_train_step(
    objective: Objective,
    graphdef: nnx.GraphDef,
    rest: nnx.State,
    tx: optax.GradientTransformation,
    learning_rate: Callable[[jax.Array], jax.Array],
    *,
    accumulation: int,
    dynamic_scale: bool,
    extra_args: Sequence[str] = (),
    dynamics: bool = False,
) -> Callable[[TrainState, Mapping[str, jax.Array]], tuple[TrainState, dict]]:
    """The pure train step: micro-batches summed in one scan, one optimizer update. ``extra_args``:
    what ``tx.update`` takes besides the gradients (``Optimizer.extra_args``). ``max_logits``: the
    loss also returns each attention head's largest logit; the maximum over the micro-batches (under
    ``jit`` over a sharded batch, global over the devices) goes to the update (MuonClip's QK-clip)
    and is logged as ``train/max_logit``. ``dynamics``: the step's metrics also hold
    ``dew.training.dynamics``'s, the blocks' outputs recorded in this step's forward pass."""
    unknown = sorted(set(extra_args) - {"max_logits"})
    if unknown:
        raise ValueError(f"the optimizer asks for {unknown}; the step can give it max_logits")
    wants_logits = "max_logits" in extra_args

    grad_fn = jax.grad(loss_of(objective, graphdef, rest, wants_logits, dynamics), has_aux=True)

    def step(state: TrainState, batch: Mapping[str, jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
        grad_sum, (outs, sown) = summed_grads(grad_fn, state, batch, accumulation)
        # A sum and a count over every micro-batch, not a mean of means: equals the full batch.
        total, count = outs.total.sum(), outs.count.sum()
        grads = jax.tree.map(lambda g: g / (count * state.loss_scale), grad_sum)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(total) & jnp.isfinite(grad_norm)
        extra = (
            {"max_logits": outs.max_logits.max(axis=0)} if wants_logits and outs.max_logits is not None else {}
        )  # over the micro-batches
        updates, opt_state = tx.update(grads, state.opt_state, state.params, **extra)
        params = optax.apply_updates(state.params, updates)
        loss_scale, good_steps = state.loss_scale, state.good_steps
        if dynamic_scale:  # a non-finite step is skipped
            keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
            params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
            loss_scale, good_steps = next_loss_scale(loss_scale, good_steps, finite)
            nonfinite_step = state.nonfinite_step
        else:
            nonfinite_step = jnp.where((state.nonfinite_step < 0) & ~finite, state.step, state.nonfinite_step)
        ema = state.ema
        if ema is not None:
            ema = ema_update(ema, params, objective.ema_decay, state.step)
        metrics = {
            "train/loss": total / count,
            "train/grad_norm": grad_norm,
            "train/lr": learning_rate(state.step),
            **{f"train/{k}": v.sum() / count for k, v in outs.sums.items()},
        }
        if dynamic_scale:
            metrics["train/loss_scale"] = loss_scale
        if wants_logits:
            metrics["train/max_logit"] = extra["max_logits"].max()
        metrics[NONFINITE] = nonfinite_step
        if dynamics:
            metrics.update(dynamics_metrics.activation_metrics(sown))
            metrics.update(dynamics_metrics.parameter_metrics(state.params, grads, updates))
        new = dataclasses.replace(
            state,
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            ema=ema,
            loss_scale=loss_scale,
            good_steps=good_steps,
            nonfinite_step=nonfinite_step,
        )
        return new, metrics

    return step


def loss_of(
    objective: Objective, graphdef: nnx.GraphDef, rest: nnx.State, wants_logits: bool, dynamics: bool
) -> Callable[..., tuple[jax.Array, tuple[Loss, nnx.State | dict]]]:
    """The scaled loss of the parameters on a batch, with (its loss record, what the stacks sowed:
    with ``dynamics``, each block's output mean square) as the auxiliary output."""

    def loss(model: nnx.Module, batch: Mapping[str, jax.Array], key: jax.Array) -> Loss:
        # max_logits passed only when the optimizer asks for it: not every objective takes it
        return objective.loss(model, batch, key, max_logits=True) if wants_logits else objective.loss(model, batch, key)

    def loss_fn(
        params: nnx.State, batch: Mapping[str, jax.Array], key: jax.Array, scale: jax.Array
    ) -> tuple[jax.Array, tuple[Loss, nnx.State | dict]]:
        model = nnx.merge(graphdef, params, rest)
        sown: nnx.State | dict = {}
        if dynamics:  # the blocks' outputs, sown as the stacks run them (dew.models.stack)
            with stack.recording():
                out, sown = nnx.capture(loss, nnx.Intermediate)(model, batch, key)
        else:
            out = loss(model, batch, key)
        if wants_logits:
            out = out._replace(max_logits=jax.lax.stop_gradient(out.max_logits))
        return out.total * scale, (out, sown)

    return loss_fn


def summed_grads(
    grad_fn: Callable[..., Any], state: TrainState, batch: Mapping[str, jax.Array], accumulation: int
) -> tuple[Any, Any]:
    """The gradients summed over ``accumulation`` micro-batches of ``batch`` (one scan), and each
    micro-batch's auxiliary output (its loss record), stacked."""
    key = jax.random.fold_in(state.key, state.step)
    if accumulation == 1:  # no scan of one: XLA fuses the step as a hand-written one
        grad_sum, out = grad_fn(state.params, batch, jax.random.fold_in(key, 0), state.loss_scale)
        return grad_sum, jax.tree.map(lambda x: x[None], out)
    micro = jax.tree.map(lambda x: x.reshape(accumulation, x.shape[0] // accumulation, *x.shape[1:]), batch)

    def micro_step(grad_sum: nnx.State, inputs: tuple[jax.Array, Mapping[str, jax.Array]]) -> tuple[nnx.State, Any]:
        i, mb = inputs
        grads, out = grad_fn(state.params, mb, jax.random.fold_in(key, i), state.loss_scale)
        return jax.tree.map(jnp.add, grad_sum, grads), out

    zeros = jax.tree.map(jnp.zeros_like, state.params)
    return jax.lax.scan(micro_step, zeros, (jnp.arange(accumulation), micro))


def make_eval_step(
    objective: Objective, graphdef: nnx.GraphDef, rest: nnx.State, metrics: Sequence[Metric] = ()
) -> Callable[..., tuple[jax.Array, jax.Array, Any, Any]]:
    """The evaluation of one batch: the objective's loss (sum, count, sums) and each metric's
    (sum, count) by name, all in one compiled program."""

    def eval_step(
        params: nnx.State, batch: Mapping[str, jax.Array], key: jax.Array
    ) -> tuple[jax.Array, jax.Array, Any, Any]:
        model = nnx.merge(graphdef, params, rest)
        out = objective.evaluate(model, batch, key)
        return out.total, out.count, out.sums, {m.name: m(model, batch, key) for m in metrics}

    return eval_step
