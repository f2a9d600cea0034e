"""What the loop saves, and when a save ends the run: the periodic checkpoint (a hook of the loop,
``dew.training.hooks``), the checkpoint a stop signal asks for, the last one, and the refusal to
save a state that went non-finite."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from dew.training.checkpointing.checkpoints import Checkpoints
from dew.training.hooks import At, Hook
from dew.training.preemption import Preempted, StopRequest, StopSignals
from dew.training.ramp import stage_at

if TYPE_CHECKING:
    from dew.training.reporting.tracker import Tracker
    from dew.training.step import TrainState

log = logging.getLogger("dew")


class NonFiniteError(FloatingPointError):
    """The loss or the gradients stopped being finite."""


class Saver(Hook):
    """The run's checkpoints as the loop saves them, each with the metadata a resume needs: every
    ``every`` steps (``trainer.checkpoint_every``) and at the last step, as a hook."""

    phase = "checkpoint"

    def __init__(
        self,
        checkpoints: Checkpoints,
        tracker: Tracker,
        *,
        data_state: Callable[[], Any],
        stages: Sequence[tuple[int, int]],
        total_steps: int,
        last_saved: int | None,
        every: int | None = None,
        unnamed: str | None = None,
    ) -> None:
        super().__init__(every)
        self.unnamed = unnamed
        """The name of a run started without ``trainer.name``, which the stop line gives (``Preempted``)."""
        self.checkpoints = checkpoints
        self.tracker = tracker
        """Where each save is written as a ``checkpoint`` event."""
        self.data_state = data_state
        """The data iterator's position (None for a dataset that does not resume)."""
        self.stages, self.total_steps = stages, total_steps
        self.last_saved = last_saved
        """The step of the last checkpoint, restored or saved (None: none yet)."""
        self.hook_states: Callable[[], Mapping[str, Any]] = dict
        """The stateful hooks' states (``Hooks.states``), kept in each checkpoint."""
        self.requested: Callable[[], StopRequest | None] = lambda: None
        """The run's stop request, if one came (``StopSignals.requested``): a checkpoint that holds
        one tells a resume that the run ended there."""
        self.untimed: Callable[[str], AbstractContextManager[object]] = lambda doing: contextlib.nullcontext()
        """The stall watchdog's untimed window (``Watchdog.untimed``; none without
        ``trainer.stall_timeout``), around the wait for this start's first save to land."""
        self.saves = 0
        """The saves this start began."""
        self.first_landing = False
        """This start's first save was begun and not yet waited for."""

    def meta(self, step: int, records: int) -> dict[str, Any]:
        """What a resume reads beside the state: the step, the records consumed, the data position."""
        return {
            "step": step,
            "records": records,
            "data": plain(self.data_state()),
            "wandb_id": self.tracker.wandb_id,
            "mlflow_id": self.tracker.mlflow_id,
            **({"tracker_ids": others} if (others := self._plugin_tracker_ids()) else {}),
            "ramp_stage": stage_at(self.stages, step),
            "total_steps": self.total_steps,
            **({"hooks": plain(states)} if (states := self.hook_states()) else {}),
            **({"stop_request": request.to_json()} if (request := self.requested()) is not None else {}),
        }

    def _plugin_tracker_ids(self) -> dict[str, str]:
        """The runs of the trackers besides W&B and MLflow (a plugin's), by tracker name."""
        return {k: v for k, v in self.tracker.resume_ids.items() if k not in ("wandb", "mlflow")}

    def on_step(self, at: At) -> None:
        """Save the step, with the evaluation run at it (the best checkpoint is chosen by it)."""
        self.save(at.step, at.records, at.state, metrics=at.evaluation)

    def save(self, step: int, records: int, state: TrainState, metrics: Mapping[str, float] | None) -> None:
        self._begin(step, records, state, metrics)
        self.tracker.event("checkpoint", step=step)
        self.last_saved = step

    def _begin(self, step: int, records: int, state: TrainState, metrics: Mapping[str, float] | None) -> None:
        """Begin the save of ``step``, once the save before it landed (the checkpointer waits for it
        anyway; waited for here, the first one's wait is untimed: ``wait``)."""
        self.wait()
        self.checkpoints.save(step, state, self.meta(step, records), metrics=dict(metrics) if metrics else None)
        self.first_landing, self.saves = self.saves == 0, self.saves + 1

    def wait(self) -> None:
        """Wait for the save in flight to land. The wait for this start's first is untimed by the
        stall watchdog, as its start is: the save is written in the background (orbax), so the first
        one's cost (opening the checkpointer, its first files) lands in the wait after it, which on a
        slow machine outlasted a timeout set for the steps (CI, 2026-12-07)."""
        with self.untimed("waiting for the first save to land") if self.first_landing else contextlib.nullcontext():
            self.checkpoints.wait()
        self.first_landing = False

    def check_finite(self, state: TrainState) -> None:
        """Raise ``NonFiniteError`` naming the last good checkpoint if the state went non-finite."""
        bad = int(jax.device_get(state.nonfinite_step))
        if bad >= 0:
            raise self.nonfinite(f"the loss or the gradients became non-finite at step {bad + 1}")

    def nonfinite(self, what: str) -> NonFiniteError:
        """The error that stops a run gone non-finite (``what``: where and how), naming the last good
        checkpoint."""
        self.wait()  # a save in flight holds an earlier, finite state: let it land
        last = self.checkpoints.latest_step()
        where = f"step {last} in {self.checkpoints.step_path(last)}" if last is not None else "none was saved"
        return NonFiniteError(f"{what}; the run stops. The last good checkpoint, left intact: {where}")

    def stopped(self, stop: StopSignals, step: int, records: int, state: TrainState) -> Preempted:
        """Save at ``step`` (unless saved there), wait for the save, write the ``stop`` event: the
        exception that ends the run."""
        self.check_finite(state)
        if self.last_saved != step:
            self.save(step, records, state, metrics=None)
        self.wait()
        stopped = Preempted(stop.reason, step, stop.received, self.checkpoints.step_path(step), self.unnamed)
        self.tracker.event("stop", step=step, reason=stop.reason, message=str(stopped))
        log.warning("%s", stopped)
        return stopped

    def last(self, step: int, records: int, state: TrainState, metrics: Mapping[str, float]) -> None:
        """Wait for the saves, and save ``step`` unless a checkpoint is there."""
        self.wait()
        latest = self.checkpoints.latest_step()
        if latest is None or latest < step:  # no event: the run's ``end`` event says where it ended
            self._begin(step, records, state, metrics)
            self.wait()
            self.last_saved = step


def plain(value: object) -> Any:
    """A JSON-safe copy of an iterator state (NumPy scalars to Python numbers)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def tracker_ids(meta: Mapping[str, Any]) -> dict[str, str]:
    """The trackers' own runs a checkpoint's ``meta`` kept besides W&B's (``wandb_id``), by tracker
    name, for the resumed run's trackers to continue."""
    kept = {"mlflow": meta.get("mlflow_id"), **meta.get("tracker_ids", {})}
    return {name: run for name, run in kept.items() if run is not None}
