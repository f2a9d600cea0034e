"""The debug presets (conf/debug/) run as a user types them (``dew-train experiment=digits
debug=...``), on the tiny model of the trainer's tests: only sizes shrunk, the preset's own settings
untouched. Each is checked for what it promises: every cadence reached once, a loss that falls on
one repeated batch, a trace whose folder is printed, a non-finite step stopped by JAX's own check at
the operation that made it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dew.contract.journal import read_journal
from dew.data.overfit import OverfitBatches
from tests.conftest import REPO
from tests.training.conftest import TINY, dew_train, fast_env

PRESETS = {"fast", "overfit", "profile", "nans"}
SMALL = [o for o in TINY if not o.startswith("optim.schedule.")]
"""The trainer tests' tiny model and short samples; not their warmup: a debug preset unsets the schedule."""
SHRUNK = [o for o in SMALL if o.startswith(("model.config.", "trainer.batch_size=", "flow_matching.", "trainer.comp"))]
"""``SMALL``'s sizes only (the model, the batch, the sample grid; the suite's cache), for
``debug=fast``, whose samples at the end are one of its cadences: the experiment's depth-4,
width-128 model, its 128-image batches and full sample grid made the run 14.9 CPU-s in the suite
(2026-12-06), almost all of it compiling that model's programs and sampling it; shrunk, 16.4 ->
9.1-9.2 CPU-s on an empty compilation cache."""


def test_every_debug_preset_is_run_here():
    assert {p.stem for p in (REPO / "conf" / "debug").glob("*.yaml")} == PRESETS


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A working directory whose runs share one compilation cache."""
    return tmp_path_factory.mktemp("debug")


def env(work: Path) -> dict[str, str]:
    """The suite's environment, its compilation cache (``DEW_COMPILATION_CACHE``) included."""
    return fast_env()


def run_of(work: Path, preset: str) -> tuple[Path, list[dict]]:
    """The one run directory the preset made (named by its start time) and its journal."""
    [run] = list((work / "checkpoints").glob(f"debug-{preset}-*"))
    return run, read_journal(work / "tracking" / run.name / "journal.jsonl")


def events(journal: list[dict], kind: str) -> list[int]:
    return [r["step"] for r in journal if r.get("event") == kind]


@pytest.mark.slow
def test_debug_fast_as_documented_reaches_every_cadence_once(work):
    result = dew_train("experiment=digits", *SHRUNK, "debug=fast", cwd=work, env=env(work))
    assert result is not None and result.returncode == 0, result.stdout[-3000:]
    run, journal = run_of(work, "fast")
    assert (
        events(journal, "eval") == [2, 4] and events(journal, "checkpoint") == [2, 4] and events(journal, "end") == [4]
    )
    assert sorted(r["step"] for r in journal if "train/loss" in r) == [1, 2, 3, 4]  # the log at every step
    assert "resume check: step 2's checkpoint restores the run's" in result.stdout
    assert (run / "samples.png").is_file()
    record = json.loads((run / "run.json").read_text())
    # The preset's settings over the experiment's:
    assert record["optim"]["schedule"] is None and record["trainer"]["steps"] == 4
    # The experiment's settings that neither the preset nor the sizes above touch still hold.
    assert record["flow_matching"]["guidance_scale"] == 2.0 and record["model"]["config"]["patch_size"] == 2


@pytest.mark.slow
def test_debug_overfit_drives_the_loss_down_on_one_batch(work):
    result = dew_train(*SMALL, "debug=overfit", cwd=work, env=env(work))
    assert result is not None and result.returncode == 0, result.stdout[-3000:]
    _, journal = run_of(work, "overfit")
    loss = {r["step"]: r["train/loss"] for r in journal if "train/loss" in r}
    assert sorted(loss)[-1] == 200
    # Flow matching draws its times and noise afresh each step, so even a memorised batch keeps a
    # floor above zero (about 0.6 for this model): the loss must fall well towards it.
    first, last = loss[1], np.mean([loss[s] for s in sorted(loss)[-20:]])
    assert last < 0.55 * first, (first, last)


def test_overfit_batches_serves_the_first_batches_again_and_resumes_in_the_cycle():
    from dew.build import build_run
    from tests.training.conftest import compose

    _, _, dataset = build_run(compose("trainer.batch_size=8"))
    stream = OverfitBatches(dataset, 2).iterator()
    served = [stream.next()["label"] for _ in range(5)]
    fresh = dataset.iterator()
    first = [fresh.next()["label"], fresh.next()["label"]]
    assert all(np.array_equal(a, b) for a, b in zip(served, [*first, *first, first[0]]))
    assert not np.array_equal(first[0], first[1])
    again = OverfitBatches(dataset, 2).iterator()
    again.set_state(stream.get_state())
    assert np.array_equal(again.next()["label"], first[1])
    with pytest.raises(ValueError, match="not one of trainer.overfit_batches=3"):
        OverfitBatches(dataset, 3).iterator().set_state(stream.get_state())


@pytest.mark.slow
def test_debug_profile_prints_where_the_trace_is(work):
    result = dew_train(*SMALL, "debug=profile", cwd=work, env=env(work))
    assert result is not None and result.returncode == 0, result.stdout[-3000:]
    [line] = [line for line in result.stdout.splitlines() if "profile of steps 4-6 written to" in line]
    trace = Path(line.rsplit(" written to ", 1)[1])
    assert trace.parent == work / "profiles" / "plugins" / "profile" and list(trace.glob("*.xplane.pb"))


@pytest.mark.slow
def test_debug_nans_stops_at_the_operation_jax_finds(work):
    # As typed: a rate that blows the weights up on its first full step (the warmup's first has rate
    # 0). Step 3's forward pass overflows; JAX's check sees the infinity in the step's output, runs
    # the step again op by op and raises at the operation that made it: the square of flow
    # matching's error (with jax_debug_nans alone it would name reduce_sum, in the backward pass, where
    # the NaN that follows appears). dew stops there, one line naming the step, before its own check
    # (metrics one step late) would at step 4.
    args = [*TINY, "debug=nans", "optim.learning_rate=1e30", "trainer.steps=20"]
    result = dew_train(*args, cwd=work, env=env(work), poll=0.05)  # not polled every 2 ms: 0.16 s of CPU
    assert result is not None and result.returncode == 5, result.stdout[-3000:]
    assert "Invalid nan value encountered in the output of a jax.jit function" in result.stdout  # JAX's re-run
    [error] = [line for line in result.stdout.splitlines() if line.startswith("dew-train: error:")]
    assert error == (
        "dew-train: error: jax_debug_nans: step 3 made a non-finite value; re-run op by op: invalid value (inf) "
        "encountered in square; the run stops. The last good checkpoint, left intact: none was saved"
    )
    _, journal = run_of(work, "nans")
    [stop] = [r for r in journal if r.get("event") == "stop"]
    assert (stop["reason"], stop["step"], stop["message"]) == ("nonfinite", 2, error.removeprefix("dew-train: error: "))
    assert sorted(r["step"] for r in journal if "train/loss" in r) == [1, 2]  # step 2's, flushed before the stop
