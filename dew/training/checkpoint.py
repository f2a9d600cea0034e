"""Checkpoints: orbax's CheckpointManager, keeping the ``keep`` latest plus the best.

One step directory holds everything resume needs: the state pytree (parameters, optimizer state,
EMA, RNG key, step, loss scale) and a JSON record (records consumed, the data iterator's read
position, the W&B run id). Orbax writes each step to a temporary directory and renames it when
complete, so a save killed mid-write never corrupts an earlier checkpoint; saves are asynchronous.

Retention: orbax's ``max_to_keep`` together with ``best_fn`` keeps the N *best* and deletes newer,
worse checkpoints (a resumed run could go back in time), so the policy here is "N latest OR the
best" (docs/architecture.md, "Decisions"). ``best_fn`` is still given: without it, orbax writes no metrics.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as policies

log = logging.getLogger("dew")

BEST_METRIC = "eval/loss"


def _metric(key: str, metrics: Any) -> float:
    return float(metrics[key])


class Checkpoints:
    """The run directory's checkpoints."""

    def __init__(self, directory: epath.Path, *, keep: int, best_metric: str = BEST_METRIC,
                 higher_is_better: bool = False) -> None:
        """``best_metric`` (an evaluation key, ``eval/loss`` by default, or a run's metric marked
        best) chooses the best checkpoint, the lowest unless ``higher_is_better``."""
        self.directory = directory
        metric = functools.partial(_metric, best_metric)
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policies.AnyPreservationPolicy([
                policies.LatestN(n=keep),
                # BestN keeps the last n of the sorted order: descending (reverse=True) keeps the
                # lowest, ascending the highest.
                policies.BestN(get_metric_fn=metric, reverse=not higher_is_better, n=1,
                               keep_checkpoints_without_metrics=False),
            ]),
            best_fn=metric,
            best_mode="max" if higher_is_better else "min",
            enable_async_checkpointing=True,
            create=True,
        )
        self.manager = ocp.CheckpointManager(directory, options=options, item_names=("state", "meta"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def best_step(self) -> int | None:
        return self.manager.best_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def save(self, step: int, state: Any, meta: dict[str, Any], metrics: dict[str, float] | None) -> None:
        """Start an asynchronous save; returns once the arrays are copied off the step's buffers."""
        self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                        meta=ocp.args.JsonSave(meta)),
                          metrics=metrics)

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """The state (laid out like ``abstract_state``) and the record saved at ``step``."""
        restored = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
        return restored.state, restored.meta

    def restore_meta(self, step: int) -> dict[str, Any]:
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

    def step_path(self, step: int) -> str:
        return os.fspath(self.directory / str(step))

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
