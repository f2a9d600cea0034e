"""RunConfig.train's contract, in this process on a tiny digits run: retention across a restart,
accumulation against the full batch, a ramp resumed mid-stage, the non-finite stop and the dynamic
loss scale, MuonClip, W&B offline resume (under one W&B run id), and the errors raised before a run starts."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from dew.training.checkpointing.checkpoints import Checkpoints
from dew.training.trainer import NonFiniteError
from tests.training import wrappers
from tests.training.conftest import compose, journal, load_params, losses, steps_on_disk, train_tiny


def _leaves(state) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


@pytest.mark.slow
def test_keep_latest_plus_best_across_a_restart(tmp_path: Path):
    run_args = ["trainer.steps=8", "trainer.checkpoint_every=2", "trainer.eval_every=2", "trainer.keep=2"]
    negated = lambda o: wrappers.Objective(o, negate_eval=True)  # noqa: E731 - the earliest eval is the best
    with pytest.raises(wrappers.Crash):  # dies asking for the 7th batch: steps 2, 4, 6 saved
        train_tiny(tmp_path, *run_args, objective=negated, data=lambda d: wrappers.Data(d, crash_at=7))
    run = tmp_path / "ck" / "run"
    assert steps_on_disk(run) == [2, 4, 6]  # the 2 latest, and 2 is the best
    stop = journal(tmp_path)[-1]  # the crash is recorded before it propagates
    assert (stop["event"], stop["step"], stop["reason"]) == ("stop", 6, "error") and "Crash" in stop["message"]
    state, _, records = train_tiny(tmp_path, *run_args, objective=negated)
    assert "resuming run from step 6" in (run / "train.log").read_text()  # the latest, never the best
    assert steps_on_disk(run) == [2, 6, 8]  # 4 went; 2 stays as the best
    ckpts = Checkpoints(run, keep=2)
    assert (ckpts.best_step(), ckpts.latest_step()) == (2, 8)
    ckpts.close()
    assert sorted(losses(records)) == list(range(1, 9))  # steps 7-8 continue from 6; none twice
    assert int(state.step) == 8


@pytest.mark.slow
def test_accumulation_equals_the_full_batch(tmp_path: Path):
    deterministic = lambda o: wrappers.Objective(o, deterministic=True)  # noqa: E731
    args = ["trainer.steps=2", "trainer.eval_every=null", "trainer.checkpoint_every=null", "optim.clip_grads=0"]
    full, _, full_journal = train_tiny(tmp_path / "a", *args, objective=deterministic)
    micro, _, micro_journal = train_tiny(tmp_path / "b", *args, "trainer.accumulation=4", objective=deterministic)
    for a, b in zip(_leaves(full), _leaves(micro), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for key in ("train/loss", "train/grad_norm"):
        np.testing.assert_allclose(
            list(losses(full_journal, key).values()), list(losses(micro_journal, key).values()), rtol=1e-5
        )
    assert any(np.abs(a).sum() for a in _leaves(full))


@pytest.mark.slow
def test_a_ramp_resumed_mid_stage_continues_it_under_one_wandb_run(tmp_path: Path, monkeypatch):
    # Stages: 16 records for 3 steps, 24 for 2 steps (steps 4 and 5), then 32 to the end.
    args = ["trainer.steps=7", "trainer.eval_every=null", "trainer.batch_ramp={start: 16, increment: 8, records: 96}"]
    # Checkpoints only where the checks read them (a save leaves the state as it is): the reference
    # at its last step only; the interrupted run at 4, which the resume reads, and at 7. Every 2
    # steps, the three runs wrote 8 orbax checkpoints, 5 of them unread.
    whole, whole_run, _ = train_tiny(tmp_path / "a", *args, "trainer.checkpoint_every=null")
    # The same run with W&B (offline), killed after step 4 and resumed in the middle of the 24 stage.
    monkeypatch.setenv("WANDB_MODE", "offline")
    args += ["trainer.checkpoint_every=4", "trainer.wandb={project: p, offline: true}"]
    with pytest.raises(wrappers.Crash):
        train_tiny(tmp_path / "b", *args, data=lambda d: wrappers.Data(d, crash_at=5))
    run = tmp_path / "b" / "ck" / "run"
    ckpts = Checkpoints(run, keep=2)
    meta = ckpts.restore_meta(4)
    ckpts.close()
    assert (meta["records"], meta["ramp_stage"]) == (16 * 3 + 24, 1) and meta["wandb_id"]
    resumed, _, records = train_tiny(tmp_path / "b", *args)
    for a, b in zip(_leaves(whole), _leaves(resumed), strict=True):
        np.testing.assert_array_equal(a, b)
    for r in (whole_run, run):
        ckpts = Checkpoints(r, keep=2)
        assert ckpts.restore_meta(7)["records"] == 16 * 3 + 24 * 2 + 32 * 2
        ckpts.close()
    # One W&B run: the resumed process continued the id the checkpoint carried.
    ckpts = Checkpoints(run, keep=2)
    assert ckpts.restore_meta(7)["wandb_id"] == meta["wandb_id"]
    ckpts.close()
    offline_runs = sorted((tmp_path / "b" / "tracking" / "run" / "wandb").glob("offline-run-*"))
    assert len(offline_runs) == 2 and all(p.name.endswith(meta["wandb_id"]) for p in offline_runs)
    assert sorted(losses(records)) == list(range(1, 8))


@pytest.mark.slow
def test_a_non_finite_loss_stops_naming_the_step_and_the_last_good_checkpoint(tmp_path: Path):
    args = ["trainer.steps=6", "trainer.checkpoint_every=2", "trainer.eval_every=null"]
    with pytest.raises(NonFiniteError) as err:
        train_tiny(tmp_path, *args, data=lambda d: wrappers.Data(d, nan_at=5))
    run = tmp_path / "ck" / "run"
    assert "non-finite at step 5" in str(err.value) and f"step 4 in {run / '4'}" in str(err.value)
    assert steps_on_disk(run) == [2, 4]
    stop = journal(tmp_path)[-1]
    assert (stop["event"], stop["reason"], stop["message"]) == ("stop", "nonfinite", str(err.value))
    params = load_params(run, 4)
    assert all(np.isfinite(p).all() for p in params.values())


@pytest.mark.slow
def test_dynamic_scale_skips_the_step_and_backs_off(tmp_path: Path):
    args = ["trainer.steps=5", "trainer.checkpoint_every=4", "trainer.eval_every=null", "trainer.dynamic_scale=true"]
    state, run, records = train_tiny(tmp_path, *args, data=lambda d: wrappers.Data(d, nan_at=5))
    scale = losses(records, "train/loss_scale")
    assert scale[4] == 2.0**15 and scale[5] == 2.0**14 and float(state.loss_scale) == 2.0**14
    before = load_params(run, 4)
    after = load_params(run, 5)  # the final checkpoint: step 5 was skipped, so the same parameters
    for path in before:
        np.testing.assert_array_equal(before[path], after[path], err_msg=path)
    assert int(state.step) == 5 and all(np.isfinite(p).all() for p in after.values())


@pytest.mark.slow
def test_muonclip_caps_every_heads_max_logit(tmp_path: Path):
    tau = 0.5
    args = [
        "trainer.steps=6",
        "trainer.eval_every=null",
        "trainer.checkpoint_every=null",
        "optim.optimizer=muonclip",
        f"optim.optimizer_opts={{tau: {tau}}}",
    ]
    deterministic = lambda o: wrappers.Objective(o, deterministic=True)  # noqa: E731
    _, _, records = train_tiny(tmp_path, *args, objective=deterministic)
    logits = losses(records, "train/max_logit")  # the largest logit each step's forward pass saw
    assert logits[1] > 2 * tau  # at init the heads exceed tau...
    # ...and after the first clip every step starts near tau (the update lands on top of each clip)
    assert all(logits[s] <= tau * 1.25 for s in range(2, 7)), logits


def test_muonclip_refuses_qk_norm():
    from dew.models import of

    with pytest.raises(ValueError, match="qk_norm"):
        of("transformer", {"qk_norm": True, "vocab_size": 16, "seq_len": 8}).qk_clip_layers()
    layers = of("transformer", {"vocab_size": 16, "seq_len": 8, "num_heads": 4, "num_kv_heads": 2}).qk_clip_layers()
    assert layers["attn"].num_kv_heads == 2 and layers["attn"].query == ("blocks/attn/q/kernel",)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.steps=2", "trainer.mesh={data: 2}"], "needs 2 devices, 1 are visible"),
        (
            [
                "trainer.steps=2",
                "trainer.mesh={tensor: 1, data: 1, fsdp: 1}",
                "trainer.layout.rules.batch=[data]",
                "optim.optimizer=muonclip",
                "model.architecture=simple_dit",
                "trainer.epochs=null",
            ],
            None,
        ),
    ],
)
def test_errors_before_the_run_starts(tmp_path: Path, overrides, message):
    from dew.build import build_run
    from dew.training.trainer import check

    recipe, objective, dataset = build_run(compose(f"trainer.checkpoint_dir={tmp_path / 'ck'}", *overrides))
    if message is None:
        check(recipe, objective, dataset)  # a valid run checks clean
        return
    with pytest.raises(ValueError, match=message):
        check(recipe, objective, dataset)
    assert not (tmp_path / "ck").exists()


def test_a_dataset_at_another_batch_is_refused(tmp_path: Path):
    import dataclasses

    from dew.build import build_run
    from dew.training.trainer import check

    recipe, objective, dataset = build_run(compose(f"trainer.checkpoint_dir={tmp_path / 'ck'}", "trainer.steps=2"))
    other = dataclasses.replace(recipe, trainer=dataclasses.replace(recipe.trainer, batch_size=16))
    with pytest.raises(ValueError, match="loaded at batch 32, but trainer.batch_size=16"):
        check(other, objective, dataset)


def test_epoch_cadence_over_a_stream_is_refused():
    class Stream:
        num_records = None
        resumable = True

    trainer = compose("trainer.steps=2", "trainer.eval_every=epoch", "trainer.checkpoint_every=epoch").trainer
    for interval in (trainer.eval_interval, trainer.checkpoint_interval):
        with pytest.raises(ValueError, match="stream that reports none"):
            interval(Stream())
