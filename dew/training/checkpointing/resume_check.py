"""``trainer.check_resume``: the run's first checkpoint read back as a resumed run reads it, and
compared with the live run, so that a change that breaks resuming shows in a short run
(``debug=fast``) rather than after a preemption. A hook of the loop, after the checkpoint's."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import numpy as np

from dew.training.checkpointing.saving import Saver, plain
from dew.training.hooks import At, Hook

if TYPE_CHECKING:
    from dew.contract.data import BatchIterator

log = logging.getLogger("dew")


class ResumeMismatch(RuntimeError):
    """A checkpoint that does not restore what the run saved in it."""


class ResumeCheck(Hook):
    """At the first step the saver saved: wait for the save, restore it (the state laid out as the
    live one, the record beside it), put a fresh data iterator where the record says, and check every
    array, the record and the data position against the live run's."""

    phase = "checkpoint"

    def __init__(self, saver: Saver, iterator: Callable[[int, int], BatchIterator], every: int | None) -> None:
        super().__init__(every)
        self.saver, self.iterator = saver, iterator
        self.done = False

    def on_step(self, at: At) -> None:
        if self.done or self.saver.last_saved != at.step:
            return
        self.done = True
        checkpoints = self.saver.checkpoints
        self.saver.wait()
        restored, meta = checkpoints.restore(at.step, at.state)
        live_leaves = jax.tree_util.tree_leaves_with_path(jax.device_get(at.state))
        restored_leaves = jax.tree_util.tree_leaves(jax.device_get(restored))
        if len(live_leaves) != len(restored_leaves):
            raise ResumeMismatch(
                f"resume check: step {at.step} restores {len(restored_leaves)} arrays, the run holds {len(live_leaves)}"
            )
        for (path, live), back in zip(live_leaves, restored_leaves):
            if not np.array_equal(np.asarray(live), np.asarray(back), equal_nan=True):
                raise ResumeMismatch(
                    f"resume check: {jax.tree_util.keystr(path)} restored from step {at.step} differs from the run's"
                )
        expected = plain(self.saver.meta(at.step, at.records))
        if meta != expected:
            raise ResumeMismatch(f"resume check: step {at.step}'s record {meta} is not the run's {expected}")
        fresh = self.iterator(jax.process_index(), jax.process_count())
        if meta.get("data") is not None:
            fresh.set_state(meta["data"])
            if plain(fresh.get_state()) != meta["data"]:
                raise ResumeMismatch(f"resume check: the data position of step {at.step} does not restore")
        log.info(
            "resume check: step %d's checkpoint restores the run's %d arrays bit for bit, its record and its "
            "data position",
            at.step,
            len(live_leaves),
        )
