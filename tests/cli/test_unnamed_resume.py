"""Ctrl-C on a run without ``trainer.name``: its last line gives the command that resumes it (the
same command would start a run named after another moment), and that command, run as printed,
resumes it to the parameters and losses of a run never interrupted, bit for bit."""

from __future__ import annotations

import os
import shlex
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dew.contract.lock import holder
from tests.conftest import dew
from tests.training.conftest import TINY, dew_train, fast_env, journal, load_params, losses

pytestmark = pytest.mark.slow

STEPS = 300
RUN = [
    *TINY,
    f"trainer.steps={STEPS}",
    "trainer.eval_every=null",
    "trainer.checkpoint_every=null",
    "trainer.checkpoint_dir=ck",
]


def interrupt_when_logged(workdir: Path, step: int) -> None:
    """SIGINT the process that holds the run directory (``run-*``) once its journal has ``step``."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        journals = list((workdir / "tracking").glob("run-*/journal.jsonl"))
        if journals and f'"step": {step},' in journals[0].read_text():
            who = holder(workdir / "ck" / journals[0].parent.name)
            if who is not None:
                os.kill(int(who["pid"]), signal.SIGINT)
                return
        time.sleep(0.005)
    raise TimeoutError("the run never logged its step")


def test_ctrl_c_on_an_unnamed_run_names_the_command_that_resumes_it(workdir: Path):
    whole = dew_train(*RUN, "trainer.name=whole", cwd=workdir)
    assert whole is not None and whole.returncode == 0, whole.stdout[-3000:]

    box: dict = {}

    def unnamed() -> None:
        box["cut"] = dew(*RUN, "trainer.name=null", cwd=workdir, env=fast_env())

    command = threading.Thread(target=unnamed)
    command.start()
    interrupt_when_logged(workdir, 3)
    command.join()
    cut = box["cut"]
    assert cut.returncode == 128 + signal.SIGINT, cut.stderr[-3000:]
    [name] = [p.name for p in (workdir / "ck").iterdir() if p.name.startswith("run-")]
    last = cut.stderr.strip().splitlines()[-1]
    head, _, resume = last.partition("; resume it with: ")
    assert head.startswith(f"dew-train: run {name!r}: SIGINT: stopped at step "), last
    assert resume == shlex.join(["dew-train", *RUN, "trainer.name=null"]) + f" trainer.name={name}", last
    stopped_at = int(head.split("stopped at step ")[1].split()[0])
    assert 3 <= stopped_at < STEPS
    # the trainer's own record of the stop (the journal's event, the console's warning) is true too:
    # the same command alone would start another run
    [stop] = [r for r in journal(workdir, name) if r.get("event") == "stop"]
    assert stop["message"].endswith(f"; the same command with trainer.name set to {name!r} resumes the run"), stop
    assert stop["message"] in cut.stderr
    assert "; the same command resumes the run" not in cut.stderr

    prog, *args = shlex.split(resume)
    assert prog == "dew-train"
    resumed = dew_train(*args, cwd=workdir)
    assert resumed is not None and resumed.returncode == 0, resumed.stdout[-3000:]
    assert [p.name for p in (workdir / "ck").iterdir() if p.name.startswith("run-")] == [name]  # no new run
    records = journal(workdir, name)
    assert [r["event"] for r in records if r.get("event") in ("start", "stop", "resume", "end")] == [
        "start",
        "stop",
        "resume",
        "end",
    ]
    assert losses(records) == losses(journal(workdir, "whole"))
    a, b = load_params(workdir / "ck" / "whole", STEPS), load_params(workdir / "ck" / name, STEPS)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
