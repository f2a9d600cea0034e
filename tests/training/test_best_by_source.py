"""A mixture's per-source values (``eval/<source>/loss``...) as every other evaluation value: one may
choose the best checkpoint (``trainer.evals.best``, with or without downstream tasks), checked before
the first step by the rule early stopping's metric is; ``debug=overfit`` keeps them; dew-eval reports
them as the loop does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dew.contract.evals import Evals, EvalTask
from tests.training.conftest import journal

SOURCES = ("web", "code")


def _mixture(root: Path, *overrides: str):
    """A tiny next-token run on two byte sources, each holding a quarter out, composed as dew-train does."""
    from tests.conftest import SUITE_CACHE
    from tests.training.mesh_runs import compose

    rng = np.random.default_rng(0)
    rng.integers(0, 128, 1200).astype("<u2").tofile(root / "web.bin")
    (rng.integers(0, 8, 1200) + 97).astype("<u2").tofile(root / "code.bin")  # 8 letters: easy to learn
    return compose(
        "data=mixture",
        *(f"data.components.{s}.data.path={root / s}.bin" for s in SOURCES),
        *(
            f"data.components.{s}.data.{k}"
            for s in SOURCES
            for k in ("seq_len=16", "vocab_size=257", "val_fraction=0.25")
        ),
        "~data.components.books",
        "~data.components.wiki",
        "+schema/data@data.components.code.data=token_windows",
        "+data.components.code.weight=0.5",
        "model=transformer_tiny",
        "model.config={hidden_size: 16, depth: 1, num_heads: 2}",
        "model.dtype=float32",
        "trainer.batch_size=8",
        "trainer.log_every=1",
        "trainer.eval_every=2",
        "trainer.checkpoint_every=2",
        f"trainer.checkpoint_dir={root / 'ck'}",
        f"trainer.compilation_cache_dir={SUITE_CACHE}",
        *overrides,
    )


@pytest.mark.slow  # two runs composed and checked (2.5 s)
def test_best_takes_any_value_the_run_reports_and_refuses_others_naming_them(tmp_path):
    from dew.build import build_run
    from dew.objectives.metrics import NextTokenAccuracy
    from dew.training.evaluate import NotReported, best_criterion
    from dew.training.setup import check

    recipe, objective, dataset = build_run(_mixture(tmp_path, "trainer.steps=2", "trainer.evals={best: eval/web/loss}"))
    check(recipe, objective, dataset)  # a source's value: reported, so accepted
    recipe, objective, dataset = build_run(
        _mixture(tmp_path, "trainer.steps=2", "trainer.evals={best: eval/wiki/loss}")
    )
    with pytest.raises(NotReported) as refused:
        check(recipe, objective, dataset)
    message = str(refused.value)
    assert message.startswith("trainer.evals.best='eval/wiki/loss' is not among the values this run's evaluations")
    listed = message.split("report: ")[1].split(", ")
    assert {"eval/loss", "eval/accuracy", "eval/web/loss", "eval/code/loss", "eval/code/accuracy"} <= set(listed)
    assert listed == sorted(listed) and "eval/wiki/loss" not in listed
    # Each value's direction: a task's own, a metric's per source too, lower for losses.
    evals = Evals((EvalTask("mc", "x"),), best="eval/web/accuracy")
    assert best_criterion([NextTokenAccuracy()], evals) == ("eval/web/accuracy", True)
    assert best_criterion([], Evals(best="eval/code/perplexity")) == ("eval/code/perplexity", False)
    assert best_criterion([], Evals((EvalTask("mc", "x"),), best="eval/mc/acc_norm")) == ("eval/mc/acc_norm", True)
    assert best_criterion([], Evals(best="eval/loss")) == ("eval/loss", False)
    with pytest.raises(ValueError, match=r"trainer\.evals\.best='web/loss' must be an evaluation value"):
        Evals(best="web/loss")


@pytest.mark.slow
def test_overfit_run_keeps_per_source_values_chooses_the_best_by_one_and_dew_eval_reports_them(tmp_path):
    from dew.build import build_run
    from dew.cli.eval import parse_args
    from dew.inference import evaluating

    recipe, objective, dataset = build_run(
        _mixture(
            tmp_path,
            "debug=overfit",
            "trainer.name=run",
            "trainer.steps=6",
            "trainer.eval_every=2",
            "trainer.checkpoint_every=2",
            "trainer.keep=5",
            "optim.learning_rate=0.05",
            "trainer.evals={best: eval/web/loss}",
        )
    )
    assert recipe.trainer.overfit_batches == 1
    recipe.train(objective, dataset, name="run")
    records = journal(tmp_path, "run")
    evals = {r["step"]: r for r in records if "eval/loss" in r and "event" not in r}
    assert sorted(evals) == [2, 4, 6]
    for values in evals.values():  # debug=overfit's evaluation reads each source's held-out data
        per_source = [values[f"eval/{s}/loss"] for s in SOURCES]
        assert all(np.isfinite(per_source)) and per_source[0] != per_source[1]
        assert min(per_source) <= values["eval/loss"] <= max(per_source)
    # The best checkpoint is the one of the lowest eval/web/loss (step 2 as measured: the one batch
    # of web's random tokens learnt by heart), not of eval/loss (4) nor eval/code/loss (6).
    (end,) = [r for r in records if r.get("event") == "end"]
    by = {key: min(evals, key=lambda s: evals[s][key]) for key in ("eval/web/loss", "eval/loss", "eval/code/loss")}
    assert end["best_step"] == by["eval/web/loss"] and len(set(by.values())) == 3, by
    # dew-sample's and dew-eval's "best" checkpoint is that one too, read from the run's record.
    from dew.inference import restore

    run_dir = str(tmp_path / "ck" / "run")
    checkpoints = restore.run_checkpoints(recipe, objective, run_dir)
    try:
        assert restore.choose_step(checkpoints, run_dir, step=None, latest=False) == by["eval/web/loss"]
    finally:
        checkpoints.close()
    _, best = evaluating.run(parse_args([run_dir]))  # dew-eval RUN: the best checkpoint's
    assert Path(best).name == f"step{by['eval/web/loss']}-mixture.json", best
    # dew-eval of a saved step reports each source's values, the loop's at that step.
    _, written = evaluating.run(parse_args([str(tmp_path / "ck" / "run"), "--step", "4"]))
    again = json.loads(Path(written).read_text())["metrics"]
    for key in ("eval/loss", "eval/web/loss", "eval/code/loss", "eval/code/perplexity"):
        assert again[key] == pytest.approx(evals[4][key], rel=1e-5), key
