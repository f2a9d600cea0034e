"""``dew-eval RUN --follow``: a follower started before the run scores each checkpoint once as it
appears, through a run SIGKILLed and resumed and a follower SIGKILLed and started again, and ends
when the run's journal ends; its record notes each step once, with the values the run's own
evaluation recorded at that step."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from dew.contract.rundir import STEP_FINISHED
from tests import warm
from tests.cli.test_eval import started
from tests.conftest import SUITE_CACHE
from tests.training.conftest import dew_train, fast_env, journal, steps_on_disk
from tests.training.test_task_evals import task_data

pytestmark = pytest.mark.slow


def _follower(run: Path, log: Path) -> subprocess.Popen | warm.Started:
    """``dew-eval RUN --follow``, its output in ``log``: forked from the suite's warm interpreter."""
    return started([str(run), "--follow", "--tasks-only", "--poll", "0.2"], run.parent.parent, fast_env(), log)


def _wait(what, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_each_checkpoint_is_scored_once_through_kills_and_resumes(tmp_path):
    root = tmp_path
    tasks = task_data(root)
    run = root / "ck" / "lm"
    args = [
        "data=token_windows",
        f"data.path={root / 'bytes' / 'train.bin'}",
        f"data.val_path={root / 'bytes' / 'val.bin'}",
        "data.seq_len=16",
        "model.config={hidden_size: 32, depth: 1, num_heads: 4}",
        "model.dtype=float32",
        "trainer.batch_size=8",
        "trainer.steps=6",
        "trainer.eval_every=100",
        "trainer.checkpoint_every=2",
        "trainer.keep=10",
        "trainer.name=lm",
        f"trainer.checkpoint_dir={root / 'ck'}",
        f"trainer.compilation_cache_dir={SUITE_CACHE}",
        f"trainer.evals={{tasks: [{tasks}], every: 2, batch_size: 4}}",
    ]
    record = run / "eval"
    first = _follower(run, root / "follow-1.out")  # before the run: it waits for run.json
    try:
        assert dew_train(*args, cwd=root, kill_when=lambda _: (run / "2" / STEP_FINISHED).exists()) is None
        _wait(lambda: any(json.loads(p.read_text())["steps"] for p in record.glob("follow-*.json")))
        first.kill()  # SIGKILL, with the run dead too
        first.wait()
        second = _follower(run, root / "follow-2.out")
        done = dew_train(*args, cwd=root)  # the run resumed from its last checkpoint, to its end
        assert done is not None and done.returncode == 0, done.stdout[-2000:]
        assert second.wait(timeout=240) == 0
    finally:
        for p in (first, locals().get("second")):
            if p is not None and p.poll() is None:
                p.kill()
    (path,) = record.glob("follow-*.json")
    noted = json.loads(path.read_text())
    assert sorted(map(int, noted["steps"])) == steps_on_disk(run) == [2, 4, 6]
    logs = (root / "follow-1.out").read_text() + (root / "follow-2.out").read_text()
    evaluated = [int(s) for s in re.findall(r"dew-eval: step (\d+) evaluated", logs)]
    assert sorted(evaluated) == [2, 4, 6]  # once each, over both followers
    assert "ended; 3 steps evaluated" in (root / "follow-2.out").read_text()
    # The run's own evaluation scored the tasks at the same steps: the follower's values are those.
    recorded = {r["step"]: r for r in journal(root, "lm") if "eval/mc/acc" in r and "event" not in r}
    for step, note in noted["steps"].items():
        assert Path(note["results"]).name == f"step{step}-tasks.json"
        for key, value in note["metrics"].items():
            assert value == pytest.approx(recorded[int(step)][key], rel=1e-5, abs=1e-6), (step, key)
