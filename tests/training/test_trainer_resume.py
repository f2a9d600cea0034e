"""Exact resume: a dew-train run SIGKILLed mid-save and again between checkpoints, then started again
with the same command, ends with the same parameters, bit for bit, and the same journal of losses as
a run that was never interrupted."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from dew.contract.journal import read_journal
from tests.conftest import SUITE_CACHE
from tests.training.conftest import TINY, dew_train, load_params, losses, steps_on_disk

pytestmark = pytest.mark.slow

STEPS = 24
ARGS = [
    *TINY,
    "trainer.name=r",
    f"trainer.steps={STEPS}",
    "trainer.checkpoint_every=2",
    "trainer.eval_every=4",
    "trainer.keep=2",
    "trainer.checkpoint_dir=ck",
]


def _journal(work: Path) -> list[dict]:
    return read_journal(work / "tracking" / "r" / "journal.jsonl")


def _curves(journal: list[dict]) -> dict[str, dict[int, float]]:
    return {k: losses(journal, k) for k in ("train/loss", "train/grad_norm", "train/lr", "eval/loss")}


def _mid_save(work: Path) -> bool:
    """A checkpoint is committed and a later one is being written right now."""
    run = work / "ck" / "r"
    if not run.is_dir():
        return False
    names = [p.name for p in run.iterdir()]
    return any(n.isdigit() for n in names) and any("orbax-checkpoint-tmp" in n for n in names)


def _logged_past(step: int):
    def past(work: Path) -> bool:
        path = work / "tracking" / "r" / "journal.jsonl"
        if not path.exists():
            return False
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]
        return any(r.get("event") == "resume" for r in lines) and any(
            r.get("step", 0) >= step and "train/loss" in r for r in lines
        )

    return past


def test_sigkill_anywhere_then_rerun_is_bit_identical(tmp_path: Path):
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    clean.mkdir(), killed.mkdir()
    cache = f"trainer.compilation_cache_dir={SUITE_CACHE}"

    # The uninterrupted reference saves its last step only (what is compared; a save leaves the state
    # as it is): every 2 steps it wrote 12 orbax checkpoints, 11 never read.
    done = dew_train(*ARGS, cache, "trainer.checkpoint_every=null", cwd=clean)
    assert done is not None and done.returncode == 0, done.stdout

    # 1. SIGKILL while orbax writes a checkpoint (its tmp directory exists), after one is committed.
    assert dew_train(*ARGS, cache, cwd=killed, kill_when=_mid_save) is None
    run = killed / "ck" / "r"
    first = steps_on_disk(run)
    assert first and max(first) < STEPS, first
    leftovers = [p.name for p in run.iterdir() if "orbax-checkpoint-tmp" in p.name]
    raw = killed / "tracking" / "r" / "journal.jsonl"
    written = [raw.read_text()]
    # 2. Start it again and SIGKILL it between checkpoints, well after it resumed.
    assert dew_train(*ARGS, cache, cwd=killed, kill_when=_logged_past(max(first) + 5)) is None
    second = steps_on_disk(run)
    assert max(second) > max(first), (first, second)
    written.append(raw.read_text())
    # 3. Start it again: it finishes.
    done = dew_train(*ARGS, cache, cwd=killed)
    assert done is not None and done.returncode == 0, done.stdout
    written.append(raw.read_text())
    # The journal file is only ever appended to: each start kept every line the one before wrote.
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(written)), written
    log = (run / "train.log").read_text()
    assert f"resuming r from step {max(second)}" in log
    # The compilation cache: a second start loads the step instead of compiling it.
    hits = [int(m.group(1)) for m in re.finditer(r"compilation cache \S+: (\d+) hits", log)]
    assert len(hits) == 1 and hits[0] >= 2, log  # the step and the evaluation, at least

    # The same parameters, bit for bit, read back from both runs' last checkpoints with orbax.
    a, b = load_params(clean / "ck" / "r", STEPS), load_params(run, STEPS)
    assert a.keys() == b.keys() and len(a) > 5
    for path in a:
        np.testing.assert_array_equal(a[path], b[path], err_msg=path)
    # The same journal of losses, each step logged exactly once.
    clean_journal, killed_journal = _journal(clean), _journal(killed)
    assert _curves(killed_journal) == _curves(clean_journal)
    logged = [r["step"] for r in killed_journal if "train/loss" in r]
    assert logged == list(range(1, STEPS + 1))
    events = [r["event"] for r in killed_journal if "event" in r]
    assert events.count("resume") == 2 and events.count("end") == 1
    # Retention: the 2 latest plus the best, and a killed save's tmp directory never taken for a step.
    assert steps_on_disk(run)[-2:] == [STEPS - 2, STEPS]
    assert not [p for p in run.iterdir() if "orbax-checkpoint-tmp" in p.name and p.name.split(".")[0] == str(STEPS)]
    print(f"killed mid-save with {leftovers} on disk; resumed from {max(first)} and {max(second)}")
    check_the_goodput_ledgers(clean, killed)


def check_the_goodput_ledgers(clean: Path, killed: Path) -> None:
    """``dew-runs goodput``'s ledgers of both runs (dew.runs.goodput): every bucket adds up to the
    wall time, the clean run lost nothing, and each killed start lost the steps it trained past the
    checkpoint the next start resumed from, at its median step time (from its own training records,
    read here independently)."""
    from dew.runs.goodput import BUCKETS, ledger, starts_of

    for work, starts in ((clean, 1), (killed, 3)):
        written = read_journal(work / "tracking" / "r" / "journal.jsonl", raw=True)
        led = ledger("r", written)
        assert led.starts == starts and led.final_step == STEPS
        assert sum(led.seconds.values()) == pytest.approx(led.wall, rel=0.01)
        assert led.wall == pytest.approx(written[-1]["time"] - written[0]["began"], rel=1e-6)
        assert all(led.seconds[b] > 0 for b in ("startup", "compile", "train", "eval", "checkpoint")), led.seconds
    clean_led = ledger("r", read_journal(clean / "tracking" / "r" / "journal.jsonl", raw=True))
    assert clean_led.seconds["lost"] == 0 and clean_led.seconds["unrecorded"] == 0 and clean_led.lost_steps == 0
    written = read_journal(killed / "tracking" / "r" / "journal.jsonl", raw=True)
    segments = starts_of(written)
    expected_steps, expected_s = 0, 0.0
    for this, after in itertools.pairwise(segments):
        trained = [(r["step"], r["time"]) for r in this.records if "train/loss" in r]
        redone = max(s for s, _ in trained) - after.first_step  # past the checkpoint the next start resumed from
        times = sorted((t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in itertools.pairwise(trained))
        median = times[len(times) // 2] if len(times) % 2 else (times[len(times) // 2 - 1] + times[len(times) // 2]) / 2
        expected_steps, expected_s = expected_steps + redone, expected_s + redone * median
    led = ledger("r", written)
    assert led.lost_steps == expected_steps > 0
    assert led.seconds["lost"] == pytest.approx(expected_s, rel=0.1)
    assert set(led.seconds) == set(BUCKETS) and led.seconds["unrecorded"] > 0  # the killed starts wrote no split
