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

import logging
import os
from typing import Any

import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as policies

log = logging.getLogger("dew")

BEST_METRIC = "eval/loss"


def _metric(metrics: Any) -> float:
    return float(metrics[BEST_METRIC])


class Checkpoints:
    """The run directory's checkpoints."""

    def __init__(self, directory: epath.Path, *, keep: int) -> None:
        self.directory = directory
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policies.AnyPreservationPolicy([
                policies.LatestN(n=keep),
                # reverse=True sorts descending, so the last n kept are the lowest losses.
                policies.BestN(get_metric_fn=_metric, reverse=True, n=1,
                               keep_checkpoints_without_metrics=False),
            ]),
            best_fn=_metric,
            best_mode="min",
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
