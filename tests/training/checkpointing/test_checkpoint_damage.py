"""A damaged latest checkpoint: resume and dew-sample name the step and what is wrong, fall back to the
newest intact step, and keep the damaged one (moved aside, never deleted); the resumed run ends with
the parameters of the run trained without a stop (a resume is bit for bit), and saves the damaged
step's number again."""

from __future__ import annotations

import glob
import json
import os
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.training.conftest import journal, load_params, losses, train_tiny

pytestmark = pytest.mark.slow

ARGS = ["trainer.steps=4", "trainer.checkpoint_every=2", "trainer.eval_every=null", "trainer.keep=2"]


def _copy(src: Path, dst: Path) -> None:
    """A copy of a trained tmp tree (run and journal) that resumes where it lies (run.json records the
    absolute checkpoint_dir, which must match)."""
    shutil.copytree(src, dst)
    record = dst / "ck" / "run" / "run.json"
    values = json.loads(record.read_text())
    values["trainer"]["checkpoint_dir"] = str(dst / "ck")
    record.write_text(json.dumps(values, indent=2) + "\n")


def _delete_arrays(step: Path) -> None:
    for f in glob.glob(f"{step}/state/**/d/*", recursive=True):
        os.remove(f)


def _delete_manifest(step: Path) -> None:
    for f in glob.glob(f"{step}/state/**/manifest.ocdbt", recursive=True):
        os.remove(f)


def _truncate(step: Path) -> None:
    # To an eighth: dew-sample reads only the parameters or their EMA (a quarter of the bytes, with
    # the two optimizer moments), and a file cut in half could leave that quarter whole, as it did
    # in about one run of four.
    for f in glob.glob(f"{step}/state/ocdbt.process_0/d/*"):
        with open(f, "r+b") as fh:
            fh.truncate(os.path.getsize(f) // 8)


def _flip_byte(step: Path) -> None:
    # The database's root node: orbax checks it (a checksum) and reports DATA_LOSS. (A flip inside an
    # array's data bytes goes unnoticed by orbax: see dew/training/checkpointing/checkpoints.py.)
    (f,) = glob.glob(f"{step}/state/d/*")
    data = bytearray(Path(f).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(f).write_bytes(bytes(data))


def _delete_record(step: Path) -> None:
    os.remove(step / "meta" / "metadata")


DAMAGES = {
    "arrays deleted": _delete_arrays,
    "manifest deleted": _delete_manifest,
    "file truncated": _truncate,
    "byte flipped": _flip_byte,
    "meta/metadata deleted": _delete_record,
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A finished 4-step run (checkpoints 2 and 4) and its final state: the fallback's reference. A
    run resumed from its intact step 2 ends on these parameters and losses bit for bit (what the
    resume tests check: tests/training/test_preemption.py, test_trainer_resume.py), so the second
    run this fixture trained, resumed from a copy without step 4, only repeated them (~2 CPU-s)."""
    tmp = tmp_path_factory.mktemp("damage")
    base, _, _ = train_tiny(tmp / "base", *ARGS)
    return tmp, base


@pytest.mark.parametrize("damage", DAMAGES)
def test_each_damage_is_named_and_passed_over(runs, tmp_path, damage):
    from etils import epath

    from dew.inference.restore import restore
    from dew.training.checkpointing.checkpoints import Checkpoints

    tmp, _ = runs
    work = tmp_path / "damaged"
    _copy(tmp / "base", work)
    run = work / "ck" / "run"
    DAMAGES[damage](run / "4")

    # dew-sample (a reader: it moves nothing) samples from step 2 and says why.
    sampled = restore(str(run), latest=True)
    assert sampled.step == 2 and [s for s, _ in sampled.damaged] == [4] and sampled.damaged[0][1]
    assert (run / "4").is_dir()

    # Resume's restore: step 2, exactly as saved; step 4 moved aside, and orbax no longer lists it.
    checkpoints = Checkpoints(epath.Path(run), keep=2)
    try:
        step, state, meta, fallbacks = checkpoints.restore_intact(None, move_damaged=True)
        intact, intact_meta = checkpoints.restore(2, None)
        assert checkpoints.all_steps() == [2] and checkpoints.latest_step() == 2
    finally:
        checkpoints.close()
    assert step == 2 and meta == intact_meta and meta["step"] == 2
    for a, b in zip(jax.tree.leaves(intact), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [f.damaged_step for f in fallbacks] == [4] and fallbacks[0].problem
    assert not (run / "4").exists() and Path(fallbacks[0].moved_to).parent == run
    assert Path(fallbacks[0].moved_to).name.startswith("4.damaged-")


def test_resumed_run_after_fallback_equals_one_resumed_from_the_intact_step(runs, tmp_path):
    tmp, reference = runs  # the run without a stop: one resumed from an intact step 2 ends on it
    work = tmp_path / "damaged"
    _copy(tmp / "base", work)
    run = work / "ck" / "run"
    _truncate(run / "4")

    state, _, records = train_tiny(work, *ARGS)

    # The damaged step is kept beside the others under a clear name; the run saved step 4 again.
    moved = [p.name for p in run.iterdir() if p.name.startswith("4.damaged-")]
    assert len(moved) == 1, sorted(p.name for p in run.iterdir())
    fallback = [r for r in records if r.get("event") == "checkpoint_fallback"]
    assert len(fallback) == 1 and fallback[0]["step"] == 2 and fallback[0]["damaged_step"] == 4
    assert fallback[0]["problem"] and fallback[0]["moved_to"].endswith(moved[0])
    log = (run / "train.log").read_text()
    assert "checkpoint step 4" in log and "is damaged" in log and "falling back from damaged step 4 to step 2" in log

    # The same parameters as a run resumed from an intact step 2 (the run without a stop), in memory
    # and as saved.
    for a, b in zip(jax.tree.leaves(reference.params), jax.tree.leaves(state.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    saved, expected = load_params(run, 4), load_params(tmp / "base" / "ck" / "run", 4)
    assert saved.keys() == expected.keys()
    for path in saved:
        np.testing.assert_array_equal(saved[path], expected[path], err_msg=path)
    # The journal reads as the resumed run's: steps 3 and 4 once each, from the new segment.
    assert losses(records) == losses(journal(tmp / "base")) and sorted(losses(records)) == [1, 2, 3, 4]
    assert [r["event"] for r in records if "event" in r].count("end") == 1


def test_no_intact_step_moves_nothing_and_says_so(runs, tmp_path):
    from dew.training.checkpointing.checkpoints import CheckpointDamagedError

    tmp, _ = runs
    work = tmp_path / "all-damaged"
    _copy(tmp / "base", work)
    run = work / "ck" / "run"
    for step in ("2", "4"):
        _delete_record(run / step)
    with pytest.raises(CheckpointDamagedError, match="no checkpoint in .* restores; nothing was moved or deleted"):
        train_tiny(work, *ARGS)
    assert sorted(p.name for p in run.iterdir() if p.name[0].isdigit()) == ["2", "4"]


def test_dew_sample_passes_over_a_cut_short_latest_step_without_a_traceback(runs, tmp_path):
    """A step whose array files were cut short (a node that died mid-write) fails part-way through
    orbax's reads: the reads still in flight must finish before orbax's event loop closes, or each
    prints 'RuntimeError: Event loop is closed' (dew.compat.orbax_reads_settle)."""
    from tests.conftest import cli_env, dew

    tmp, _ = runs
    work = tmp_path / "damaged"
    _copy(tmp / "base", work)
    _truncate(work / "ck" / "run" / "4")
    result = dew(
        str(work / "ck" / "run"),
        "--latest",
        "--count=1",
        cwd=tmp_path,
        script="dew.cli.sample",
        env=cli_env(),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "dew-sample: checkpoint step 4 is damaged (ValueError: OUT_OF_RANGE" in result.stderr
    assert "step 2" in result.stdout + result.stderr and "damaged step 4 passed over" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "Event loop is closed" not in result.stderr, result.stderr


def test_the_walk_reads_steps_in_turn_and_names_each_damaged_one(tmp_path):
    """``Checkpoints.first_intact`` is the one walk back over damaged steps (a resume's and
    dew-sample's): the first step that reads, each one passed over reported as it is, and every
    step's problem when none reads."""
    from etils import epath

    from dew.training.checkpointing.checkpoints import CheckpointDamagedError, Checkpoints

    def read(step: int) -> str:
        if step > 2:
            raise FileNotFoundError(f"step {step}: gone")
        return f"values of {step}"

    checkpoints = Checkpoints(epath.Path(tmp_path), keep=1)
    heard: list[tuple[int, str]] = []
    try:
        step, value, damaged = checkpoints.first_intact([5, 3, 2, 1], read, on_damaged=lambda *d: heard.append(d))
        assert (step, value) == (2, "values of 2")
        assert damaged == heard == [(5, "FileNotFoundError: step 5: gone"), (3, "FileNotFoundError: step 3: gone")]
        with pytest.raises(CheckpointDamagedError, match="step 5: FileNotFoundError: step 5: gone; step 4: ") as none:
            checkpoints.first_intact([5, 4], read)
        assert [s for s, _ in none.value.damaged] == [5, 4]
    finally:
        checkpoints.close()
