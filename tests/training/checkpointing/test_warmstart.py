"""trainer.init_from: a digits run starts from another's parameters (its eval loss, its EMA), a shape
mismatch is refused before anything is written, init_skip keeps the seed's initialisation where it
says, and two processes warm-start as one does. One source run, trained once, serves every test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import dew, tree
from tests.training.conftest import TINY, compose, fast_env, journal, load_params, losses, train_tiny
from tests.training.test_multiprocess import pool, wait

pytestmark = pytest.mark.slow

SOURCE_STEPS = 20


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, float, float]:
    """A tiny digits run trained for 20 steps: (its run directory, its final eval loss, its first
    step's loss: the seed's random network on the first batch)."""
    tmp = tmp_path_factory.mktemp("source")
    _, run, log = train_tiny(
        tmp,
        f"trainer.steps={SOURCE_STEPS}",
        f"trainer.eval_every={SOURCE_STEPS}",
        f"trainer.checkpoint_every={SOURCE_STEPS}",
        name="src",
    )
    return run, losses(log, "eval/loss")[SOURCE_STEPS], losses(log)[1]


def test_a_warm_start_begins_at_the_source_and_resumes_from_its_own_checkpoints(tmp_path: Path, source):
    import shutil

    import jax
    import orbax.checkpoint as ocp

    from dew.recipe import Recipe

    src, src_loss, _ = source
    copy = tmp_path / "src"
    shutil.copytree(src, copy)
    args = (
        "trainer.steps=3",
        "trainer.eval_every=1",
        "trainer.checkpoint_every=1",
        "trainer.keep=5",
        f"trainer.init_from={copy}",
    )
    _, run, log = train_tiny(tmp_path, *args, name="warm")
    # The warm-up's first learning rate is 0: step 1 evaluates the parameters the run started from.
    assert losses(log, "eval/loss")[1] == pytest.approx(src_loss, abs=1e-6)
    theirs, ours = load_params(src, SOURCE_STEPS), load_params(run, 1)
    assert theirs.keys() == ours.keys() and all(np.array_equal(theirs[k], ours[k]) for k in theirs)
    ema = ocp.StandardCheckpointer().restore(run / "1" / "state")["ema"]  # the EMA started from them too
    flat = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(ema)[0]}
    # d·p + (1 - d)·p is p up to rounding
    assert flat.keys() == theirs.keys() and all(np.allclose(flat[k], theirs[k], rtol=1e-6, atol=1e-7) for k in theirs)
    assert Recipe.load(str(run)).trainer.init_from == str(copy)  # the record names the source
    final = load_params(run, 3)

    # The run stopped after step 1, and the source's step 20 now holds other parameters: the resume
    # reads the run's own checkpoint, so it ends where the uninterrupted run ended, bit for bit.
    shutil.rmtree(copy / str(SOURCE_STEPS))
    shutil.copytree(run / "2", copy / str(SOURCE_STEPS))
    shutil.rmtree(run / "3"), shutil.rmtree(run / "2")
    train_tiny(tmp_path, *args, name="warm")
    again = load_params(run, 3)
    assert all(np.array_equal(final[k], again[k]) for k in final)
    assert not all(np.array_equal(final[k], ours[k]) for k in final)  # it trained


def test_init_skip_keeps_the_seed_initialisation_where_it_says(source):
    import jax
    from flax import nnx

    from dew.build import build_run
    from dew.training import adapt, sharding
    from dew.training.checkpointing import warmstart

    src, _, _ = source
    recipe, objective, _ = build_run(compose(f"trainer.init_from={src}", "trainer.init_skip=[final_layer/.*]"))
    _, seeded, rest = adapt.init_model(recipe, objective)
    seeded = {"/".join(map(str, p)): np.asarray(v.get_value()) for p, v in nnx.to_flat_state(seeded)}
    _, params, rest = adapt.init_model(recipe, objective)
    params, _ = warmstart.load(recipe, params, rest, sharding.make_mesh(recipe.trainer), resuming=False)
    loaded = {"/".join(map(str, p)): np.asarray(jax.device_get(v.get_value())) for p, v in nnx.to_flat_state(params)}
    saved = {
        k.replace("']['", "/").strip("[']").removesuffix("/value"): v for k, v in load_params(src, SOURCE_STEPS).items()
    }
    skipped = [k for k in loaded if k.startswith("final_layer/")]
    assert skipped and all(np.array_equal(loaded[k], seeded[k]) for k in skipped)
    others = [k for k in loaded if k not in skipped]
    assert all(np.array_equal(loaded[k], saved[k]) for k in others)
    assert not all(np.array_equal(loaded[k], seeded[k]) for k in others)


def test_a_shape_mismatch_is_refused_naming_both_shapes_before_anything_is_written(workdir: Path, source):
    src, _, _ = source
    result = dew(
        *TINY,
        "trainer.steps=1",
        "model.config.hidden_size=48",
        f"trainer.init_from={src}",
        "trainer.checkpoint_dir=ck",
        "trainer.name=wide",
        cwd=workdir,
        env=fast_env(),
    )
    assert result.returncode == 2, result.stderr
    assert "x_embedder/kernel: (4, 48) here, (4, 32) in the source" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert tree(workdir) == []


def test_two_processes_on_a_sharded_mesh_warm_start_as_one_does(workdir: Path, source):
    src, _, _ = source
    args = ["trainer.steps=4", "trainer.eval_every=null", "trainer.checkpoint_every=null", f"trainer.init_from={src}"]
    a = losses(train_tiny(workdir, *args, name="one")[2])  # this process: one process, its devices
    # Two processes of one device, every parameter split over both (FSDP): each restores its half.
    sharded = ["trainer.mesh.data=1", "trainer.mesh.fsdp=2", "trainer.layout.min_shard_size=0"]
    assert wait(
        pool([*TINY, *args, *sharded, "trainer.checkpoint_dir=ck", "trainer.name=two"], workdir, tasks=2, devices=1)
    ) == [0, 0], (workdir / "rank0.out").read_text() + (workdir / "rank1.out").read_text()
    b = losses(journal(workdir, "two"))
    assert len(a) == 4 and a.keys() == b.keys() and all(abs(a[s] - b[s]) <= 1e-5 * abs(a[s]) for s in a), (a, b)
    assert a[1] < source[2] - 0.05  # the first step's loss is the trained source's, not the random network's


def test_lora_on_a_loaded_base_trains_only_its_factors_and_merges(tmp_path: Path, source):
    import jax
    from flax import nnx

    from dew.cli import export
    from dew.inference import exporting
    from dew.inference.drawing import sample_images
    from dew.inference.restore import for_inference, restore

    src, src_loss, _ = source
    # The first update is at the warm-up's learning rate of 0: the evaluation after it is the base's.
    _, run, log = train_tiny(
        tmp_path,
        "lora={rank: 2}",
        f"trainer.init_from={src}",
        "trainer.steps=3",
        "trainer.eval_every=1",
        "trainer.checkpoint_every=3",
        name="lora",
    )
    evals = losses(log, "eval/loss")
    assert evals[1] == pytest.approx(src_loss, abs=1e-6) and evals[3] != evals[1]

    assert json.loads((run / "init_from.json").read_text()) == {"source": str(src), "step": SOURCE_STEPS}
    adapted = restore(str(run), latest=True, ema=False)  # the base comes from the source step again
    state = {
        "/".join(map(str, p)): np.asarray(jax.device_get(v.get_value()))
        for p, v in nnx.to_flat_state(nnx.state(adapted.model, nnx.Param))
    }
    saved = {
        k.replace("']['", "/").strip("[']").removesuffix("/value"): v for k, v in load_params(src, SOURCE_STEPS).items()
    }
    assert set(saved) < set(state)
    assert all(np.array_equal(state[k], saved[k]) for k in saved)  # the base is the source's, bit for bit
    assert any(np.abs(state[k]).max() > 0 for k in state if k.endswith("_lora_b"))  # the factors trained

    exporting.run(
        export.parse_args([str(run), "--merge-lora", "--latest", "--no-ema", "--to", str(tmp_path / "merged")])
    )
    merged = restore(str(tmp_path / "merged"))
    assert merged.recipe.lora is None and merged.recipe.trainer.init_from is None

    def draw(r):
        return sample_images(r, count=2, seed=3, guidance_scale=None, steps=None, sampler=None)[0]

    a, b, c = draw(for_inference(adapted)), draw(for_inference(merged)), draw(restore(str(src), ema=False))
    # dew-sample draws a LoRA run from its merged weights: the merged checkpoint samples the same bits.
    assert np.array_equal(a, b) and np.abs(a - c).max() > 1e-3, np.abs(a - c).max()
    # The adapted product itself, x·W + s·(x·A)·B against x·(W + s·A·B): the same map in another order,
    # equal to rounding.
    assert np.abs(draw(adapted) - b).max() < 1e-5


def test_dew_export_refuses_what_it_cannot_write_and_writes_nothing(workdir: Path, source):
    src, _, _ = source
    result = dew(str(src), "--to", "hf", cwd=workdir, script="dew.cli.export")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "holds a 'transformer'; the run is a 'simple_dit'" in result.stderr, result.stderr
    assert tree(workdir) == []
