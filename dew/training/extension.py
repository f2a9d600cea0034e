"""Training a run further: a resume that changes the run's length (``trainer.steps``, ``trainer.epochs``).

A run's record is its exact spec: the run ``run.json`` describes, trained in one go from its seed,
ends where the run ended, bit for bit. A change of length keeps that promise or is refused.

The learning rate is a function of the step and the run's length (``optim.schedule``): a cosine or
a linear decay spans the whole run, so at another length every step past the warmup would have
trained at another rate. The change is therefore accepted exactly when the rate of **every step the
run already trained** (those before the checkpoint it resumes from) is the same at the new length as
at the old, computed both ways here (``first_changed_rate``), and refused otherwise, in one line
naming the first step whose rate would change and what to do instead. Accepted, the steps after the
checkpoint take the new length's rates, so the run ends, bit for bit, where a run of the new length
trained in one go ends; ``run.json`` takes the new length and the journal an ``extend`` event.

What that lets through: no schedule (a constant rate); a constant after warmup (``linear`` with
``end_ratio=1``, ``cosine`` with ``floor_ratio=1``); ``power`` without a tail (a function of the
tokens seen); and a warmup-stable-decay (``power`` with ``b=0`` and ``decay_steps``) resumed from a
step before its tail began. What it refuses: a run resumed past the warmup of a decay that spans its
length (``cosine``, ``linear`` to another rate), and a tail already begun. Such a run trains further
as a new run from its weights (``trainer.init_from``: a fresh optimizer and schedule,
docs/weights.md). A length below the step a run already reached is refused too.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax.numpy as jnp
import numpy as np
from etils import epath

from dew.contract.config import RunConfig
from dew.contract.data import Dataset
from dew.contract.rundir import is_step
from dew.training.optim.schedules import build_schedule
from dew.training.ramp import run_tokens_seen
from dew.training.run_directory import RunDirError

CHUNK = 1 << 20
"""Steps whose rates are computed at once (4 MiB of float32 a length)."""


@dataclasses.dataclass(frozen=True)
class Extension:
    """A resume that changes the run's length: the journal's ``extend`` event."""

    at_step: int
    """The step the run resumes from (its latest checkpoint; 0 without one)."""
    from_steps: int
    """The length the record held, in steps."""
    to_steps: int
    """The new length, in steps."""

    def describe(self, name: str) -> str:
        return (
            f"training {name} further: {self.from_steps} -> {self.to_steps} steps from step {self.at_step}; "
            f"the rates of the {self.at_step} steps trained are the same at the new length"
        )


def check_length(run: RunConfig, recorded: dict[str, Any], dataset: Dataset, path: epath.Path) -> Extension | None:
    """The extension a resume of the run recorded in ``path`` (``recorded``: its ``run.json``) with
    ``run`` makes, None where the length is the same; a ``RunDirError`` (one line) where the new
    length would change the rate of a step already trained, or lies below the step reached."""
    old = recorded["trainer"]
    if (old.get("steps"), old.get("epochs")) == (run.trainer.steps, run.trainer.epochs):
        return None
    before = dataclasses.replace(run.trainer, steps=old.get("steps"), epochs=old.get("epochs"))
    from_steps, to_steps = before.total_steps(dataset), run.trainer.total_steps(dataset)
    at = latest_step(path)
    change = f"{_length(old.get('steps'), old.get('epochs'))} -> {_length(run.trainer.steps, run.trainer.epochs)}"
    if to_steps < at:
        raise RunDirError(
            f"{change} is {to_steps} steps, but the run in {path} already reached step {at}; "
            f"give at least trainer.steps={at}"
        )
    if from_steps == to_steps:
        return None
    changed = first_changed_rate(run, dataset, from_steps, to_steps, at)
    if changed is not None:
        step, was, would = changed
        schedule = run.optim.schedule.name if run.optim.schedule is not None else "constant"
        raise RunDirError(
            f"{change} would change the learning rate of steps already trained: optim.schedule "
            f"({schedule}) reads the run's length, and step {step} trained at {was:.6g}, not the "
            f"{would:.6g} of a {to_steps}-step run. Train it further as a new run from its weights "
            f"(trainer.init_from={path} trainer.name=<new name>), or give a run you mean to extend a "
            "schedule whose rates do not read the length (docs/training.md, 'Training a run further')"
        )
    return Extension(at, from_steps, to_steps)


def first_changed_rate(
    run: RunConfig, dataset: Dataset, from_steps: int, to_steps: int, trained: int
) -> tuple[int, float, float] | None:
    """The first of the steps ``0 .. trained - 1`` whose learning rate differs between a run of
    ``from_steps`` and one of ``to_steps`` steps (with both rates), None when none does: computed
    with the schedule the trainer builds, bit for bit."""
    if trained == 0:
        return None
    tokens_seen = run_tokens_seen(run.trainer, dataset)
    old, new = (
        build_schedule(run.optim.schedule, run.optim.learning_rate, total_steps=n, tokens_seen=tokens_seen)
        for n in (from_steps, to_steps)
    )
    for start in range(0, trained, CHUNK):
        steps = jnp.arange(start, min(start + CHUNK, trained), dtype=jnp.int32)
        a, b = np.asarray(old(steps)), np.asarray(new(steps))
        if (differ := np.flatnonzero(a != b)).size:
            i = int(differ[0])
            return start + i, float(a[i]), float(b[i])
    return None


def latest_step(path: epath.Path) -> int:
    """The latest step directory in run directory ``path``, 0 for none: the step a resume starts
    from (or a later one than it, where a damaged step sends the restore back: the stricter check)."""
    try:
        return max((int(p.name) for p in path.iterdir() if is_step(p.name) and p.is_dir()), default=0)
    except OSError:
        return 0


def _length(steps: int | None, epochs: int | None) -> str:
    return f"trainer.steps={steps}" if steps is not None else f"trainer.epochs={epochs}"


def record_length(path: epath.Path, run: RunConfig) -> None:
    """Write the new length into the run's record (``run.json``), every other field as recorded: the
    record stays the config that, trained in one go, gives this run."""
    recorded = type(run).load(os.fspath(path))
    trainer = dataclasses.replace(recorded.trainer, steps=run.trainer.steps, epochs=run.trainer.epochs)
    dataclasses.replace(recorded, trainer=trainer).save(os.fspath(path))
