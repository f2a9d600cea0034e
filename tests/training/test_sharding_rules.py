"""Sharding by declaration: every parameter names its axes, the rules map names to mesh axes, and on
8 simulated CPU devices four meshes train the transformer (and the two that split every axis the
DiT) to the losses of one device, each parameter (and its optimizer moments) laid out as the rules
say; a run resumes onto another mesh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO
from tests.training.conftest import fast_env
from tests.training.mesh_runs import ON

TRANSFORMER = {"vocab_size": 64, "seq_len": 16, "hidden_size": 32, "depth": 2, "num_heads": 4}


def abstract(architecture: str, fields: dict):
    from flax import nnx

    from dew.contract.models import build

    return nnx.state(nnx.eval_shape(lambda: build(architecture, fields, nnx.Rngs(0))), nnx.Param)


@pytest.mark.parametrize(
    "architecture, fields",
    [
        ("transformer", {**TRANSFORMER, "num_kv_heads": 2, "qk_norm": True}),
        ("transformer", {**TRANSFORMER, "tie_embeddings": True}),
        (
            "simple_dit",
            {"hidden_size": 32, "depth": 2, "num_heads": 4, "input_size": 8, "in_channels": 1, "num_classes": 10},
        ),
        (
            "simple_dit",
            {"hidden_size": 32, "depth": 2, "num_heads": 4, "input_size": 16, "vocab_size": 65, "num_classes": 0},
        ),
    ],
)
def test_every_parameter_names_each_of_its_dimensions(architecture, fields):
    from dew.models.axes import LOGICAL_AXES
    from dew.training.sharding import logical_names

    params = abstract(architecture, fields)
    names = logical_names(params)
    from flax import nnx

    for path, variable in nnx.to_flat_state(params):
        key = "/".join(map(str, path))
        assert names[key] is not None and len(names[key]) == variable.ndim, (key, names[key], variable.shape)
        assert set(names[key]) - {None} <= set(LOGICAL_AXES), (key, names[key])
        assert (names[key][0] == "layers") == key.startswith("blocks/"), (key, names[key])


def test_the_rules_refuse_unknown_names_and_axes_and_splits_that_do_not_divide():
    from jax.sharding import AbstractMesh

    from dew.config import Layout, default_rules
    from dew.training.sharding import param_specs

    with pytest.raises(ValueError, match="unknown logical axis 'hidden'"):
        Layout(rules={**default_rules(), "hidden": ("tensor",)})
    with pytest.raises(ValueError, match=r"trainer.layout.rules.embed: unknown mesh axis 'model'"):
        Layout(rules={**default_rules(), "embed": ("model",)})
    mesh = AbstractMesh((1, 1, 8), ("data", "fsdp", "tensor"))  # 4 heads over 8 devices
    with pytest.raises(ValueError) as err:
        param_specs(abstract("transformer", TRANSFORMER), mesh, Layout())
    message = str(err.value)
    assert "blocks/attn/k/kernel of shape (2, 32, 4, 8)" in message and "'tensor': 8" in message, message
    assert "kv_heads=4" in message and "trainer.layout.rules.kv_heads" in message, message


def test_min_shard_size_and_an_empty_rule_replicate():
    from jax.sharding import AbstractMesh
    from jax.sharding import PartitionSpec as P

    from dew.config import Layout, default_rules
    from dew.training.sharding import param_specs

    mesh = AbstractMesh((1, 2, 2), ("data", "fsdp", "tensor"))
    params = abstract("transformer", TRANSFORMER)
    specs = param_specs(params, mesh, Layout(min_shard_size=0))
    assert specs["blocks/mlp_up/kernel"] == P(None, "fsdp", "tensor")
    assert specs["blocks/attn/o/kernel"] == P(None, "tensor", None, "fsdp")
    assert specs["embed/embedding"] == P("tensor", "fsdp")
    assert param_specs(params, mesh, Layout(min_shard_size=10**6))["blocks/mlp_up/kernel"] == P()
    no_tp = param_specs(params, mesh, Layout(rules={**default_rules(), "mlp": ()}, min_shard_size=0))
    assert no_tp["blocks/mlp_up/kernel"] == P(None, "fsdp", None)


def test_lora_factors_take_the_axes_of_the_weight_they_adapt():
    from flax import nnx
    from jax.sharding import AbstractMesh
    from jax.sharding import PartitionSpec as P

    from dew.config import Layout, LoRA
    from dew.contract.models import build, of
    from dew.training import adapt
    from dew.training.sharding import logical_names, param_specs

    model = nnx.eval_shape(
        lambda: adapt.adapt(
            of("transformer", TRANSFORMER),
            build("transformer", TRANSFORMER, nnx.Rngs(0)),
            quantization=None,
            lora=LoRA(rank=4, targets=("blocks/mlp_up",)),
            seed=0,
        )
    )
    factors = nnx.state(model, nnx.LoRAParam)
    names = logical_names(factors)
    assert names["blocks/mlp_up/kernel_lora_a"] == ("layers", "embed", None)
    assert names["blocks/mlp_up/kernel_lora_b"] == ("layers", None, "mlp")
    specs = param_specs(factors, AbstractMesh((1, 2, 2), ("data", "fsdp", "tensor")), Layout(min_shard_size=0))
    assert specs["blocks/mlp_up/kernel_lora_b"] == P(None, None, "tensor")
    assert specs["blocks/mlp_up/kernel_lora_a"] == P(None, "fsdp", None)


@pytest.mark.slow
def test_four_meshes_of_eight_devices_train_as_one_device(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "tests.training.mesh_runs", str(tmp_path)],
        cwd=REPO,
        env=fast_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["devices"] == 8
    for arch in ("transformer", "simple_dit"):  # with bf16 moments and with Muon respectively
        one = result[f"{arch}/one"]["losses"]
        for mesh in ON[arch]:
            run = result[f"{arch}/{mesh}"]
            np.testing.assert_allclose(run["losses"], one, rtol=1e-5, err_msg=f"{arch} on {mesh}")
            # On the arrays: each parameter and each of its optimizer moments as the rules say.
            for path, (got, want, *moments) in run["specs"].items():
                assert got == want and all(m == want for m in moments), (arch, mesh, path, got, want, moments)
            split = [want for _, want, *_ in run["specs"].values() if "'" in want]  # names a mesh axis
            assert (not split) == (mesh == "data8"), (arch, mesh, split)
        tp = result[f"{arch}/fsdp4_tensor2"]["specs"]
        assert tp["blocks/attn/q/kernel"][0] == "P(None, 'fsdp', 'tensor', None)"  # heads
        assert tp["blocks/attn/o/kernel"][0] == "P(None, 'tensor', None, 'fsdp')"
        hidden = "blocks/mlp_up/kernel" if arch == "transformer" else "blocks/mlp_in/kernel"
        assert tp[hidden][0] == "P(None, 'fsdp', 'tensor')"  # MLP hidden
    # Saved after 2 steps on fsdp 4 x tensor 2, restored onto data 2 x fsdp 2 x tensor 2: the third
    # step's loss is the uninterrupted run's, and the restored arrays are laid out for the new mesh.
    resumed = result["resumed"]
    np.testing.assert_allclose(resumed["losses"], result["transformer/fsdp4_tensor2"]["losses"][2:], rtol=1e-5)
    assert all(got == want for got, want, *_ in resumed["specs"].values())
    assert resumed["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}


@pytest.mark.parametrize(
    ("shape", "processes", "shared"),
    [
        ({"data": 4, "fsdp": 1, "tensor": 2}, 4, None),  # each process's 2 devices are one row's tensor pair
        ({"data": 2, "fsdp": 1, "tensor": 4}, 4, [0, 1, 2, 3]),  # a row's 4 devices span 2 processes
        ({"data": 2, "fsdp": 2, "tensor": 2}, 2, None),  # fsdp is a batch axis too: 4 rows, 2 a process
        ({"data": 2, "fsdp": 2, "tensor": 2}, 8, list(range(8))),  # one device a process: every row on two
        ({"data": 1, "fsdp": 1, "tensor": 2}, 2, [0, 1]),
        ({"data": 1, "fsdp": 1, "tensor": 2}, 1, None),
        ({"data": 3, "fsdp": 1, "tensor": 1}, 2, None),  # 3 devices over 2 processes: the run's check decides
    ],
)
def test_a_launcher_finds_the_rows_a_job_s_processes_would_share(shape, processes, shared):
    """``shared_rows_over``: before any process exists, which rows of the batch would sit on two
    processes, devices assigned as ``make_mesh`` lays ``jax.devices()`` out (process by process)."""
    from jax.sharding import AbstractMesh

    from dew.contract.config import Layout
    from dew.training import sharding

    problem = sharding.shared_rows_over(AbstractMesh(tuple(shape.values()), tuple(shape)), Layout(), processes)
    assert (problem is None) == (shared is None), problem
    if shared is not None:
        assert f"so processes {shared} hold the same rows of it" in problem
