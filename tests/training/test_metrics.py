"""RunConfig.train(metrics=...): metrics computed on the evaluation batches as sums and counts,
logged as eval/<name>, checked against a NumPy reduction of the model's logits; a metric marked
best chooses the best checkpoint."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from dew.build import build_run
from dew.config import ModelConfig, TrainerConfig
from dew.contract.journal import read_journal
from dew.data.prepare import prepare
from dew.data.specs import TokenWindows
from dew.objectives.metrics import NextTokenAccuracy, builtin_metrics
from dew.recipe import Recipe
from dew.training.checkpointing.checkpoints import Checkpoints
from dew.training.trainer import best_criterion


@dataclasses.dataclass(frozen=True)
class TargetIsZero:
    """A metric written as the docs say: the fraction of target tokens that are id 0, a property
    of the data alone, so its reference is known exactly."""

    name: str = "target_zero"
    best: bool = False
    higher_is_better: bool = False

    def __call__(self, model, batch, key):
        from dew.objectives.metrics import masked_sum

        return masked_sum(batch["tokens"][:, 1:] == 0, batch["mask"])


def _run(tmp_path: Path, metrics, steps: int = 3):
    (tmp_path / "a.txt").write_text("the cat sat on the mat; a dog ran by the log. " * 30)
    prepare([str(tmp_path / "a.txt")], str(tmp_path / "prep"))
    recipe = Recipe(
        model=ModelConfig("transformer", {"hidden_size": 32, "depth": 1, "num_heads": 2}, dtype="float32"),
        data=TokenWindows(path=str(tmp_path / "prep" / "train.bin"), seq_len=16, val_fraction=0.3),
        optim=dataclasses.replace(Recipe().optim, learning_rate=3e-2),
        trainer=TrainerConfig(
            checkpoint_dir=str(tmp_path / "ck"),
            batch_size=8,
            steps=steps,
            log_every=1,
            eval_every=1,
            checkpoint_every=1,
            keep=1,
            compilation_cache_dir=None,
        ),
    )
    run, objective, dataset = build_run(recipe)
    state = run.train(objective, dataset, name="lm", metrics=metrics)
    return state, objective, dataset, read_journal(tmp_path / "tracking" / "lm" / "journal.jsonl")


@pytest.mark.slow
def test_metrics_are_logged_against_a_numpy_reference_and_choose_the_best(tmp_path):
    assert [
        m.name for m in builtin_metrics(type("O", (), {"summary": lambda self: {"objective": "next_token"}})())
    ] == ["accuracy"]
    state, _, dataset, journal = _run(tmp_path, [NextTokenAccuracy(best=True), TargetIsZero()])
    evals = [r for r in journal if r.get("event") == "eval"]
    assert len(evals) == 3 and all("eval/accuracy" in r and "eval/target_zero" in r for r in evals)

    # The reference: every held-out batch through the final model, argmax in NumPy, padding masked.
    model = state.model()
    hits = total = zeros = 0
    for batch in dataset.eval_batches(0, 1):
        tokens = np.asarray(batch["tokens"], np.int64)
        logits = np.asarray(jax.jit(lambda x: model(x))(tokens[:, :-1]), np.float64)
        mask = np.asarray(batch["mask"], bool)
        hits += (logits.argmax(-1) == tokens[:, 1:])[mask].sum()
        zeros += (tokens[:, 1:] == 0)[mask].sum()
        total += mask.sum() * (tokens.shape[1] - 1)
    assert evals[-1]["eval/accuracy"] == pytest.approx(hits / total, abs=1e-6)
    assert evals[-1]["eval/target_zero"] == pytest.approx(zeros / total, abs=1e-6)

    # The best checkpoint is the step of the highest accuracy (the latest is kept besides, keep=1).
    accuracy = {r["step"]: r["eval/accuracy"] for r in evals}
    loss = {r["step"]: r["eval/loss"] for r in evals}
    best = max(accuracy, key=accuracy.get)
    assert list(accuracy.values()).count(accuracy[best]) == 1, accuracy  # a tie would not test the rule
    assert best != min(loss, key=loss.get), (accuracy, loss)  # eval/loss would choose another step
    checkpoints = Checkpoints(
        state_dir := tmp_path / "ck" / "lm", keep=1, best_metric="eval/accuracy", higher_is_better=True
    )
    assert checkpoints.best_step() == best
    assert sorted(int(p.name) for p in state_dir.iterdir() if p.name.isdigit()) == sorted({best, 3})
    end = next(r for r in journal if r.get("event") == "end")
    assert end["best_step"] == best
    checkpoints.close()
    assert json.loads((state_dir / "run.json").read_text())["trainer"]["steps"] == 3


def test_metric_names_and_the_best_flag_are_checked():
    assert best_criterion([]) == ("eval/loss", False)
    assert best_criterion([NextTokenAccuracy(best=True)]) == ("eval/accuracy", True)
    with pytest.raises(ValueError, match="unique"):
        best_criterion([NextTokenAccuracy(), NextTokenAccuracy()])
    with pytest.raises(ValueError, match="all marked best"):
        best_criterion([NextTokenAccuracy(best=True), TargetIsZero(best=True)])
