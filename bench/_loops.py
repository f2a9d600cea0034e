"""The two sides the benchmarks time dew's trainer with: a bare ``jax.jit`` + optax loop, and the
trainer's own loop timed from outside; and ``Synthetic``, one batch in host memory for both.

Shared by bench/gpu.py, bench/trainer_overhead.py and bench/maxtext_parity.py so that every
comparison of the trainer against a hand-written loop uses the same hand-written loop. The
underscore keeps ``python -m bench`` from taking this module for a benchmark.

The bare loop is as lean as the trainer's: one jitted, donated step that folds its per-step key from
a step counter inside ``jit`` (as the trainer does, so neither side pays a dispatch the other does
not), blocked on once after the warm-up and once at the end. The trainer's time is the wall time
between the tracker receiving the metrics of the warm-up's last step and of the last step (each
fetch waits for its step), taken here, outside the trainer: set-up, compilation and the final save
are left out of both sides.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class Synthetic:
    """One random batch, handed out every step: a ``dew.contract.data.Dataset`` with no I/O at all."""

    resumable = False
    num_records = None
    seed = 0

    def __init__(self, arch: str, fields: dict[str, Any], batch_size: int) -> None:
        self.batch_size = batch_size
        rng = np.random.default_rng(0)
        self.kind = "tokens" if arch == "transformer" else "image"  # dew.data.specs.DataSpec.kind
        if arch == "transformer":
            self.fields = {"vocab_size": fields["vocab_size"], "seq_len": fields["seq_len"]}
            self.batch = {
                "tokens": rng.integers(0, fields["vocab_size"], (batch_size, fields["seq_len"] + 1), dtype=np.int32)
            }
        else:
            side, channels = fields["input_size"], fields["in_channels"]
            self.fields = {"input_size": side, "in_channels": channels, "num_classes": fields["num_classes"]}
            self.batch = {
                "image": rng.standard_normal((batch_size, side, side, channels), np.float32),
                "label": rng.integers(0, fields["num_classes"], batch_size, dtype=np.int32),
            }

    def batch_spec(self):
        return {k: (v.shape, v.dtype) for k, v in self.batch.items()}

    def model_fields(self):
        return dict(self.fields)

    def iterator(self, process_index: int = 0, process_count: int = 1):
        return self

    def next(self, batch_size: int | None = None):
        return self.batch

    def get_state(self):
        return {}

    def set_state(self, state) -> None:
        pass

    def eval_batches(self, process_index: int = 0, process_count: int = 1):
        return iter(())


def bare_loop(objective, optim, batches, steps: int, warmup: int) -> tuple[float, float]:
    """Wall and process-CPU seconds for ``steps`` steps of a bare jitted, donated value_and_grad +
    optax loop on ``objective`` after ``warmup`` (compilation) steps; ``optim`` is the run's
    ``OptimConfig`` and ``batches.next()`` gives each step's batch."""
    from dew.training.optim.build import build_optimizer

    graphdef, params, rest = nnx.split(objective.build(nnx.Rngs(params=0)), nnx.Param, ...)
    tx = build_optimizer(optim, params, total_steps=warmup + steps).tx
    opt_state = tx.init(params)

    def step(params, opt_state, n, batch):
        key = jax.random.fold_in(jax.random.key(1), n)  # the per-step key inside jit, as the trainer's

        def loss_fn(p):
            out = objective.loss(nnx.merge(graphdef, p, rest), batch, key)
            return out.total / out.count

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, n + 1, loss

    step = jax.jit(step, donate_argnums=(0, 1, 2))
    n = jnp.zeros((), jnp.int32)
    for _ in range(warmup):
        params, opt_state, n, loss = step(params, opt_state, n, batches.next())
    jax.block_until_ready(loss)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        params, opt_state, n, loss = step(params, opt_state, n, batches.next())
    jax.block_until_ready((params, loss))
    return time.perf_counter() - start, time.process_time() - cpu


def trainer_loop(run, objective, data, steps: int, warmup: int, name: str) -> tuple[float, float]:
    """Wall and process-CPU seconds of ``run.train``'s loop between the metrics of step ``warmup``
    and of step ``warmup + steps``; ``run`` must train that many steps and log every ``warmup``."""
    with metrics_times() as seen:
        run.train(objective, data, name=name)
    (wall0, cpu0), (wall1, cpu1) = seen[warmup], seen[warmup + steps]
    return wall1 - wall0, cpu1 - cpu0


@contextlib.contextmanager
def metrics_times() -> Iterator[dict[int, tuple[float, float]]]:
    """Within: when each step's training metrics reached the run's tracker, as (wall, process-CPU)
    seconds by step, taken outside the trainer (each fetch of a step's metrics waits for the step)."""
    from dew.training.reporting import tracker as tracking

    seen: dict[int, tuple[float, float]] = {}
    original = tracking.Tracker.metrics

    def metrics(self, step, values):
        if "train/loss" in values:
            seen[step] = (time.perf_counter(), time.process_time())
        return original(self, step, values)

    tracking.Tracker.metrics = metrics
    try:
        yield seen
    finally:
        tracking.Tracker.metrics = original
