"""How a step's state is stored: its arrays uncompressed (a stop's save is on the way out of the run:
docs/performance.md, "Stopping"), restored bit for bit, and a step saved compressed (orbax's
default, what dew wrote before) restores through the same calls."""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from dew.training.checkpointing.checkpoints import Checkpoints


def _state() -> dict:
    """1 MiB of float32 that zstd shrinks to almost nothing, and a few odd leaves."""
    return {
        "params": {"w": jnp.zeros((512, 512)), "b": jnp.arange(7, dtype=jnp.bfloat16)},
        "step": jnp.int32(5),
        "key": jax.random.key_data(jax.random.key(3)),
    }


def _stored_bytes(step_dir: Path) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(step_dir / "state") for f in files)


def _equal(a: dict, b: dict) -> bool:
    same = jax.tree.map(lambda x, y: x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y)), a, b)
    return all(jax.tree.leaves(same))


def test_arrays_are_stored_uncompressed_and_a_compressed_step_still_restores(tmp_path: Path):
    state, raw = _state(), 512 * 512 * 4
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    # Step 1 as dew saved it before (orbax's default handlers: zstd).
    old = ocp.CheckpointManager(tmp_path, item_names=("state", "meta"))
    old.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave({"step": 1})))
    old.wait_until_finished()
    old.close()
    checkpoints = Checkpoints(epath.Path(tmp_path), keep=3)
    checkpoints.save(2, state, {"step": 2}, metrics=None)
    checkpoints.wait()
    assert _stored_bytes(tmp_path / "1") < raw / 10  # zstd took the zeros away
    assert _stored_bytes(tmp_path / "2") >= raw  # every byte of them is on disk
    for step in (1, 2):
        restored, meta = checkpoints.restore(step, abstract)
        assert meta == {"step": step} and _equal(restored, state)
        part, _ = checkpoints.restore_part(step, {"params": abstract["params"]})
        assert _equal(part["params"], state["params"])
    checkpoints.close()
