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


REPLICAS = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from etils import epath
from dew.training.checkpointing.checkpoints import Checkpoints

compiled = []
COMPILE = "/jax/core/compile/backend_compile_duration"
jax.monitoring.register_event_duration_secs_listener(lambda event, _, **kw: event == COMPILE and compiled.append(event))
replicated = NamedSharding(jax.make_mesh((2,), ("data",)), PartitionSpec())
found = {}
for name, size in (("small", 1024), ("large", 2**20)):  # 4 KiB, and 4 MiB: 2 MiB a replica
    state = {"w": jax.device_put(jnp.arange(size, dtype=jnp.float32), replicated)}
    checkpoints = Checkpoints(epath.Path(sys.argv[1]) / name, keep=1)
    before = len(compiled)
    checkpoints.save(1, state, {}, None)
    checkpoints.wait()
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    back, _ = checkpoints.restore(1, abstract)
    found[name] = [len(compiled) - before, bool(np.array_equal(np.asarray(back["w"]), np.asarray(state["w"])))]
    checkpoints.close()
print(json.dumps(found))
"""


def test_a_small_replicated_array_is_written_whole_and_a_large_one_by_its_replicas(tmp_path: Path):
    """orbax splits the writing of a replicated array among its replicas, each part a slice of a
    device's buffer: a program compiled per shape and device on a run's first save. dew's saves
    split only parts of at least ``REPLICA_SLICE_BYTES`` (1 MiB): a 4 KiB array replicated on two
    devices is saved with no program compiled (orbax's default compiled 2), a 4 MiB one still
    split (its two slices compiled), and both restore bit for bit."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO, cli_env

    proc = subprocess.run(
        [sys.executable, "-c", REPLICAS, str(tmp_path)],
        cwd=REPO,
        env=cli_env(JAX_NUM_CPU_DEVICES="2"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"small": [0, True], "large": [2, True]}
