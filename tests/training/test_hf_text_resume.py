"""A tiny language model trained on hf_text streamed from JSONL with a pretrained tokenizer, crashed
after a checkpoint and resumed: parameters and losses bit-identical to the uninterrupted run's; the
run keeps the tokenizer in its directory, and dew-sample decodes with that copy."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from dew.build import build_run
from dew.config import ModelConfig, TrainerConfig
from dew.contract.rundir import TOKENIZER_DIR
from dew.data.specs import HFText
from dew.data.tokenizer import from_record
from dew.inference.restore import recorded_tokenizer
from dew.recipe import Recipe
from tests.conftest import SUITE_CACHE
from tests.data.test_hf_text import TEXTS, make_tokenizer
from tests.training import wrappers
from tests.training.conftest import journal, losses


def train(tmp: Path, spec: HFText, crash_at: int | None = None):
    recipe = Recipe(
        model=ModelConfig("transformer", {"hidden_size": 32, "depth": 1, "num_heads": 2}, dtype="float32"),
        data=spec,
        trainer=TrainerConfig(
            steps=6,
            batch_size=8,
            checkpoint_every=2,
            eval_every=None,
            log_every=1,
            checkpoint_dir=str(tmp / "ck"),
            compilation_cache_dir=SUITE_CACHE,
        ),
    )
    recipe, objective, dataset = build_run(recipe)
    state = recipe.train(objective, wrappers.Data(dataset, crash_at=crash_at) if crash_at else dataset, name="run")
    return state, journal(tmp)


@pytest.mark.slow
def test_a_streamed_hf_text_run_resumes_bit_for_bit(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("DEW_DATA_DIR", str(tmp_path / "dew-cache"))
    source = tmp_path / "part.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    make_tokenizer(tmp_path / "model")
    spec = HFText(path=str(source), mode="stream", seq_len=8, tokenizer=str(tmp_path / "model"))
    whole, whole_journal = train(tmp_path / "a", spec)
    with pytest.raises(wrappers.Crash):
        train(tmp_path / "b", spec, crash_at=5)
    resumed, resumed_journal = train(tmp_path / "b", spec)
    for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(resumed.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert losses(resumed_journal) == losses(whole_journal) and sorted(losses(whole_journal)) == list(range(1, 7))
    # The tokenizer the run trained with is in its directory: dew-sample decodes with it, even once
    # the model directory it came from holds another.
    run = tmp_path / "b" / "ck" / "run"
    trained = make_tokenizer(tmp_path / "model")
    ids = trained.encode(TEXTS[3], add_special_tokens=False).ids
    make_tokenizer(tmp_path / "model", reverse=True)
    _, objective, _ = build_run(Recipe.load(str(run)))
    kept = recorded_tokenizer(objective, str(run))
    assert kept.tokenizer["file"] == str(run / TOKENIZER_DIR / "tokenizer.json")
    assert (
        from_record(kept.tokenizer).decode(ids) == trained.decode(ids) != from_record(objective.tokenizer).decode(ids)
    )
