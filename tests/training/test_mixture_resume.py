"""A dew-train run on a mixture of three sources (token_windows, text_stream, hf_text), SIGKILLed
after a checkpoint and started again with the same command, ends with the parameters, bit for bit,
and the losses of a run that was never interrupted; its journal holds each source's evaluation
(``eval/<source>/loss``) beside the mixture's, watched by early stopping."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dew.contract.journal import read_journal
from tests.conftest import SUITE_CACHE
from tests.training.conftest import dew_train, load_params, losses, steps_on_disk

pytestmark = pytest.mark.slow

STEPS = 24
SOURCES = ("web", "books", "wiki")


def _sources(work: Path) -> list[str]:
    """Three byte-level sources in ``work`` and the overrides that mix them 0.5/0.3/0.2, each with
    its held-out text."""
    rng = np.random.default_rng(0)
    rng.integers(0, 256, 4000).astype("<u2").tofile(work / "web.bin")
    (work / "books").mkdir()
    for i in range(4):
        (work / "books" / f"{i}.txt").write_text(f"Book {i}. " + "Once upon a time there was a fox. " * 30)
    (work / "held_out.txt").write_text("The fox slept. " * 40)
    rows = [{"text": f"Article {i} on the lazy dog and the quick fox. " * 4} for i in range(40)]
    (work / "wiki.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:34]))
    (work / "wiki_val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[34:]))
    web, books, wiki = (f"data.components.{s}" for s in SOURCES)
    return [
        "data=mixture",
        f"{web}.data.path=web.bin",
        f"{web}.data.vocab_size=257",
        f"{web}.data.val_fraction=0.1",
        f"{books}.data.path=books/*.txt",
        f"{books}.data.val_path=held_out.txt",
        f"{wiki}.data.path=wiki.jsonl",
        f"{wiki}.data.val_path=wiki_val.jsonl",
        f"{wiki}.data.cache_dir=cache",
        *(f"data.components.{s}.data.seq_len=16" for s in SOURCES),
    ]


ARGS = [
    "model=transformer_tiny",
    "model.config.hidden_size=32",
    "model.config.depth=1",
    "model.config.num_heads=2",
    "trainer.name=r",
    "trainer.checkpoint_dir=ck",
    "trainer.batch_size=8",
    f"trainer.steps={STEPS}",
    "trainer.checkpoint_every=4",
    "trainer.eval_every=12",
    f"trainer.compilation_cache_dir={SUITE_CACHE}",
    "trainer.log_every=1",
    "trainer.early_stopping={metric: eval/wiki/loss, patience: 5}",
]


def _journal(work: Path) -> list[dict]:
    return read_journal(work / "tracking" / "r" / "journal.jsonl")


def _checkpointed(work: Path) -> bool:
    """A checkpoint is committed: the run is past its first save, well before its end."""
    run = work / "ck" / "r"
    return run.is_dir() and bool(steps_on_disk(run))


def test_a_mixture_killed_mid_run_resumes_bit_for_bit_and_reports_each_source(tmp_path: Path):
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    clean.mkdir(), killed.mkdir()
    args = [*ARGS, *_sources(clean)]
    _sources(killed)

    done = dew_train(*args, cwd=clean)
    assert done is not None and done.returncode == 0, done.stdout
    # SIGKILLed once a checkpoint is committed (None: killed, not ended), forked warm (dew_train)
    assert dew_train(*args, cwd=killed, kill_when=_checkpointed) is None
    first = steps_on_disk(killed / "ck" / "r")
    assert first and max(first) < STEPS, first
    again = dew_train(*args, cwd=killed)
    assert again is not None and again.returncode == 0, again.stdout
    assert f"resuming r from step {max(first)}" in again.stdout

    a, b = load_params(clean / "ck" / "r", STEPS), load_params(killed / "ck" / "r", STEPS)
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    whole, resumed = _journal(clean), _journal(killed)
    assert losses(resumed) == losses(whole) and sorted(losses(whole)) == list(range(1, STEPS + 1))

    # Each source's evaluation beside the mixture's, at every evaluation, in the journal.
    evals = [r for r in whole if r.get("event") == "eval"]
    assert [r["step"] for r in evals] == [12, 24]
    for record in evals:
        per_source = [record[f"eval/{s}/loss"] for s in SOURCES]
        assert all(np.isfinite(per_source)) and len(set(per_source)) == 3
        assert min(per_source) <= record["eval/loss"] <= max(per_source)  # the mean over all of them
        assert record["eval/wiki/perplexity"] == pytest.approx(np.exp(record["eval/wiki/loss"]))
    assert losses(resumed, "eval/books/loss") == losses(whole, "eval/books/loss")
