"""dew-plan: the parameters of a run on a mesh of devices this machine does not have, with their bytes
per device computed independently here, and a split that does not divide refused with exit status 2."""

from __future__ import annotations

import math
import re
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO, dew, tree

TINY_LM = [
    "model=transformer",
    "model.config={vocab_size: 64, seq_len: 16, hidden_size: 32, depth: 2, num_heads: 4}",
    "trainer.batch_size=16",
    "trainer.layout.min_shard_size=0",
]


def compose(*overrides: str):
    from tests.training.mesh_runs import compose as hydra_compose

    return hydra_compose(*overrides)


def test_the_console_script_is_declared():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["dew-plan"] == "dew.cli.plan:main"


@pytest.mark.slow
def test_dew_plan_prints_each_parameter_on_a_mesh_it_does_not_have(workdir: Path):
    proc = dew(*TINY_LM, "trainer.mesh={data: 2, fsdp: 2, tensor: 2}", cwd=workdir, script="dew.cli.plan")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "mesh data=2 x fsdp=2 x tensor=2 (8 devices)" in out
    row = re.search(
        r"\| blocks/mlp_up/kernel \| \(2, 32, 128\) \| layers, embed, mlp \| P\(None, 'fsdp', 'tensor'\) \| "
        r"([0-9.]+) \|",
        out,
    )
    assert row and float(row.group(1)) == pytest.approx(2 * 32 * 128 * 4 / 4 / 2**20, abs=0.01), out
    assert "activations, batch 4 per device" in out and "| total |" in out
    assert tree(workdir) == []  # writes nothing


def test_bytes_per_device_follow_the_splits():
    from dew.training.plan import plan

    whole = plan(compose(*TINY_LM, "trainer.mesh={data: 8}"))
    assert whole.mesh == {"data": 8, "fsdp": 1, "tensor": 1}
    assert whole.param_bytes == 4 * whole.param_count  # float32, replicated
    # AdamW's mu and nu, and a few int32 step counts (Adam's, the schedule's).
    assert 0 < whole.optimizer_bytes - 2 * whole.param_bytes <= 16
    split = plan(compose(*TINY_LM, "trainer.mesh={data: 1, fsdp: 4, tensor: 2}"))
    expected = 0
    for p in split.params:
        shards = math.prod({"'fsdp'": 4, "'tensor'": 2}.get(a, 1) for a in re.findall(r"'\w+'", p.spec))
        expected += math.prod(p.shape) * 4 // shards
    assert split.param_bytes == expected < whole.param_bytes / 4
    assert 0 < split.optimizer_bytes - 2 * split.param_bytes <= 16  # the moments follow their parameters
    assert split.batch_per_device == 4 and whole.batch_per_device == 2  # 16 over fsdp 4; over data 8
    assert split.activation_bytes == 2 * whole.activation_bytes  # twice the examples per device


@pytest.mark.slow
def test_a_split_that_does_not_divide_is_refused_naming_the_parameter(workdir: Path):
    proc = dew(*TINY_LM, "trainer.mesh={data: 1, tensor: 8}", cwd=workdir, script="dew.cli.plan")
    assert proc.returncode == 2, proc.stderr
    assert "parameter blocks/attn/k/kernel of shape (2, 32, 4, 8)" in proc.stderr
    assert "'tensor': 8" in proc.stderr and "Traceback" not in proc.stderr
