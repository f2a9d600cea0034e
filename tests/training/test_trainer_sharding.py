"""Sharding on one host: 8 simulated CPU devices (a subprocess, since the device count is fixed when
the backend starts) with mesh data=4, fsdp=2 give the same losses as this process's one device through
the whole trainer (run directory, evaluation, checkpoint), each parameter laid out as the rules say, and a batch that
does not split over the data axes is refused
naming both numbers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from tests.training.conftest import fast_env, losses, train_tiny

pytestmark = pytest.mark.slow

ARGS = ["trainer.steps=4", "trainer.eval_every=2", "trainer.checkpoint_every=null", "optim.clip_grads=0"]

SHARDED = """
import json, sys
import jax
from dew.training import trainer
from pathlib import Path
from tests.training.conftest import compose, train_tiny
from dew.training import sharding

out = Path(sys.argv[1])
args = json.loads(sys.argv[2])
state, _, journal = train_tiny(out, *args, "trainer.mesh={data: 4, fsdp: 2}")
mesh = sharding.make_mesh(compose(*args, "trainer.mesh={data: 4, fsdp: 2}").trainer)
layout = compose(*args).trainer.layout
specs = {}
wanted = sharding.param_specs(state.params, mesh, layout)
from dew.training.optim.registry import path_str
for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]:
    want = wanted[path_str(path)]
    specs[jax.tree_util.keystr(path)] = [str(leaf.sharding.spec), str(want), leaf.sharding.mesh.shape == mesh.shape]
try:
    from dew.build import build_run
    from dew.training.trainer import check
    check(*build_run(compose(*args, "trainer.mesh={data: 4, fsdp: 2}", "trainer.batch_size=36")))
    error = None
except ValueError as err:
    error = str(err)
params = {jax.tree_util.keystr(p): jax.device_get(x).tolist() for p, x in jax.tree_util.tree_flatten_with_path(state.params)[0]}
(out / "result.json").write_text(json.dumps({"devices": jax.device_count(), "journal": journal, "specs": specs,
                                             "error": error, "params": params}))
"""


def test_eight_devices_match_one(tmp_path: Path):
    env = fast_env(XLA_FLAGS="--xla_force_host_platform_device_count=8")
    proc = subprocess.run(
        [sys.executable, "-c", SHARDED, str(tmp_path / "sharded"), json.dumps(ARGS)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "sharded" / "result.json").read_text())
    assert result["devices"] == 8
    # Each parameter is laid out as the layout says, and the large ones really are split over fsdp.
    for path, (got, want, same_mesh) in result["specs"].items():
        assert got == want and same_mesh, (path, got, want)
    assert sum("fsdp" in got for got, _, _ in result["specs"].values()) >= 4
    # A batch of 36 does not split over data=4 x fsdp=2.
    assert "a batch of 36" in result["error"] and "8 devices" in result["error"], result["error"]
    # The same run on this process's one device: the same losses and parameters within float tolerance.
    state, _, journal = train_tiny(tmp_path / "single", *ARGS)
    for key in ("train/loss", "train/grad_norm", "eval/loss"):
        one, eight = losses(journal, key), losses(result["journal"], key)
        assert one.keys() == eight.keys() and one
        np.testing.assert_allclose(list(eight.values()), list(one.values()), rtol=2e-5, err_msg=key)
    import jax

    for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]:
        np.testing.assert_allclose(
            result["params"][jax.tree_util.keystr(path)],
            np.asarray(leaf),
            rtol=1e-4,
            atol=1e-6,
            err_msg=jax.tree_util.keystr(path),
        )
