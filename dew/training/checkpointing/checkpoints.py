"""Checkpoints: orbax's CheckpointManager, keeping the ``keep`` latest plus the best.

One step directory holds everything resume needs: the state pytree (parameters, optimizer state,
EMA, RNG key, step, loss scale) and a JSON record (records consumed, the data iterator's read
position, the W&B run id). Orbax writes each step to a temporary directory and renames it when
complete, so a save killed mid-write never corrupts an earlier checkpoint; saves are asynchronous.

Retention: orbax's ``max_to_keep`` together with ``best_fn`` keeps the N *best* and deletes newer,
worse checkpoints (a resumed run could go back in time), so the policy here is "N latest OR the
best" (docs/architecture.md, "Decisions"). ``best_fn`` is still given: without it, orbax writes no metrics.

Damage: a step directory whose files were lost, cut short or altered after the save (a full disk, a
copy gone wrong, bit rot) fails to restore. ``restore_intact`` then says which step and what is
wrong and falls back to the newest step that restores. The damaged step is never deleted: it is
renamed to ``<step>.damaged-<time>`` beside the others, for two reasons. Orbax skips (silently) every
save at or below its latest step, so a damaged latest step left in place would keep the resumed run
from saving until it passed it; and the run saves that step number again. Orbax lists only names
that are step numbers (and cleans only its own ``.orbax-checkpoint-tmp`` names), so it ignores the
renamed one. Orbax checks the structure it reads (its B-tree nodes and manifests carry checksums);
it does not checksum the array bytes themselves, so a flipped bit inside an array's data restores as
a different value and is not caught (measured on orbax-checkpoint 0.12.8: docs/training.md).

Quiet: orbax warns (through absl's logger) about four things dew does on purpose; ``OrbaxNotes``
drops exactly those lines and lets every other warning and error through.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as policies

from dew.compat import orbax_reads_settle, orbax_uncompressed_standard_handler
from dew.contract.rundir import BEST_METRIC, damaged_name

log = logging.getLogger("dew")


class OrbaxNotes(logging.Filter):
    """Drops the warnings orbax logs about what dew does on purpose, matched by their exact format
    string (``record.msg``), so that a normal run prints none of them and any other line still shows."""

    EXPECTED = frozenset(
        {
            # A checkpoint saved where the run does not evaluate has no metric to rank it by; the
            # retention policy keeps it as one of the latest (keep_checkpoints_without_metrics=False).
            "Requested `tracked_metric`; did not provide metrics.",
            # trainer.init_from opens the source run read only (dew.training.checkpointing.warmstart).
            "Given directory is read only=%s",
            "CheckpointManagerOptions.read_only=True, setting save_interval_steps=0.",
            # Restoring one item of a composite step: the step's metadata is beside the items, not in them.
            "Metadata file does not exist: %s",
        }
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.WARNING and record.msg in self.EXPECTED)


if not any(isinstance(f, OrbaxNotes) for f in logging.getLogger("absl").filters):
    logging.getLogger("absl").addFilter(OrbaxNotes())  # orbax's absl.logging writes through this logger


class CheckpointDamagedError(RuntimeError):
    """No saved step of the run restores; ``damaged`` holds each step tried and what is wrong with it."""

    def __init__(self, directory: epath.Path, damaged: list[tuple[int, str]]) -> None:
        super().__init__(
            f"no checkpoint in {directory} restores; nothing was moved or deleted. "
            + "; ".join(f"step {bad}: {problem}" for bad, problem in damaged)
        )
        self.damaged = damaged


@dataclasses.dataclass(frozen=True)
class Fallback:
    """A damaged step passed over on the way to an intact one."""

    damaged_step: int
    problem: str
    moved_to: str | None
    """Where the damaged step now lies, None when it was left in place (a reader, not process 0)."""


def describe_damage(err: BaseException) -> str:
    """What is wrong with a step, in one line, from the error reading it raised."""
    text = " ".join(str(err).split())
    if isinstance(err, FileNotFoundError) and not text:
        text = f"{err.filename} is missing"
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _metric(key: str, worst: float, metrics: Mapping[str, float]) -> float:
    """A checkpoint's ``key``; ``worst`` for one saved before the run reported it (a resume that
    chose another best metric), which then ranks below every other."""
    return float(metrics.get(key, worst))


def _handlers() -> ocp.handlers.DefaultCheckpointHandlerRegistry:
    """What writes and reads a step's two items: ``state`` by orbax's standard handler with its
    arrays uncompressed (``restore_part`` reads it with orbax's PyTree handler), ``meta`` as JSON.

    Uncompressed because the save is on the way out of every stop: with orbax's default zstd a
    349 MB state (parameters, Adam's two moments, the EMA) took 0.75-1.0 s to write, without it
    0.22-0.42 s, for 7% more disk (float32 training values barely compress; docs/performance.md,
    "Stopping"). The bytes restored are the same; a step saved compressed (before) restores as before."""
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    state, meta = orbax_uncompressed_standard_handler(), ocp.JsonCheckpointHandler()
    # The handler registered last for an item is the one a step's metadata names: the standard one.
    for item, args, handler in (
        ("state", ocp.args.PyTreeRestore, ocp.PyTreeCheckpointHandler()),
        ("state", ocp.args.StandardSave, state),
        ("state", ocp.args.StandardRestore, state),
        ("meta", ocp.args.JsonSave, meta),
        ("meta", ocp.args.JsonRestore, meta),
    ):
        registry.add(item, args, handler)
    return registry


class Checkpoints:
    """The run directory's checkpoints."""

    def __init__(
        self, directory: epath.Path, *, keep: int, best_metric: str = BEST_METRIC, higher_is_better: bool = False
    ) -> None:
        """``best_metric`` (an evaluation key, ``eval/loss`` by default, or a run's metric marked
        best) chooses the best checkpoint, the lowest unless ``higher_is_better``."""
        self.directory = directory
        self.best_metric = best_metric
        metric = functools.partial(_metric, best_metric, -math.inf if higher_is_better else math.inf)
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policies.AnyPreservationPolicy(
                [
                    policies.LatestN(n=keep),
                    # BestN keeps the last n of the sorted order: descending (reverse=True) keeps the
                    # lowest, ascending the highest.
                    policies.BestN(
                        get_metric_fn=metric, reverse=not higher_is_better, n=1, keep_checkpoints_without_metrics=False
                    ),
                ]
            ),
            best_fn=metric,
            best_mode="max" if higher_is_better else "min",
            enable_async_checkpointing=True,
            create=True,
        )
        self.manager = ocp.CheckpointManager(directory, options=options, handler_registry=_handlers())

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def best_step(self) -> int | None:
        return self.manager.best_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: object, meta: dict[str, Any], metrics: dict[str, float] | None) -> None:
        """Start an asynchronous save; returns once the arrays are copied off the step's buffers.
        ``metrics`` without the best metric (an evaluation of only the held-out data, or only the
        downstream tasks: ``trainer.evals``) rank nothing: the step is kept as one of the latest."""
        if metrics is not None and self.best_metric not in metrics:
            metrics = None
        self.manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
            metrics=metrics,
        )

    def restore(self, step: int, abstract_state: object) -> tuple[Any, dict[str, Any]]:
        """The state (laid out like ``abstract_state``) and the record saved at ``step``."""
        with orbax_reads_settle():  # a damaged step fails without a traceback on stderr
            restored = self.manager.restore(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()),
            )
        return restored.state, restored.meta

    def saved(self, step: int) -> set[str]:
        """The entries of the state saved at ``step`` that hold something (``params``, ``opt_state``,
        ``ema`` when the run kept one), from its metadata alone: a reader chooses what to restore."""
        with orbax_reads_settle():
            tree = ocp.PyTreeCheckpointer().metadata(os.path.join(self.step_path(step), "state")).item_metadata.tree
        return {key for key, value in tree.items() if value is not None}

    def restore_part(self, step: int, target: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Only the entries of the state saved at ``step`` that ``target`` names (``{"ema":
        abstract_params}``), laid out like it, and the step's record: what a reader that samples
        needs, with the optimizer state left on disk."""
        with orbax_reads_settle():  # a damaged step fails without a traceback on stderr
            restored = self.manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.PyTreeRestore(
                        item=target,
                        partial_restore=True,
                        restore_args=ocp.checkpoint_utils.construct_restore_args(target),
                    ),
                    meta=ocp.args.JsonRestore(),
                ),
            )
        return restored.state, restored.meta

    def first_intact[T](
        self, steps: Iterable[int], read: Callable[[int], T], *, on_damaged: Callable[[int, str], None] | None = None
    ) -> tuple[int, T, list[tuple[int, str]]]:
        """The walk back over damaged steps: the first of ``steps`` that ``read`` (``restore``,
        ``restore_part``) reads, as ``(step, what it read, the damaged steps passed over as (step,
        what is wrong))``; ``on_damaged`` hears of each as it is passed over. When none reads, raises
        ``CheckpointDamagedError`` with every step's problem."""
        damaged: list[tuple[int, str]] = []
        for step in steps:
            try:
                value = read(step)
            except Exception as err:
                damaged.append((step, describe_damage(err)))
                if on_damaged is not None:
                    on_damaged(step, damaged[-1][1])
                continue
            return step, value, damaged
        raise CheckpointDamagedError(self.directory, damaged)

    def restore_intact(
        self, abstract_state: object, *, move_damaged: bool
    ) -> tuple[int, Any, dict[str, Any], list[Fallback]]:
        """Restore the newest step that restores: ``(step, state, record, damaged steps passed over)``.

        Each damaged step is logged; with ``move_damaged`` (process 0 of a resuming run) it is renamed
        aside, but only once an intact step was found: when no step restores, the error is more likely
        the code's than the files' (a model that changed shape), so nothing moves and this raises with
        every step's problem.
        """
        step, (state, meta), damaged = self.first_intact(
            sorted(self.all_steps(), reverse=True),
            lambda s: self.restore(s, abstract_state),
            on_damaged=lambda bad, problem: log.error(
                "checkpoint step %d in %s is damaged: %s", bad, self.step_path(bad), problem
            ),
        )
        fallbacks = [
            Fallback(bad, problem, self._move_aside(bad) if move_damaged else None) for bad, problem in damaged
        ]
        for f in fallbacks:
            log.warning(
                "falling back from damaged step %d to step %d%s",
                f.damaged_step,
                step,
                f"; the damaged step is kept as {f.moved_to}" if f.moved_to else "",
            )
        if fallbacks and move_damaged:
            self.manager.reload()  # forget the moved steps: the run saves those numbers again
        return step, state, meta, fallbacks

    def _move_aside(self, step: int) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target, n = self.directory / damaged_name(step, stamp), 1
        while target.exists():
            n += 1
            target = self.directory / damaged_name(step, stamp, n)
        (self.directory / str(step)).rename(target)
        return os.fspath(target)

    def restore_meta(self, step: int) -> dict[str, Any]:
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

    def step_path(self, step: int) -> str:
        return os.fspath(self.directory / str(step))

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
