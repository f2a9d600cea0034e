"""Training dynamics (``trainer.dynamics_every``, dew.training.dynamics): the values the compiled
step reports against a recomputation from the same parameters and batch: the gradients by
``jax.grad`` of the objective's own loss, the update by the optimizer's own ``update`` on them, the
activations by walking the model's blocks one at a time, eagerly, and the RMS of each in NumPy."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dew.config import ModelConfig, TrainerConfig
from dew.contract import dynamics
from dew.models import stack
from dew.objectives.autoregressive import NextToken
from dew.objectives.flow_matching import FlowMatchingKnobs
from dew.objectives.next_token import NextTokenKnobs
from dew.objectives.rectified_flow import FlowMatching
from dew.training.step import TrainState, make_train_step

TINY = {"hidden_size": 16, "depth": 2, "num_heads": 2}


@contextlib.contextmanager
def blocks_walked(outputs: list[jax.Array]) -> Iterator[None]:
    """Within: ``stack.run`` calls each block in turn, in a Python loop (no scan, no recording), and
    appends its output (the residual stream) to ``outputs``."""
    scanned = stack.run

    def walk(blocks, body, carry, *, scan, remat="none"):
        graphdef, state = nnx.split(blocks)
        depth = jax.tree.leaves(state)[0].shape[0]
        ys = []
        for i in range(depth):
            carry, y = body(nnx.merge(graphdef, jax.tree.map(lambda x, i=i: x[i], state)), carry)
            outputs.append(carry)
            ys.append(y)
        return carry, None if ys[0] is None else jnp.stack(ys)

    stack.run = walk
    try:
        yield
    finally:
        stack.run = scanned


def rms(x: np.ndarray | list[np.ndarray]) -> float:
    xs = [np.asarray(a, np.float64) for a in (x if isinstance(x, list) else [x])]
    return float(np.sqrt(sum(np.square(a).sum() for a in xs) / sum(a.size for a in xs)))


def expected(objective, params, rest, graphdef, tx, state, batch, key) -> dict[str, float]:
    """Every dynamics metric, recomputed outside the step."""

    def mean_loss(p):
        out = objective.loss(nnx.merge(graphdef, p, rest), batch, key)
        return out.total / out.count

    def recompute(p, opt_state):
        """The gradients, the update and each block's output, in one program (three programs, one
        each, cost 1.5 CPU-s more over the two step tests); the blocks still run one by one, and
        the gradients go through the model as it is (traced before the walk)."""
        grads = jax.grad(mean_loss)(p)
        updates, _ = tx.update(grads, opt_state, p)
        walked: list[jax.Array] = []
        with blocks_walked(walked):
            objective.loss(nnx.merge(graphdef, p, rest), batch, key)
        return grads, updates, walked

    grads, updates, walked = jax.jit(recompute)(params, state.opt_state)
    want = {f"dynamics/act_rms/blocks_{i}": rms(np.asarray(h)) for i, h in enumerate(walked)}
    trees = {"grad_rms": grads, "update_rms": updates, "param_rms": params}
    flat = {
        k: {"/".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(t)} for k, t in trees.items()
    }
    for kind, leaves in flat.items():
        groups: dict[str, list[np.ndarray]] = {}
        for path, x in leaves.items():
            parts = path.split("/")
            if parts[0] == "blocks":  # stacked: one group per block and module
                for i in range(x.shape[0]):
                    groups.setdefault(f"blocks_{i}_{parts[1]}", []).append(x[i])
            else:
                groups.setdefault(parts[0], []).append(x)
        want.update({f"dynamics/{kind}/{g}": rms(xs) for g, xs in groups.items()})
    for name in [n for n in want if n.startswith("dynamics/update_rms/")]:
        group = name.rsplit("/", 1)[1]
        param = want[f"dynamics/param_rms/{group}"]
        want[f"dynamics/update_ratio/{group}"] = want[name] / param if param > 0 else float("nan")
    return want


def check(objective, batch, *, accumulation: int, key_of_step) -> dict[str, float]:
    graphdef, params, rest = nnx.split(objective.build(nnx.Rngs(params=0)), nnx.Param, ...)
    tx = optax.adamw(1e-2, weight_decay=0.1)
    state = TrainState.create(params, tx, seed=3, ema=False, dynamic_scale=False)
    state = state.replace(graphdef=graphdef, rest=rest)
    step = jax.jit(
        make_train_step(
            objective, graphdef, rest, tx, lambda s: 1e-2, accumulation=accumulation, dynamic_scale=False, dynamics=True
        )
    )
    want = expected(objective, params, rest, graphdef, tx, state, batch, key_of_step(state))
    _, metrics = step(state, batch)
    got = {k: float(v) for k, v in jax.device_get(metrics).items() if k.startswith("dynamics/")}
    assert set(got) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=2e-4, atol=1e-7, err_msg=name)
    return got


@pytest.mark.slow
def test_the_transformer_step_reports_each_block_and_group_as_numpy_recomputes_them():
    """Two micro-batches: the activations and gradients are the whole batch's."""
    lm = ModelConfig("transformer", {**TINY, "vocab_size": 13, "seq_len": 8}, dtype="float32")
    o = NextToken(lm, NextTokenKnobs(), 13, 8)
    tokens = jax.random.randint(jax.random.PRNGKey(0), (4, 9), 0, 13)
    got = check(o, {"tokens": tokens}, accumulation=2, key_of_step=lambda s: s.key)
    assert {"dynamics/act_rms/blocks_1", "dynamics/grad_rms/blocks_1_attn", "dynamics/grad_rms/embed"} <= set(got)
    assert not any(k.endswith("blocks_2") for k in got)  # depth 2: blocks 0 and 1


@pytest.mark.slow
def test_the_dit_step_reports_each_block_and_group_as_numpy_recomputes_them():
    """adaLN-Zero's zero-initialised modulation has no update ratio (NaN), not an infinite one."""
    fields = {**TINY, "patch_size": 2, "input_size": 8, "in_channels": 1, "num_classes": 10}
    o = FlowMatching(ModelConfig("simple_dit", fields, dtype="float32"), FlowMatchingKnobs(), 10, (8, 8, 1))
    batch = {
        "image": jax.random.normal(jax.random.PRNGKey(1), (4, 8, 8, 1)),
        "label": jnp.arange(4, dtype=jnp.int32),
    }
    step_key = lambda s: jax.random.fold_in(jax.random.fold_in(s.key, s.step), 0)  # noqa: E731  # the step's draw
    got = check(o, batch, accumulation=1, key_of_step=step_key)
    zero = [k for k in got if k.startswith("dynamics/param_rms/") and got[k] == 0.0]
    assert zero and all(np.isnan(got[k.replace("param_rms", "update_ratio")]) for k in zero)


def test_a_step_without_dynamics_reports_none():
    lm = ModelConfig("transformer", {**TINY, "vocab_size": 13, "seq_len": 8}, dtype="float32")
    o = NextToken(lm, NextTokenKnobs(), 13, 8)
    graphdef, params, rest = nnx.split(o.build(nnx.Rngs(params=0)), nnx.Param, ...)
    tx = optax.sgd(0.1)
    state = TrainState.create(params, tx, seed=0, ema=False, dynamic_scale=False).replace(graphdef=graphdef, rest=rest)
    step = make_train_step(o, graphdef, rest, tx, lambda s: 0.1, accumulation=1, dynamic_scale=False)
    _, metrics = jax.eval_shape(step, state, {"tokens": jnp.zeros((2, 9), jnp.int32)})  # traced, not run
    assert not [k for k in metrics if k.startswith("dynamics/")]


def test_dynamics_every_must_be_a_multiple_of_log_every():
    assert TrainerConfig(batch_size=8, log_every=10, dynamics_every=100).dynamics_every == 100
    for bad in (15, 0, -10):
        with pytest.raises(
            ValueError, match=rf"trainer.dynamics_every={bad} must be a positive multiple of trainer.log_every=10"
        ):
            TrainerConfig(batch_size=8, log_every=10, dynamics_every=bad)


def test_metric_names_are_what_every_tracker_sorts_by():
    """Each part between slashes is W&B's sortable name (``[_a-zA-Z][_a-zA-Z0-9]*``)."""
    import re

    names = [f"dynamics/{k}/blocks_{i}_attn" for k in dynamics.KINDS for i in (0, 11)] + ["dynamics/act_rms/blocks_3"]
    for name in names:
        assert all(re.fullmatch(r"[_a-zA-Z][_a-zA-Z0-9]*", part) for part in name.split("/")), name
        assert dynamics.split(name) is not None
    assert dynamics.split("train/loss") is None


@pytest.mark.slow
def test_a_run_journals_the_dynamics_at_their_steps_and_dew_runs_plots_them(tmp_path):
    """trainer.dynamics_every=2 over 4 steps logged every step: the dynamics at steps 2 and 4 only,
    in the journal; ``dew-runs plot --dynamics`` draws them."""
    from dew.cli.runs import run as runs_command
    from tests.training.conftest import train_tiny

    _, run_dir, records = train_tiny(tmp_path, "trainer.steps=4", "trainer.dynamics_every=2", "trainer.eval_every=null")
    logged = {r["step"]: r for r in records if "train/loss" in r}
    assert sorted(s for s, r in logged.items() if "dynamics/act_rms/blocks_0" in r) == [2, 4]
    # adaLN-Zero: the attention's gradient is zero until its gate and the final layer have moved
    assert logged[2]["dynamics/grad_rms/blocks_0_attn"] == 0 < logged[4]["dynamics/grad_rms/blocks_0_attn"]
    out = tmp_path / "dynamics.png"
    assert "the training dynamics of run" in runs_command(["plot", str(run_dir), "--dynamics", "-o", str(out)])
    assert out.stat().st_size > 10_000
    if os.environ.get("DEW_DYNAMICS_PNG"):  # to look at it
        shutil.copy(out, os.environ["DEW_DYNAMICS_PNG"])
