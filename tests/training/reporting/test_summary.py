"""What a run says at its start and end (dew.training.reporting.summary), checked against the run's own journal,
and the samples it logs to W&B at each evaluation."""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from tests.training.conftest import dew_train, fast_env, journal, train_tiny


@pytest.mark.slow
def test_start_and_end_messages_and_wandb_media(tmp_path: Path, monkeypatch, caplog):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    caplog.set_level(logging.INFO, logger="dew")
    state, run, journal = train_tiny(
        tmp_path,
        "trainer.steps=4",
        "trainer.log_every=3",
        "trainer.eval_every=2",
        "trainer.checkpoint_every=2",
        "trainer.wandb={project: p, offline: true}",
        "trainer.name=null",
        name="unnamed-run",
    )
    text = caplog.text
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(state.params))
    assert f"{params / 1e3:.1f}k trainable parameters" in text and "optimizer state" in text
    assert "devices: 1 x cpu" in text and "mesh data=1 fsdp=1 tensor=1" in text
    # compiled, or loaded from the session's compilation cache (tests/conftest.py)
    ran = re.search(r"(compiled|loaded) the train step (from the compilation cache )?and ran step 1 in", text)
    assert ran and text.index("compiling the train step") < ran.start()
    first = next(r for r in journal if "train/loss" in r)  # the journal logs every 3rd step ...
    assert first["step"] == 3
    assert "step 1/4  loss " in text  # ... and the terminal shows step 1 all the same
    evals = {r["step"]: r["eval/loss"] for r in journal if "eval/loss" in r and "event" not in r}
    best = min(evals, key=evals.get)
    assert f"eval/loss {evals[4]:.4g} at step 4 (final); best {evals[best]:.4g} at step {best}" in text
    end = next(r.getMessage() for r in caplog.records if "finished at step 4 in" in r.getMessage())
    assert all(f"{part} " in end for part in ("compile", "train", "eval", "checkpoint"))
    assert f"next: dew-sample {run}" in text and f"dew-runs plot {run}" in text
    assert "it is called 'unnamed-run'; resume it with trainer.name=unnamed-run" in text
    # The sample grid of each evaluation, beside the journal and in the offline W&B run's media.
    folder = tmp_path / "tracking" / "unnamed-run"
    assert sorted(p.name for p in (folder / "samples").iterdir()) == ["2.png", "4.png"]
    assert len(list((folder / "wandb").rglob("media/images/samples_*.png"))) == 2


def test_emulated_dtype_warning(tmp_path: Path, caplog):
    from dew.training import sharding
    from dew.training.reporting.summary import EMULATED, RunReport
    from tests.training.conftest import compose

    run = compose("model.dtype=bfloat16", f"trainer.checkpoint_dir={tmp_path}")
    caplog.set_level(logging.INFO, logger="dew")
    report = RunReport(run, "r", tmp_path / "r", total_steps=10)
    report.start(
        mesh=sharding.make_mesh(run.trainer),
        params={"w": jnp.zeros((3, 4))},
        opt_state={"m": jnp.zeros((3, 4), jnp.bfloat16)},
        resumed_from=7,
    )
    assert "resuming at step 7" in caplog.text and "12 trainable parameters (48 B); optimizer state 24 B" in caplog.text
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert "model.dtype=bfloat16 is emulated on the cpu backend" in warning.getMessage()
    assert f"{EMULATED[('cpu', 'bfloat16')]:.1f}x slower" in warning.getMessage()


@pytest.mark.parametrize("evaluates", [True, False])
def test_a_run_without_held_out_data_says_so_once_at_the_start(tmp_path: Path, caplog, evaluates: bool):
    from dew.training import sharding
    from dew.training.reporting.summary import RunReport
    from tests.training.conftest import compose

    run = compose("trainer.eval_every=5", f"trainer.checkpoint_dir={tmp_path}")  # data=digits
    caplog.set_level(logging.INFO, logger="dew")
    report = RunReport(run, "r", tmp_path / "r", total_steps=10, evaluates=evaluates)
    report.start(mesh=sharding.make_mesh(run.trainer), params={}, opt_state={}, resumed_from=None)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("batch ")]
    said = "evaluating nothing (data=digits holds no held-out split; data.eval_fraction holds some out)"
    assert ("evaluating every 5" in line, said in line) == (evaluates, not evaluates), line
    assert caplog.text.count("held-out") == (0 if evaluates else 1)


def test_overfit_batches_count_the_held_out_records_of_their_dataset():
    import types

    from dew.data.overfit import OverfitBatches

    def data(**held):
        return types.SimpleNamespace(batch_size=2, num_records=8, seed=0, **held)

    assert OverfitBatches(data(num_eval_records=0), 1).num_eval_records == 0  # type: ignore[arg-type]
    assert OverfitBatches(data(num_eval_records=3), 1).num_eval_records == 3  # type: ignore[arg-type]
    assert OverfitBatches(data(), 1).num_eval_records is None  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_second_run_loads_the_step_from_the_compilation_cache(tmp_path: Path):
    args = [
        "experiment=digits",
        "model.config.depth=1",
        "model.config.hidden_size=32",
        "model.config.num_heads=2",
        "trainer.batch_size=32",
        "trainer.steps=2",
        "trainer.eval_every=null",
        "trainer.checkpoint_every=null",
        "optim.schedule.warmup_steps=1",
        "flow_matching.samples_per_class=1",
        "flow_matching.sample_steps=1",
        # No end samples: the sampler is one more program the first run compiles and the second
        # loads, and these checks are the train step's (a sampler loaded from the cache is checked
        # by tests/objectives/test_sample.py's text run: its second call writes no new entry).
        "trainer.final_samples=false",
        f"trainer.compilation_cache_dir={tmp_path / 'cache'}",
        f"trainer.checkpoint_dir={tmp_path / 'ck'}",
    ]
    first = dew_train(*args, "optim.weight_decay=0.01", "trainer.name=a", cwd=tmp_path, env=fast_env())
    assert first.returncode == 0, first.stdout[-3000:]
    assert "compiled the train step and ran step 1" in first.stdout
    # Another rate, warmup, length and weight decay: these numbers are the step's inputs, not
    # constants of its program (Optimizer.inputs), so the second run loads the program the first compiled ...
    other = ["optim.learning_rate=0.003", "optim.schedule.warmup_steps=2", "trainer.steps=4", "optim.weight_decay=0.05"]
    other.append("trainer.log_every=1")
    second = dew_train(*args, *other, "trainer.name=b", cwd=tmp_path, env=fast_env())
    assert second.returncode == 0, second.stdout[-3000:]
    assert "loaded the train step from the compilation cache and ran step 1" in second.stdout
    assert re.search(r"compilation cache \S+: \d+ hits, 0 misses", second.stdout), second.stdout[-3000:]
    # ... and steps with its own numbers: linear warmup over 2 updates to 0.003, cosine to 0 at step 4.
    lr = {r["step"]: r["train/lr"] for r in journal(tmp_path, "b") if "train/lr" in r}
    expected = {1: 0.0, 2: 0.0015, 3: 0.003, 4: 0.0015}
    assert lr.keys() == expected.keys() and all(math.isclose(lr[s], expected[s], abs_tol=1e-9) for s in lr), lr


@pytest.mark.parametrize(
    ("best", "said"),
    [
        (("eval/mc/acc", True), "eval/mc/acc 0.6 at step 6 (final); best 0.8 at step 4"),
        (("eval/loss", False), "eval/loss 1.5 at step 6 (final); best 1.5 at step 6"),
    ],
)
def test_the_end_names_the_value_that_chose_the_best_checkpoint(tmp_path: Path, caplog, best, said):
    """trainer.evals.best=eval/mc/acc (higher is better): the end's best is the accuracy's highest
    evaluation, not the lowest eval/loss (which falls at a later step)."""
    from dew.training.reporting.summary import RunReport
    from tests.training.conftest import compose

    run = compose(f"trainer.checkpoint_dir={tmp_path}")
    report = RunReport(run, "r", tmp_path / "r", total_steps=6, best=best)
    for step, loss, acc in ((2, 2.5, 0.4), (4, 2.0, 0.8), (6, 1.5, 0.6)):
        report.evaluated(step, {"eval/loss": loss, "eval/mc/acc": acc})
    caplog.set_level(logging.INFO, logger="dew")
    report.end(6)
    [line] = [r.getMessage() for r in caplog.records if "(final)" in r.getMessage()]
    assert line.startswith(said) and line.endswith("(the best checkpoint, when it was saved)"), line


def test_the_end_names_the_checkpoint_dew_sample_takes(tmp_path: Path, caplog):
    """dew-sample takes the best checkpoint, or the newest where no evaluation chose one
    (``trainer.eval_every=null``): the end's next line says which."""
    from dew.training.reporting.summary import RunReport
    from tests.training.conftest import compose

    run = compose(f"trainer.checkpoint_dir={tmp_path}")
    caplog.set_level(logging.INFO, logger="dew")
    for values, which in (({"eval/loss": 1.5}, "the best checkpoint"), ({}, "the newest checkpoint")):
        caplog.clear()
        report = RunReport(run, "r", tmp_path / "r", total_steps=4)
        report.evaluated(4, values)
        report.end(4)
        assert f"next: dew-sample {tmp_path / 'r'}   (samples from {which})" in caplog.text, caplog.text
